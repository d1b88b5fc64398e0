package placement

import (
	"fmt"
	"slices"

	"github.com/warden-dev/warden/keyspace"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// FirstDataShard is the id of the data shard a new deployment starts with.
const FirstDataShard = shard.FirstShard

// Map is a placement map as routers use it: a read-only view of one
// placement State. Routers cache it and send its Generation with every
// proposal; a shard refuses a proposal routed by an older generation than
// its own range's.
type Map struct {
	st *placementv1.State
}

// NewMap wraps a placement state; the caller must not modify st afterwards.
func NewMap(st *placementv1.State) *Map { return &Map{st: st} }

// State returns the placement state the map shows; do not modify it.
func (m *Map) State() *placementv1.State { return m.st }

// Generation returns the map's generation (0 before bootstrap).
func (m *Map) Generation() uint64 { return m.st.GetGeneration() }

// ShardFor returns the range that owns key's hash.
func (m *Map) ShardFor(key string) (*shardv1.RangeDescriptor, error) {
	h := keyspace.Hash(key)
	for _, r := range m.st.GetRanges() {
		if shard.InRange(r, h) {
			return r, nil
		}
	}
	return nil, fmt.Errorf("placement: no shard owns hash %#x (generation %d)", h, m.Generation())
}

// Shard returns the shard with id, or nil.
func (m *Map) Shard(id uint64) *placementv1.Shard { return shardByID(m.st, id) }

// Node returns the node with id, or nil.
func (m *Map) Node(id uint64) *placementv1.Node { return nodeByID(m.st, id) }

// ReplicaNode returns the node that hosts replica replicaID of shard
// shardID, or nil.
func (m *Map) ReplicaNode(shardID, replicaID uint64) *placementv1.Node {
	for _, r := range m.Shard(shardID).GetReplicas() {
		if r.GetReplicaId() == replicaID {
			return m.Node(r.GetNodeId())
		}
	}
	return nil
}

// Voters returns the replicas of shard id that vote in its Raft group
// as far as the map shows: every replica but the new one of a move in
// progress that is not recorded as promoted (it joined as non-voting,
// MOVE_STEP_ADDED or before, or the move is rolling back). A replica's
// NonVoting flag says only how its node starts it, and stays set after
// its promotion, so it cannot tell. Between the promotion and its record
// the new replica votes but is left out: a quorum of these replicas is
// then one of the group's voters but the newest.
func (m *Map) Voters(id uint64) []*placementv1.Replica {
	var joining []uint64 // new replicas of moves not promoted
	for _, op := range m.st.GetOperators() {
		if mv := op.GetMove(); mv.GetShard() == id && mv.GetToReplica() != 0 &&
			(mv.GetRollingBack() || mv.GetStep() < placementv1.MoveStep_MOVE_STEP_PROMOTED) {
			joining = append(joining, mv.GetToReplica())
		}
	}
	var out []*placementv1.Replica
	for _, r := range m.Shard(id).GetReplicas() {
		if !slices.Contains(joining, r.GetReplicaId()) {
			out = append(out, r)
		}
	}
	return out
}

// DataShards lists the ids of the shards that own ranges, in range order.
func (m *Map) DataShards() []uint64 {
	var ids []uint64
	for _, r := range m.st.GetRanges() {
		ids = append(ids, r.GetShardId())
	}
	return ids
}

// Members maps replica id → Raft address for the replicas of shard s
// that start with its group (not those added later).
func (m *Map) Members(s *placementv1.Shard) map[uint64]string {
	members := map[uint64]string{}
	for _, r := range s.GetReplicas() {
		if !r.GetJoin() {
			members[r.GetReplicaId()] = m.Node(r.GetNodeId()).GetRaftAddr()
		}
	}
	return members
}
