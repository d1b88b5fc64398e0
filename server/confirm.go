package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/router"
)

// probeTimeout bounds one round of identity probes (every peer asked at
// once); confirmRetry is the pause between rounds.
const (
	probeTimeout = 3 * time.Second
	confirmRetry = time.Second
)

// startStatus is what a node starting in mode tells the other starting
// nodes (router.StartingHeader): the mode's name, and for a restore its
// restore id, so that only nodes restored from the same backup confirm
// each other.
func startStatus(mode StartMode, restoreID string) string {
	if mode == ModeRestore {
		return mode.String() + " " + restoreID
	}
	return mode.String()
}

// nodeStatus is startStatus for node spec of cfg, from its data
// directory ("" when its mode cannot be decided: the start fails then).
func nodeStatus(spec NodeSpec, cfg ClusterConfig) string {
	mode, err := startMode(spec, cfg)
	if err != nil {
		return ""
	}
	pending, err := placement.PendingRestore(spec.DataDir)
	if err != nil {
		return ""
	}
	return startStatus(mode, pending.GetRestoreId())
}

// StatusRunning is the router.StartingHeader of a process that has
// started Raft on a node but does not serve yet (placement.Bootstrap may
// wait for a quorum for up to BootstrapTimeout): that node may have
// acknowledged, even committed, entries, so another node's identity
// check never counts it as new in this start (decideStart).
const StatusRunning = "running"

// Status is the router.StartingHeader a process answers while its
// cluster starts, before its router serves. Safe for concurrent use.
type Status struct{ v atomic.Pointer[string] }

// NewStatus is the status of a process running cfg: its (first) node's
// nodeStatus until StartCluster(cfg) starts Raft, StatusRunning from
// then on (ClusterConfig.Status).
func NewStatus(cfg ClusterConfig) *Status {
	s := new(Status)
	if len(cfg.Nodes) > 0 {
		s.set(nodeStatus(cfg.Nodes[0], cfg))
	}
	return s
}

// String is the status to answer now ("" before any is set).
func (s *Status) String() string {
	if v := s.v.Load(); v != nil {
		return *v
	}
	return ""
}

func (s *Status) set(v string) { s.v.Store(&v) }

// peerAnswer is what one initial member answered an identity probe.
type peerAnswer struct {
	addr string
	// state is the placement state of a member that serves; status the
	// router.StartingHeader of one still starting; err why neither came.
	state  *placementv1.State
	status string
	err    error
}

// confirmIdentity makes node spec, starting in mode ModeNewCluster or
// ModeRestore (state the cluster has not seen: a directory initialised
// or restored in this start), wait until the cluster confirms it before
// it starts Raft (decideStart says when), asking the other initial
// members every confirmRetry and logging why it waits. It fails with
// the cluster's refusal, or when BootstrapTimeout passes unconfirmed: a
// node never starts Raft on a timeout, since a directory that forgot
// what it acknowledged would count toward every quorum as a voter.
func (c *Cluster) confirmIdentity(p *router.Peers, spec NodeSpec, id placement.Identity, status string) error {
	var seeds []string
	confirmed := 1 // itself
	for _, m := range c.cfg.Members {
		switch {
		case m.ID == spec.ID:
		case m.ListenAddr == c.cfg.ListenAddr:
			// Another node of this process (a dev cluster), whose mode
			// was decided with this one's.
			if i := c.nodeIndex(m.ID); i >= 0 && c.statuses[i] == status {
				confirmed++
			}
		default:
			seeds = append(seeds, m.ListenAddr)
		}
	}
	restoreID, _ := strings.CutPrefix(status, ModeRestore.String()+" ")
	if restoreID == status {
		restoreID = ""
	}
	quorum := len(c.cfg.Members)/2 + 1
	deadline := time.Now().Add(c.cfg.BootstrapTimeout)
	for {
		ok, why, err := decideStart(probePeers(p, seeds), id, status, restoreID, confirmed, quorum)
		if ok || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("server: node %d (starting as %s) could not confirm its identity with the cluster within %s, and did not start Raft: %s. "+
				"Start the other initial members, or if this node was a member and lost its data, do not start it under node id %d",
				spec.ID, status, c.cfg.BootstrapTimeout, why, spec.ID)
		}
		slog.Warn("waiting for the cluster to confirm this node's identity before starting Raft", "node", spec.ID, "start", status, "why", why)
		time.Sleep(confirmRetry)
	}
}

// nodeIndex is the index in cfg.Nodes of node id, or -1.
func (c *Cluster) nodeIndex(id uint64) int {
	for i, n := range c.cfg.Nodes {
		if n.ID == id {
			return i
		}
	}
	return -1
}

// probePeers asks every address in seeds at once (router.ProbeStart),
// each bounded by probeTimeout.
func probePeers(p *router.Peers, seeds []string) []peerAnswer {
	out := make([]peerAnswer, len(seeds))
	var wg sync.WaitGroup
	for i, a := range seeds {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
			defer cancel()
			st, status, err := p.ProbeStart(ctx, a)
			out[i] = peerAnswer{addr: a, state: st, status: status, err: err}
		})
	}
	wg.Wait()
	return out
}

// decideStart is the rule by which a node with state the cluster has not
// seen (status: a new cluster's member, or a restore's) may start Raft.
// The placement state of any member that serves decides: for a restore,
// it must be the state this restore (restoreID) created, and it must know
// the node by this incarnation or none (placement.CheckIncarnation);
// otherwise err says why the node must not start. Without a state, the
// node starts once a quorum of the initial members, itself and those of
// confirmed included, are starting with the same status: every entry a
// cluster ever committed was acknowledged by a quorum, so while at most
// one directory is lost, a quorum of directories new in this start means
// nothing was committed yet (a restore: by the restored cluster). A
// member that answers StatusRunning has started Raft, so it is not new
// whatever mode it started in. Else (members unreachable, restarting
// from their data, running Raft without serving, or starting otherwise)
// it waits, and why says for whom.
func decideStart(answers []peerAnswer, id placement.Identity, status, restoreID string, confirmed, quorum int) (ok bool, why string, err error) {
	var waiting []string
	for _, a := range answers {
		switch {
		case a.state.GetGeneration() != 0:
			if restoreID != "" && a.state.GetRestoreId() != restoreID {
				return false, "", fmt.Errorf("server: %w (the cluster at %s has restore id %q, this directory's restore %q): "+
					"a node is restored only with all the others, from the same backup, into a stopped cluster; "+
					"this node did not start Raft, and its old data directory may be put back", placement.ErrRestored, a.addr, a.state.GetRestoreId(), restoreID)
			}
			if err := placement.CheckIncarnation(a.state, id); err != nil {
				return false, "", err
			}
			return true, "", nil
		case a.status == StatusRunning:
			// It started Raft and may hold committed entries: it
			// confirms nothing until it serves its placement state.
			waiting = append(waiting, a.addr+" has started Raft and does not serve yet")
		case a.status == status:
			confirmed++
		case a.status != "":
			waiting = append(waiting, fmt.Sprintf("%s is starting as %s", a.addr, a.status))
		case a.err != nil:
			waiting = append(waiting, fmt.Sprintf("%s: %v", a.addr, a.err))
		default:
			waiting = append(waiting, a.addr+" has no placement state yet")
		}
	}
	if confirmed >= quorum {
		return true, "", nil
	}
	return false, fmt.Sprintf("%d initial member(s) starting as %s, %d needed (%s)", confirmed, status, quorum, strings.Join(waiting, "; ")), nil
}
