package router

import (
	"context"
	"errors"
)

// LeaderNode returns the node hosting shardID's leader as a local replica
// knows it, or 0.
func (r *Router) LeaderNode(shardID uint64) uint64 {
	for i := range r.nodes {
		id, _, valid, err := r.nodes[i].leaderOf(shardID)
		if err == nil && valid && id != 0 {
			return r.Map().ReplicaNode(shardID, id).GetId()
		}
	}
	return 0
}

// localReplica returns the local node hosting a replica of shardID and
// the replica's id, or nil.
func (r *Router) localReplica(shardID uint64) (*LocalNode, uint64) {
	for _, rep := range r.Map().Shard(shardID).GetReplicas() {
		for i := range r.nodes {
			if r.nodes[i].ID == rep.GetNodeId() {
				return &r.nodes[i], rep.GetReplicaId()
			}
		}
	}
	return nil, 0
}

// Leaders returns the node leading each data shard (0: unknown).
func (r *Router) Leaders(ctx context.Context) map[uint64]uint64 {
	out := map[uint64]uint64{}
	for _, id := range r.Map().DataShards() {
		out[id] = r.LeaderOf(ctx, id)
	}
	return out
}

// LeaderOf returns the node leading shardID: as a local replica knows it,
// else as a node hosting a replica answers (0 if none does).
func (r *Router) LeaderOf(ctx context.Context, shardID uint64) uint64 {
	if id := r.LeaderNode(shardID); id != 0 {
		return id
	}
	addr := r.replicaHost(shardID)
	if addr == "" || r.cfg.Remote == nil {
		return 0
	}
	id, err := r.cfg.Remote.LeaderOf(ctx, addr, shardID)
	if err != nil {
		return 0
	}
	return id
}

// replicaHost returns the address of a remote node hosting a replica of
// shardID, or "".
func (r *Router) replicaHost(shardID uint64) string {
	m := r.Map()
	for _, rep := range m.Shard(shardID).GetReplicas() {
		if n := m.Node(rep.GetNodeId()); n != nil && !r.IsLocal(n.GetId()) {
			return n.GetListenAddr()
		}
	}
	return ""
}

// HostOf returns the local node that runs a replica of shardID, or nil.
func (r *Router) HostOf(shardID uint64) *LocalNode {
	for i := range r.nodes {
		if _, _, _, err := r.nodes[i].Raft.LeaderOf(shardID); err == nil {
			return &r.nodes[i]
		}
	}
	return nil
}

// LocalNode returns local node id, or nil.
func (r *Router) LocalNode(id uint64) *LocalNode {
	for i := range r.nodes {
		if r.nodes[i].ID == id {
			return &r.nodes[i]
		}
	}
	return nil
}

// RemoteFor returns where key's shard is led from when that is another
// node, or nil when it is here or unknown (serving here gives the error),
// with the leader lookup's error.
func (r *Router) RemoteFor(ctx context.Context, key string) (*RemoteLeader, error) {
	rg, err := r.Map().ShardFor(key)
	if err != nil {
		return nil, err
	}
	_, _, err = r.leader(ctx, rg.GetShardId())
	var rl *RemoteLeader
	if errors.As(err, &rl) {
		return rl, nil
	}
	return nil, err
}
