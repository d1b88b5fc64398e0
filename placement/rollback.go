package placement

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	pb "github.com/lni/dragonboat/v4/raftpb"

	"github.com/warden-dev/warden/shard"
)

// A replica whose state machine directory went back in time (restored
// from an older copy, or a disk that lost writes) holds state behind the
// index its Raft log says it applied. Dragonboat, starting it, checks
// the index the state machine's Open returns against the replica's last
// snapshot, and panics when the snapshot is only a marker of the
// state machine's own state (an on-disk state machine's local snapshot,
// or a received one after it was loaded) and its index is above Open's:
// "ss.OnDiskIndex (2428) > s.onDiskInitIndex (2125)", in a goroutine of
// the NodeHost, taking down every replica of the node, at every start.
// The node checks that condition before it starts the replica
// (checkRolledBack) and leaves it stopped instead. The repair is a move
// of the replica to another node of its zone (the node agent deletes
// the stopped replica's data once the map no longer places it here):
// Dragonboat never lets a replica id whose data it removed start again
// on the NodeHost, so the replica cannot be dropped and restarted in
// place, and a move back later gives the node a replica under a new id.

// RolledBackError is why a node did not start its replica of a shard:
// its state machine has applied less than its last snapshot recorded.
type RolledBackError struct {
	Shard, Replica, Node uint64
	// Dir is the replica's state machine directory.
	Dir string
	// Applied is the index of the state in Dir; Snapshot the index the
	// replica's last snapshot recorded the state machine at.
	Applied, Snapshot uint64
}

func (e *RolledBackError) Error() string {
	return fmt.Sprintf("shard %d replica %d on node %d is not started: its state machine directory %s has applied index %d, behind index %d that its last snapshot recorded "+
		"(the directory was restored from an older copy, or the disk lost writes); the node serves its other replicas. "+
		"Repair: move the replica to another node of the zone (warden admin move --shard %d --from %d --to NODE; join a node there first if there is none), "+
		"which deletes it here; a move back gives this node a new replica, which catches up by a snapshot",
		e.Shard, e.Replica, e.Node, e.Dir, e.Applied, e.Snapshot, e.Shard, e.Node)
}

// ReplicaFailed returns why the node left its replica of shardID
// stopped (a *RolledBackError), or nil.
func (n *Node) ReplicaFailed(shardID uint64) error {
	if err, ok := n.failed.Load(shardID); ok {
		return err.(*RolledBackError)
	}
	return nil
}

// failReplica records that the replica of shardID stays stopped for
// err, and logs it once.
func (n *Node) failReplica(shardID uint64, err *RolledBackError) {
	if _, loaded := n.failed.LoadOrStore(shardID, err); !loaded {
		slog.Error("replica not started", "node", n.cfg.ID, "shard", shardID, "err", err)
	}
}

// checkRolledBack returns a *RolledBackError when replica replicaID of
// shardID, which the NodeHost has started before, has a state machine
// behind its last snapshot as Dragonboat would find it (see above):
// that snapshot marks state it does not carry, and its index is above
// the state machine's applied index. A snapshot that carries the state
// (received, and not loaded before a crash) is loaded at the start, and
// passes.
func (n *Node) checkRolledBack(shardID, replicaID uint64) error {
	if !n.nh.HasNodeInfo(shardID, replicaID) {
		return nil
	}
	ss, dir, err := n.lastSnapshot(shardID, replicaID)
	if err != nil || ss == nil {
		return err
	}
	smDir := shard.ReplicaDir(filepath.Join(n.cfg.DataDir, "sm"), shardID, replicaID)
	applied, err := shard.AppliedIndexOf(smDir)
	if err != nil {
		return fmt.Errorf("placement: node %d: shard %d: reading the state machine's applied index: %w", n.cfg.ID, shardID, err)
	}
	if ss.OnDiskIndex <= applied || (!ss.Dummy && carriesState(filepath.Join(dir, fmt.Sprintf("snapshot-%016X.gbsnap", ss.Index)))) {
		return nil
	}
	return &RolledBackError{Shard: shardID, Replica: replicaID, Node: n.cfg.ID, Dir: smDir, Applied: applied, Snapshot: ss.OnDiskIndex}
}

// lastSnapshot reads the record of replica replicaID of shardID's
// newest complete snapshot, the one its Raft log names, and returns it
// with its directory: nil when it has none. Dragonboat keeps each
// snapshot in a directory snapshot-<index, hex> under
// nodehost/<host>/<deployment>/snapshot-part-<n>/snapshot-<shard>-<replica>,
// with its record in snapshot.metadata (an 8-byte checksum, then the
// raftpb.Snapshot); one being written or not yet in the log still holds
// the flag file dragonboat.snapshot.message.
func (n *Node) lastSnapshot(shardID, replicaID uint64) (*pb.Snapshot, string, error) {
	dirs, err := filepath.Glob(filepath.Join(n.cfg.DataDir, "nodehost", "*", "*", "snapshot-part-*", fmt.Sprintf("snapshot-%d-%d", shardID, replicaID), "snapshot-*"))
	if err != nil {
		return nil, "", err
	}
	var best string
	var bestIndex uint64
	for _, d := range dirs {
		idx, err := strconv.ParseUint(strings.TrimPrefix(filepath.Base(d), "snapshot-"), 16, 64)
		if err != nil {
			continue // a temporary directory (.generating, .receiving)
		}
		if _, err := os.Stat(filepath.Join(d, "dragonboat.snapshot.message")); err == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "snapshot.metadata")); err != nil {
			continue // not complete: a crash cut it short before its record
		}
		if idx > bestIndex {
			best, bestIndex = d, idx
		}
	}
	if best == "" {
		return nil, "", nil
	}
	b, err := os.ReadFile(filepath.Join(best, "snapshot.metadata"))
	if err != nil {
		return nil, "", fmt.Errorf("placement: node %d: shard %d: the last snapshot's record: %w", n.cfg.ID, shardID, err)
	}
	ss := &pb.Snapshot{}
	if len(b) < 8 || ss.Unmarshal(b[8:]) != nil {
		return nil, "", fmt.Errorf("placement: node %d: shard %d: the last snapshot's record %s is corrupt", n.cfg.ID, shardID, filepath.Join(best, "snapshot.metadata"))
	}
	return ss, best, nil
}

// carriesState reports whether the snapshot file at path holds a state
// machine's state (the stream shard.SaveSnapshot writes, uncompressed,
// right after Dragonboat's header and sessions), not just the marker a
// loaded or local snapshot of an on-disk state machine is.
func carriesState(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, 8<<10)
	k, _ := io.ReadFull(f, head)
	return bytes.Contains(head[:k], []byte(shard.SnapshotMagic))
}
