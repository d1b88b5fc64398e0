package placement

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/config"
	"github.com/lni/dragonboat/v4/raftio"
	sm "github.com/lni/dragonboat/v4/statemachine"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/shard"
)

// deploymentID keeps Warden's Raft traffic from mixing with any other
// Dragonboat deployment that shares an address by mistake.
const deploymentID = 0x77617264656e // "warden"

// NodeConfig describes one node: a Dragonboat NodeHost in one zone.
type NodeConfig struct {
	// ID is the node's id, also its replica id in every shard it hosts.
	ID uint64
	// Zone is the availability zone; a shard's replicas go to distinct zones.
	Zone string
	// RaftAddr is the host:port of the NodeHost's Raft transport, as the
	// other nodes reach it (advertised). RaftListenAddr, if set, is the
	// address it binds instead (0.0.0.0:7100 behind a NAT or a pod IP).
	RaftAddr       string
	RaftListenAddr string
	// DataDir holds the NodeHost's log (LogDB) and the state machines.
	DataDir string
	// RTT is the expected round trip between nodes; elections and
	// heartbeats are multiples of it. Zero means 10 ms.
	RTT time.Duration
	// SnapshotEntries is how many applied entries trigger a snapshot and
	// log compaction (keeping CompactionOverhead entries). Zero means
	// 100,000 and 5,000, etcd's defaults (--snapshot-count and its
	// catch-up entries). A snapshot syncs the state machine, which stalls
	// its applies on every replica at once: at 10,000 entries that was
	// every 2.5 s under the reference load, and p99 acquire doubled.
	SnapshotEntries    uint64
	CompactionOverhead uint64
	// IdleCompaction is how often the node looks for idle replicas whose
	// logs to compact (compactIdle). Zero means a minute; negative turns
	// the look off.
	IdleCompaction time.Duration
	// Listener receives Raft leader changes.
	Listener raftio.IRaftEventListener
	// Observer sees hand-offs to waiters as replicas apply them.
	Observer shard.ApplyObserver
	// Events, EventsReset and EventsClosed, if set, hear the data-shard
	// replicas' lock events, where each replica's state was loaded and
	// that it stopped (shard.Hooks Events, Reset, Closed): a
	// router.History's Heard, Reset and Close.
	Events       func(shardID, applied uint64, evs []shard.LockEvent)
	EventsReset  func(shardID, applied uint64)
	EventsClosed func(shardID uint64)
	// RaftTLS, if set, makes the Raft transport mutual TLS.
	RaftTLS *RaftTLS
	// OnSnapshot, if set, is told how long each data-shard replica took
	// to write a snapshot (kind "save") or to load one (kind "recover").
	// Dragonboat has an on-disk state machine save one only to send it to
	// a replica that needs it (its local snapshots record the index
	// alone), so these time a replica's catching up.
	OnSnapshot func(kind string, d time.Duration)
	// OnStorage, if set, is told how long each flush and compaction of a
	// data-shard replica's database took (shard.Hooks.Storage).
	OnStorage func(kind string, d time.Duration)
	// OnFsync, if set, is told how long each fsync probe took: every
	// fsyncProbeInterval the node overwrites one 4 KiB block of a file
	// in its data directory (fsync-probe) and fsyncs it. Dragonboat's
	// LogDB, whose write-ahead log is synced before every commit, cannot
	// be timed from outside (it refuses any file system but its own), so
	// the probe times the same disk instead, as a lagging commit would
	// feel it.
	OnFsync func(d time.Duration)
	// DiskReserve is the free space the node keeps on its data
	// directory's filesystem (WritesRefused, disk.go); the zero value
	// keeps none.
	DiskReserve DiskReserve
}

// defaultRTT is NodeConfig.RTT's default.
const defaultRTT = 10 * time.Millisecond

// fsyncProbeInterval is how often a node times an fsync (OnFsync).
const fsyncProbeInterval = time.Second

// logDBMemTable is the LogDB's memtable size, in bytes. Pebble sizes
// each write-ahead log file to 110 % of it, and keeps as many spare files
// for reuse as memtables may queue (four) plus one, once a burst has
// written them: at Dragonboat's smallest preset, 4 MiB, that was 23 MB on
// each node for good.
const logDBMemTable = 1 << 20

// idleCompactionKeep is how many entries at most a snapshot of an idle
// replica leaves in its log (CompactionOverhead if fewer): a replica
// that missed fewer catches up from the log, not by a snapshot. Entries
// are counted, not bytes, and a batch of writes is one entry: the 100,000
// leases of a burst took 2,349 entries (about 6 KB each), so
// CompactionOverhead's 5,000 would have kept the whole burst.
const idleCompactionKeep = 500

// RaftTLS is the Raft transport's mutual TLS (Dragonboat's MutualTLS):
// every connection, both ways, presents a certificate CAFile verifies.
// Dragonboat checks only the CA, so CAFile must sign node certificates
// alone; its dialer verifies the server's certificate against the host
// of the peer's Raft address, which the certificate must name. The files
// are read at start.
type RaftTLS struct{ CAFile, CertFile, KeyFile string }

// Election timing in RTTs: a leader is suspected after ElectionRTT × RTT
// without a heartbeat (200 ms at the default RTT).
const (
	electionRTT  = 20
	heartbeatRTT = 2
)

// Node is a running NodeHost.
type Node struct {
	cfg      NodeConfig
	nh       *dragonboat.NodeHost
	stop     chan struct{} // closed by Close
	stopOnce sync.Once
	done     sync.WaitGroup // the fsync probe and compactIdle, until stop
	// runsMeta: StartMeta or JoinMeta started this node's replica of
	// the placement group in this process.
	runsMeta atomic.Bool
	// diskLow is set while the data directory has less free space than
	// the reserve (watchDisk).
	diskLow atomic.Pointer[DiskLowError]
	// failed maps shard id → why this node's replica of it was not
	// started (a *RolledBackError), until the process restarts.
	failed sync.Map
}

// dropFailed deletes the data of the replicas the node left stopped
// (ReplicaFailed) that want, the replica ids the map places on the node
// by shard, no longer names, and forgets they failed: they were moved
// away (the repair of a RolledBackError).
func (n *Node) dropFailed(want map[uint64]uint64) error {
	var errs []error
	n.failed.Range(func(k, v any) bool {
		shardID, e := k.(uint64), v.(*RolledBackError)
		if want[shardID] == e.Replica {
			return true
		}
		if err := n.StopDataShard(shardID, e.Replica); err != nil {
			errs = append(errs, err)
			return true
		}
		slog.Info("failed replica removed", "node", n.cfg.ID, "shard", shardID, "replica", e.Replica)
		n.failed.Delete(shardID)
		return true
	})
	return errors.Join(errs...)
}

// StartNode starts a NodeHost with a small LogDB (Dragonboat's default
// reserves up to 8 GiB; dev mode runs three in one process).
func StartNode(cfg NodeConfig) (*Node, error) {
	if cfg.RTT == 0 {
		cfg.RTT = defaultRTT
	}
	if cfg.SnapshotEntries == 0 {
		cfg.SnapshotEntries, cfg.CompactionOverhead = 100_000, 5_000
	}
	if cfg.IdleCompaction == 0 {
		cfg.IdleCompaction = time.Minute
	}
	nh, err := dragonboat.NewNodeHost(nodeHostConfig(cfg))
	if err != nil {
		return nil, fmt.Errorf("placement: start node %d: %w", cfg.ID, err)
	}
	n := &Node{cfg: cfg, nh: nh, stop: make(chan struct{})}
	if err := os.RemoveAll(n.ExportDir()); err != nil { // a backup's leftovers
		nh.Close()
		return nil, fmt.Errorf("placement: start node %d: %w", cfg.ID, err)
	}
	addDataDir(cfg.DataDir)
	if cfg.OnFsync != nil {
		n.done.Go(n.probeFsync)
	}
	if cfg.DiskReserve != (DiskReserve{}) {
		n.checkDisk() // before the first replica starts
		n.done.Go(n.watchDisk)
	}
	if cfg.IdleCompaction > 0 {
		n.done.Go(n.compactIdle)
	}
	return n, nil
}

// nodeHostConfig is the configuration of cfg's NodeHost.
func nodeHostConfig(cfg NodeConfig) config.NodeHostConfig {
	logdb := config.GetTinyMemLogDBConfig()
	logdb.Shards = 1
	logdb.KVWriteBufferSize = logDBMemTable
	nhc := config.NodeHostConfig{
		DeploymentID:      deploymentID,
		NodeHostDir:       filepath.Join(cfg.DataDir, "nodehost"),
		WALDir:            filepath.Join(cfg.DataDir, "wal"),
		RTTMillisecond:    uint64(cfg.RTT / time.Millisecond),
		RaftAddress:       cfg.RaftAddr,
		ListenAddress:     cfg.RaftListenAddr,
		RaftEventListener: cfg.Listener,
		Expert:            config.ExpertConfig{LogDB: logdb},
	}
	if t := cfg.RaftTLS; t != nil {
		nhc.MutualTLS, nhc.CAFile, nhc.CertFile, nhc.KeyFile = true, t.CAFile, t.CertFile, t.KeyFile
	}
	return nhc
}

// compactIdle snapshots, every IdleCompaction until Close, each local
// replica whose log has not grown since the last look (its shard has
// been idle for one to two intervals) and holds more than twice its keep
// (CompactionOverhead, at most idleCompactionKeep) entries; the snapshot
// compacts the log behind it to the keep. A replica that was down
// meanwhile and missed more entries than the keep catches up by a
// snapshot stream rather than from the log. Dragonboat snapshots by
// count alone (SnapshotEntries), as etcd and ZooKeeper do, so a burst's
// log stayed on disk until as many entries again came: 100,000
// one-second leases left 12 MB of it on each node. An idle replica's
// snapshot is cheap: the state machine's is a sync (the placement
// group's, a copy of its small state).
func (n *Node) compactIdle() {
	tick := time.NewTicker(n.cfg.IdleCompaction)
	defer tick.Stop()
	stopped, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-n.stop; cancel() }() // Close need not wait out a snapshot
	keep := min(n.cfg.CompactionOverhead, idleCompactionKeep)
	// seen: each local replica's last log index at the last look.
	seen := map[uint64]uint64{}
	for {
		select {
		case <-n.stop:
			return
		case <-tick.C:
		}
		info := n.nh.GetNodeHostInfo(dragonboat.NodeHostInfoOption{SkipLogInfo: true})
		looked := map[uint64]uint64{}
		for _, s := range info.ShardInfoList {
			lr, err := n.nh.GetLogReader(s.ShardID)
			if err != nil {
				continue
			}
			first, last := lr.GetRange()
			looked[s.ShardID] = last
			if prev, ok := seen[s.ShardID]; !ok || prev != last || last+1-first <= 2*keep {
				continue
			}
			// An idle replica's snapshot takes milliseconds; one that
			// does not apply must not hold up the others for long.
			ctx, cancel := context.WithTimeout(stopped, 10*time.Second)
			idx, err := n.nh.SyncRequestSnapshot(ctx, s.ShardID, dragonboat.SnapshotOption{OverrideCompactionOverhead: true, CompactionOverhead: keep})
			cancel()
			switch {
			case errors.Is(err, dragonboat.ErrRejected), // a snapshot at this index exists
				errors.Is(err, dragonboat.ErrSystemBusy), // another snapshot is under way (warden admin snapshot)
				errors.Is(err, dragonboat.ErrShardNotFound), errors.Is(err, dragonboat.ErrShardClosed),
				errors.Is(err, dragonboat.ErrAborted): // stopped since the look (a move)
				continue
			case err != nil && stopped.Err() == nil:
				slog.Warn("snapshot of an idle replica failed; its log stays until the next", "node", n.cfg.ID, "shard", s.ShardID, "err", err)
				continue
			case err != nil:
				return
			}
			slog.Debug("idle replica snapshotted", "node", n.cfg.ID, "shard", s.ShardID, "index", idx, "log_entries", last+1-first)
		}
		seen = looked
	}
}

// probeFsync times a write and fsync of one block of the probe file
// every fsyncProbeInterval until Close, logging a failure once per run
// of failures.
func (n *Node) probeFsync() {
	path := filepath.Join(n.cfg.DataDir, "fsync-probe")
	block := make([]byte, 4096)
	tick := time.NewTicker(fsyncProbeInterval)
	defer tick.Stop()
	failing := false
	for {
		select {
		case <-n.stop:
			return
		case <-tick.C:
		}
		start := time.Now()
		err := writeSynced(path, block)
		switch {
		case err == nil:
			n.cfg.OnFsync(time.Since(start))
			failing = false
		case !failing:
			slog.Warn("fsync probe failed: the data directory's disk may be full or failing", "node", n.cfg.ID, "err", err)
			failing = true
		}
	}
}

// writeSynced writes b at the start of file path (created if need be)
// and fsyncs it.
func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// NodeHost returns the node's Dragonboat NodeHost. The router reaches
// it only through its Raft seam (router/raft_dragonboat.go); tests use it
// to stop replicas and move leaderships behind the router's back.
func (n *Node) NodeHost() *dragonboat.NodeHost { return n.nh }

// Meta returns the placement client of the node's own replica of the
// placement group, which must be running (StartMeta).
func (n *Node) Meta() MetaClient { return localMeta{nh: n.nh} }

// ExportDir is where the node writes the shard exports a backup streams
// (removed as each is sent, and at every start).
func (n *Node) ExportDir() string { return filepath.Join(n.cfg.DataDir, "export") }

// ID returns the node's id.
func (n *Node) ID() uint64 { return n.cfg.ID }

// Zone returns the node's availability zone.
func (n *Node) Zone() string { return n.cfg.Zone }

// DiskUsage is the bytes the node's Raft log (its NodeHost and WAL
// directories) and its state machines' stores take on disk now, walking
// the files (a read error leaves the file out).
func (n *Node) DiskUsage() (raftLog, stateMachines int64) {
	size := func(dir string) int64 {
		var total int64
		_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if info, err := d.Info(); err == nil {
					total += info.Size()
				}
			}
			return nil
		})
		return total
	}
	return size(filepath.Join(n.cfg.DataDir, "nodehost")) + size(filepath.Join(n.cfg.DataDir, "wal")), size(filepath.Join(n.cfg.DataDir, "sm"))
}

// DiskSpace is the size and the free bytes (for an unprivileged user) of
// the filesystem holding the node's data directory.
func (n *Node) DiskSpace() (size, free uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(n.cfg.DataDir, &st); err != nil {
		return 0, 0, err
	}
	return st.Blocks * uint64(st.Bsize), st.Bavail * uint64(st.Bsize), nil
}

// timedSnapshots wraps the state machines create makes so that observe
// (if set) hears how long each snapshot's save and recovery took.
func timedSnapshots(create sm.CreateOnDiskStateMachineFunc, observe func(string, time.Duration)) sm.CreateOnDiskStateMachineFunc {
	if observe == nil {
		return create
	}
	return func(shardID, replicaID uint64) sm.IOnDiskStateMachine {
		return timedSM{create(shardID, replicaID), observe}
	}
}

// timedSM is a state machine whose snapshot calls are timed.
type timedSM struct {
	sm.IOnDiskStateMachine
	observe func(string, time.Duration)
}

func (t timedSM) SaveSnapshot(ctx any, w io.Writer, stopc <-chan struct{}) error {
	start := time.Now()
	err := t.IOnDiskStateMachine.SaveSnapshot(ctx, w, stopc)
	if err == nil {
		t.observe("save", time.Since(start))
	}
	return err
}

func (t timedSM) RecoverFromSnapshot(r io.Reader, stopc <-chan struct{}) error {
	start := time.Now()
	err := t.IOnDiskStateMachine.RecoverFromSnapshot(r, stopc)
	if err == nil {
		t.observe("recover", time.Since(start))
	}
	return err
}

// raftConfig is the Raft configuration of every replica on the node.
func (n *Node) raftConfig(shardID, replicaID uint64) config.Config {
	return config.Config{
		ReplicaID:          replicaID,
		ShardID:            shardID,
		ElectionRTT:        electionRTT,
		HeartbeatRTT:       heartbeatRTT,
		CheckQuorum:        true, // a leader cut off from a quorum steps down
		PreVote:            true,
		SnapshotEntries:    n.cfg.SnapshotEntries,
		CompactionOverhead: n.cfg.CompactionOverhead,
	}
}

// StartDataShard starts this node's replica of data shard s, as the map
// describes it. members maps replica id → Raft address for a shard's
// first start. A replica whose Join is set was added to a running group:
// it starts empty, with no members, waiting for the leader to send it
// the log; a NonVoting one starts as a non-voting member (until a move
// promotes it). Every replica of a shard with ordered_config_change runs
// with Dragonboat's OrderedConfigChange, on every start: Dragonboat does
// not record it, and a replica without it would apply a change the
// others refuse. A replica this NodeHost has started before is restarted
// as Dragonboat requires, whatever the arguments say: it recovers its
// membership from its own log, and the members and join it was first
// started with are checked against what it recorded then (today's map
// lists other members after a move, and a joined replica is no longer
// joining).
func (n *Node) StartDataShard(s *placementv1.Shard, members map[uint64]string) error {
	i := slices.IndexFunc(s.GetReplicas(), func(r *placementv1.Replica) bool { return r.GetNodeId() == n.cfg.ID })
	if i < 0 {
		return fmt.Errorf("placement: node %d: start shard %d: no replica of it is placed here", n.cfg.ID, s.GetId())
	}
	r := s.GetReplicas()[i]
	shardID, replicaID := s.GetId(), r.GetReplicaId()
	create := timedSnapshots(shard.NewStateMachine(filepath.Join(n.cfg.DataDir, "sm"), shard.Hooks{Applied: n.cfg.Observer, Events: n.cfg.Events, Reset: n.cfg.EventsReset, Closed: n.cfg.EventsClosed, Storage: n.cfg.OnStorage, Fatal: ExitIfOutOfSpace}), n.cfg.OnSnapshot)
	rc := n.raftConfig(shardID, replicaID)
	rc.IsNonVoting = r.GetNonVoting()
	rc.OrderedConfigChange = s.GetOrderedConfigChange()
	if err := n.ReplicaFailed(shardID); err != nil {
		return err
	}
	if err := n.checkRolledBack(shardID, replicaID); err != nil {
		rb, ok := errors.AsType[*RolledBackError](err)
		if ok {
			n.failReplica(shardID, rb)
			return err
		}
		// The check reads Dragonboat's files and the state machine's
		// database from outside: one it cannot read (a snapshot directory
		// a crash left without its record, a database another replica
		// object of this process still holds) proves nothing, and the
		// replica starts as it did before the check existed.
		slog.Warn("replica started without the rollback check", "node", n.cfg.ID, "shard", shardID, "replica", replicaID, "err", err)
	}
	members, join := n.restartArgs(shardID, replicaID, members, r.GetJoin())
	if err := n.nh.StartOnDiskReplica(members, join, create, rc); err != nil {
		return fmt.Errorf("placement: node %d: start shard %d: %w", n.cfg.ID, shardID, err)
	}
	slog.Debug("replica started", "node", n.cfg.ID, "zone", n.cfg.Zone, "shard", shardID, "replica", replicaID, "ordered_config_change", rc.OrderedConfigChange)
	return nil
}

// StartMeta starts this node's replica of the placement group, with
// replica id = node id; members and join as for StartDataShard.
func (n *Node) StartMeta(members map[uint64]string, join bool) error {
	members, join = n.restartArgs(MetaShardID, n.cfg.ID, members, join)
	if err := n.nh.StartReplica(members, join, NewMetaStateMachine, n.raftConfig(MetaShardID, n.cfg.ID)); err != nil {
		return fmt.Errorf("placement: node %d: start the placement group: %w", n.cfg.ID, err)
	}
	n.runsMeta.Store(true)
	return nil
}

// JoinMeta starts this node's replica of the placement group as the
// non-voting member the placement leader added (replica id = node id),
// empty, to be sent the log or a snapshot; a replica already running is
// left as it is. It starts non-voting on every later start too, whatever
// it has become since: Dragonboat makes it a follower when the
// membership it recovers (from its snapshot, or the promotion replayed
// from its log) lists it as a voter, whereas a replica started as a
// voter that replays its own non-voting addition panics.
func (n *Node) JoinMeta() error {
	members, join := n.restartArgs(MetaShardID, n.cfg.ID, nil, true)
	rc := n.raftConfig(MetaShardID, n.cfg.ID)
	rc.IsNonVoting = true
	err := n.nh.StartReplica(members, join, NewMetaStateMachine, rc)
	if err != nil && !errors.Is(err, dragonboat.ErrShardAlreadyExist) {
		return fmt.Errorf("placement: node %d: join the placement group: %w", n.cfg.ID, err)
	}
	n.runsMeta.Store(true)
	return nil
}

// LocalFirst returns the placement client of a process whose nodes are
// nodes: through the replica of the first node that runs one (StartMeta
// or JoinMeta, checked at each call), else through remote (a node that
// hosts none asks the others, over NodeService). A node that joins the
// placement group at run time (it replaces a voter) reads and proposes
// through its own replica from then on, never through the others: a
// voter that asked the others would ask voters that do the same, in a
// circle, once no initial member is left. While its replica catches up,
// its reads fail (unavailable) and are retried.
func LocalFirst(nodes []*Node, remote MetaClient) MetaClient {
	return localFirst{nodes: nodes, remote: remote}
}

type localFirst struct {
	nodes  []*Node
	remote MetaClient
}

func (l localFirst) pick() MetaClient {
	for _, n := range l.nodes {
		if n.runsMeta.Load() {
			return n.Meta()
		}
	}
	return l.remote
}

func (l localFirst) Propose(ctx context.Context, cmd *placementv1.Command) (*placementv1.Result, error) {
	return l.pick().Propose(ctx, cmd)
}

func (l localFirst) Read(ctx context.Context) (*placementv1.State, error) { return l.pick().Read(ctx) }

// HostsMeta reports whether this node has ever started a replica of the
// placement group (an initial member, or one JoinMeta started): it must
// start it again at every start.
func (n *Node) HostsMeta() bool { return n.nh.HasNodeInfo(MetaShardID, n.cfg.ID) }

// restartArgs returns the members and join flag to start replica
// replicaID of shardID with: those given for a replica's first start, and
// none (not joining) for a replica the NodeHost has a bootstrap record
// of, which Dragonboat accepts whatever the record says.
func (n *Node) restartArgs(shardID, replicaID uint64, members map[uint64]string, join bool) (map[uint64]string, bool) {
	if n.nh.HasNodeInfo(shardID, replicaID) {
		return nil, false
	}
	return members, join
}

// StopDataShard stops this node's replica of a shard that placement moved
// away or dropped, and deletes its data.
func (n *Node) StopDataShard(shardID, replicaID uint64) error {
	if err := n.nh.StopShard(shardID); err != nil && !errors.Is(err, dragonboat.ErrShardNotFound) {
		return fmt.Errorf("placement: node %d: stop shard %d: %w", n.cfg.ID, shardID, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := n.nh.RemoveData(shardID, replicaID)
		if !errors.Is(err, dragonboat.ErrShardNotStopped) || time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("placement: node %d: remove shard %d: %w", n.cfg.ID, shardID, err)
			}
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return os.RemoveAll(shard.ReplicaDir(filepath.Join(n.cfg.DataDir, "sm"), shardID, replicaID))
}

// Close stops every replica on the node and the NodeHost.
func (n *Node) Close() {
	n.stopOnce.Do(func() { close(n.stop) })
	n.done.Wait()
	n.nh.Close()
}
