package router

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// clockWatch is a node's view of its clock against the others'
// (DESIGN.md "Time"): lease safety rests on the pairwise offset staying
// under max_clock_skew, so each node measures it.
type clockWatch struct {
	mu      sync.Mutex
	offsets map[uint64]time.Duration // peer node id → its clock minus ours
	down    map[uint64]bool          // peers whose last reading failed
	// versions holds the shard command version each peer's binary
	// applies, from its last clock reading.
	versions map[uint64]uint32
	// unsafe is set while this node's clock is more than MaxClockSkew/2
	// from the majority's.
	unsafe atomic.Bool
}

// now is this node's wall clock, as the leader clock and Clock see it.
func (r *Router) now() time.Time { return time.Now().Add(r.cfg.ClockOffset) }

// watchClock measures the offsets every ClockInterval until Stop.
func (r *Router) watchClock() {
	tick := time.NewTicker(r.cfg.ClockInterval)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		r.measureClocks()
	}
}

// measureClocks asks every other node for its clock, as NTP does: the
// offset is the peer's reading minus the midpoint of our send and receive
// times, good to half the round trip.
func (r *Router) measureClocks() {
	var peers []*placementv1.Node
	for _, n := range r.Map().State().GetNodes() {
		if !r.isLocal(n.GetId()) {
			peers = append(peers, n)
		}
	}
	if len(peers) == 0 {
		return // every node runs in this process, on one clock
	}
	offsets := []time.Duration{0} // ours
	for _, n := range peers {
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ClockInterval)
		sent := r.now()
		resp, err := r.peers.get(n.GetListenAddr()).node.Clock(ctx, connect.NewRequest(&placementv1.ClockRequest{}))
		cancel()
		r.clock.mu.Lock()
		if r.clock.down == nil {
			r.clock.down = map[uint64]bool{}
		}
		r.clock.down[n.GetId()] = err != nil
		r.clock.mu.Unlock()
		if err != nil {
			continue
		}
		got := r.now()
		mid := sent.Add(got.Sub(sent) / 2)
		off := time.Unix(0, resp.Msg.GetUnixNano()).Sub(mid)
		metrics.clockOffset.WithLabelValues(strconv.FormatUint(n.GetId(), 10)).Set(off.Seconds())
		r.clock.mu.Lock()
		if r.clock.offsets == nil {
			r.clock.offsets = map[uint64]time.Duration{}
		}
		r.clock.offsets[n.GetId()] = off
		if r.clock.versions == nil {
			r.clock.versions = map[uint64]uint32{}
		}
		r.clock.versions[n.GetId()] = max(resp.Msg.GetCommandVersion(), 1)
		r.clock.mu.Unlock()
		offsets = append(offsets, off)
	}
	// Our distance from the majority: the median of every clock's offset
	// from ours (ours included) is the majority's time.
	slices.Sort(offsets)
	fromMajority := offsets[len(offsets)/2]
	unsafe := fromMajority.Abs() > r.cfg.MaxClockSkew/2
	if unsafe != r.clock.unsafe.Swap(unsafe) {
		if unsafe {
			r.cfg.Logger.Error("this node's clock is too far from the others'; it stops proposing time-driven commands and hands its leaderships away",
				"offset_from_majority", -fromMajority, "bound", r.cfg.MaxClockSkew/2)
		} else {
			r.cfg.Logger.Info("this node's clock is back within bounds", "offset_from_majority", -fromMajority)
		}
	}
	if unsafe {
		r.handLeadershipAway()
	}
}

// applies reports whether every replica of shardID is on a node whose
// binary applies command envelope version v: this node's, or a peer
// whose last clock reading said so. A command of a newer version than
// some replica applies would stop that replica's whole process, and go on
// stopping it while it replays its log, so the router proposes one only
// once every replica's node has been upgraded (a rolling upgrade keeps
// using the older commands until then).
func (r *Router) applies(shardID uint64, v uint32) bool {
	if v <= 1 {
		return true
	}
	s := r.Map().Shard(shardID)
	if s == nil {
		return false
	}
	r.clock.mu.Lock()
	defer r.clock.mu.Unlock()
	for _, rep := range s.GetReplicas() {
		if !r.isLocal(rep.GetNodeId()) && r.clock.versions[rep.GetNodeId()] < v {
			return false
		}
	}
	return true
}

// live reports whether node id answered its last clock reading (a node
// not read yet counts as live; local nodes always do).
func (r *Router) live(id uint64) bool {
	r.clock.mu.Lock()
	defer r.clock.mu.Unlock()
	return !r.clock.down[id]
}

// handLeadershipAway asks every data shard this node leads to elect
// another replica.
func (r *Router) handLeadershipAway() {
	m := r.Map()
	for i := range r.nodes {
		n := &r.nodes[i]
		for _, t := range n.Leadership.led() {
			if t.shardID == placement.MetaShardID {
				continue
			}
			for _, rep := range m.Shard(t.shardID).GetReplicas() {
				if rep.GetNodeId() != n.Node.ID() {
					_ = n.Node.NH.RequestLeaderTransfer(t.shardID, rep.GetReplicaId())
					break
				}
			}
		}
	}
}
