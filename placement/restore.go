package placement

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"google.golang.org/protobuf/proto"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/shard"
)

// RestoreEpochGap is how many epochs above a backup's allocator window
// (State.epoch_limit) a restored cluster skips when the operator gives no
// lowest epoch: the epochs the backed-up cluster assigned after the
// backup (a split, a received range, a revision rollover; a few a day at
// most) are not in it, and must never be assigned again. 65,536 is
// 0.8 % of the 2^23 epochs; restoring twice from the same backup takes
// epochs above the first restore's only if the second is given a lowest
// epoch (wardend restore --min-epoch).
const RestoreEpochGap = 1 << 16

// PrepareRestore returns the placement state that a cluster restored
// from the backed-up state st starts with, the restore's id, and the
// epoch each data shard's records take (shard.RestoreReplica), by shard
// id. Every shard takes a new epoch, in shard id order from the lowest
// epoch allowed: the backup's window plus RestoreEpochGap, or minEpoch
// when given (but never below the window). So every fencing token the
// restored cluster issues is above every token the backed-up cluster
// issued before or after the backup, however far its shards' revisions
// went since. Incarnations are cleared (each restored node registers a
// new one) and so are join and non-voting marks (every replica of the
// map is an initial member of its restored group). A state with a split
// or move in progress is refused: a backup is taken when none runs. A
// node removal or rebalance in progress is left out: the restored
// cluster does not resume it (run it again).
//
// The result depends only on st, backupID and minEpoch, so every node
// restored from the same backup with the same --min-epoch prepares the
// same state and epochs, and the same restore id, which the placement
// group records (a node restored with another one refuses to start).
func PrepareRestore(st *placementv1.State, backupID string, minEpoch uint64) (*placementv1.State, string, map[uint64]uint64, error) {
	if st.GetGeneration() == 0 || len(st.GetShards()) == 0 || len(st.GetNodes()) == 0 {
		return nil, "", nil, errors.New("placement: restore: the backed-up placement state has no map")
	}
	if op := RangeOperator(st); op != nil {
		return nil, "", nil, fmt.Errorf("placement: restore: operator %d was in progress in the backup", op.GetId())
	}
	first := st.GetEpochLimit() + RestoreEpochGap
	if minEpoch != 0 {
		first = max(minEpoch, st.GetEpochLimit())
	}
	out := proto.CloneOf(st)
	out.Operators = nil
	slices.SortFunc(out.Shards, func(a, b *placementv1.Shard) int { return cmp.Compare(a.GetId(), b.GetId()) })
	if last := first + uint64(len(out.Shards)) - 1; last > shard.MaxEpoch {
		return nil, "", nil, fmt.Errorf("placement: restore: epochs %d to %d do not fit below %d", first, last, shard.MaxEpoch)
	}
	epochs := map[uint64]uint64{}
	for i, s := range out.Shards {
		s.Epoch = first + uint64(i)
		epochs[s.GetId()] = s.Epoch
		for _, r := range s.GetReplicas() {
			r.Join, r.NonVoting = false, false
		}
	}
	out.LastEpoch = first + uint64(len(out.Shards)) - 1
	out.EpochLimit = out.LastEpoch + 1
	for _, n := range out.Nodes {
		n.Incarnation = ""
	}
	h := sha256.Sum256([]byte(backupID + "\x00" + strconv.FormatUint(first, 10)))
	out.RestoreId = hex.EncodeToString(h[:8])
	return out, out.RestoreId, epochs, nil
}

// RestoreCommand is the placement command that creates a restored
// cluster's state: prepared (PrepareRestore) with the addresses members
// give each node (the restored cluster's --initial-members). members
// must name exactly the backup's nodes.
func RestoreCommand(prepared *placementv1.State, members []*placementv1.Node) (*placementv1.Command, error) {
	st := proto.CloneOf(prepared)
	var missing []uint64
	for _, n := range st.GetNodes() {
		i := slices.IndexFunc(members, func(m *placementv1.Node) bool { return m.GetId() == n.GetId() })
		if i < 0 {
			missing = append(missing, n.GetId())
			continue
		}
		n.RaftAddr, n.ListenAddr = members[i].GetRaftAddr(), members[i].GetListenAddr()
	}
	if len(missing) > 0 || len(members) != len(st.GetNodes()) {
		return nil, fmt.Errorf("placement: restore: the initial members must be the backup's nodes %v (missing %v, given %d)", nodeIDs(st), missing, len(members))
	}
	return &placementv1.Command{Command: &placementv1.Command_Restore{Restore: &placementv1.RestoreCmd{State: st, RestoreId: st.GetRestoreId()}}}, nil
}

func nodeIDs(st *placementv1.State) []uint64 {
	var ids []uint64
	for _, n := range st.GetNodes() {
		ids = append(ids, n.GetId())
	}
	return ids
}

// ErrRestored is the Error of a RestoreCmd on a state that exists and was
// not created by that restore.
var ErrRestored = errors.New("placement: restore: the cluster has a placement state that this restore did not create")

func applyRestore(st *placementv1.State, c *placementv1.RestoreCmd) error {
	switch {
	case c.GetRestoreId() == "":
		return errors.New("restore_id: is required")
	case st.GetGeneration() != 0 && st.GetRestoreId() == c.GetRestoreId():
		return nil // another initial member's proposal of the same restore
	case st.GetGeneration() != 0:
		return fmt.Errorf("%w (restore id %q, this one %q)", ErrRestored, st.GetRestoreId(), c.GetRestoreId())
	}
	r := c.GetState()
	if r.GetGeneration() == 0 || len(r.GetRanges()) == 0 || len(r.GetNodes()) == 0 || len(r.GetOperators()) > 0 || r.GetRestoreId() != c.GetRestoreId() {
		return errors.New("state: a restored state needs a map, nodes, no operators and the restore's id")
	}
	for _, n := range r.GetNodes() {
		if n.GetRaftAddr() == "" || n.GetListenAddr() == "" {
			return fmt.Errorf("state: node %d: raft_addr and listen_addr are required", n.GetId())
		}
	}
	if err := CheckMap(r); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	proto.Reset(st)
	proto.Merge(st, r)
	return nil
}

// restoreFile is the name, inside a restored node's data directory, of
// the RestoreCmd its first start proposes (wardend restore writes it).
const restoreFile = "restore.pb"

// WriteRestore prepares the empty (or absent) data directory dir of node
// nodeID for its first start in a cluster restored with cmd (a RestoreCmd
// whose state has no addresses yet): an identity with a new incarnation
// and the pending restore. The caller writes the node's replicas' records
// (shard.RestoreReplica) under dir/sm before, so that a directory with a
// pending restore is complete.
func WriteRestore(dir string, nodeID uint64, cmd *placementv1.RestoreCmd) (Identity, error) {
	id := Identity{NodeID: nodeID, Incarnation: newIncarnation()}
	if err := writeIdentity(dir, id); err != nil {
		return Identity{}, err
	}
	b, err := proto.Marshal(cmd)
	if err != nil {
		return Identity{}, err
	}
	if err := shard.WriteFileDurably(dir, restoreFile, b); err != nil {
		return Identity{}, fmt.Errorf("placement: write %s: %w", filepath.Join(dir, restoreFile), err)
	}
	return id, nil
}

// PendingRestore returns the restore that the data directory dir's first
// start must propose, or nil when it has none (never restored, or its
// first start completed: FinishRestore).
func PendingRestore(dir string) (*placementv1.RestoreCmd, error) {
	b, err := os.ReadFile(filepath.Join(dir, restoreFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	cmd := &placementv1.RestoreCmd{}
	if err := proto.Unmarshal(b, cmd); err != nil || cmd.GetRestoreId() == "" {
		return nil, fmt.Errorf("placement: %s is damaged (%v): run wardend restore again on an empty directory", filepath.Join(dir, restoreFile), err)
	}
	return cmd, nil
}

// FinishRestore ends a restored directory's pending restore once the
// node registered in the restored placement group: from then on it is
// an ordinary member's directory, and losing its Raft log is refused as
// for any other (OpenIdentity).
func FinishRestore(dir string) error {
	if err := os.Remove(filepath.Join(dir, restoreFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("placement: %w", err)
	}
	return shard.SyncDir(dir)
}
