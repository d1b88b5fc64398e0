package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// TransferLeader moves shard m.ShardId's leadership to node m.NodeId's
// replica, through a node that hosts one (forwarded: the call came from
// another node, which found none here), and waits up to 5 s for it.
func (r *Router) TransferLeader(ctx context.Context, m *wardenv1.TransferLeaderRequest, forwarded bool) (*wardenv1.TransferLeaderResponse, error) {
	if err := r.RefreshMap(ctx); err != nil { // a move may have just placed the replica
		return nil, fmt.Errorf("%w: %v", ErrNoLeader, err)
	}
	sh := r.Map().Shard(m.GetShardId())
	if sh == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("shard_id: shard %d does not exist", m.GetShardId()))
	}
	var target uint64
	for _, rep := range sh.GetReplicas() {
		if rep.GetNodeId() == m.GetNodeId() {
			target = rep.GetReplicaId()
		}
	}
	if target == 0 {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("node_id: node %d has no replica of shard %d", m.GetNodeId(), m.GetShardId()))
	}
	n, _ := r.localReplica(sh.GetId())
	if n == nil {
		p := r.replicaPeer(sh.GetId())
		if p == nil || forwarded {
			return nil, fmt.Errorf("%w: no node hosting shard %d answers", ErrNoLeader, sh.GetId())
		}
		resp, err := p.Admin.TransferLeader(ctx, ForwardedReq(m))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if r.LeaderNode(sh.GetId()) == m.GetNodeId() {
			return &wardenv1.TransferLeaderResponse{LeaderNodeId: m.GetNodeId()}, nil
		}
		if err := n.raft.transferLeader(sh.GetId(), target); err != nil && !errors.Is(err, errDropped) {
			return nil, fmt.Errorf("%w: %v", ErrNoLeader, err)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: shard %d is still led from node %d", ErrNoLeader, sh.GetId(), r.LeaderNode(sh.GetId()))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// SnapshotLocal snapshots the replica of shardID on local node nodeID and
// compacts its log behind the snapshot. A replica taking another
// snapshot (errSnapshotBusy: the node's idle compaction, or a second
// admin call) is asked again every snapshotBusyWait for snapshotBusyFor;
// it then reports a snapshot, or nothing to snapshot when the other took
// everything applied, or, still busy, errSnapshotBusy.
func (r *Router) SnapshotLocal(ctx context.Context, shardID, nodeID uint64) *wardenv1.ReplicaSnapshot {
	out := &wardenv1.ReplicaSnapshot{ShardId: shardID, NodeId: nodeID}
	for i := range r.Nodes() {
		if r.Nodes()[i].ID != nodeID {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
		idx, err := r.Nodes()[i].raft.snapshot(sctx, shardID)
		giveUp := time.Now().Add(snapshotBusyFor)
		for errors.Is(err, ErrSnapshotBusy) && time.Now().Before(giveUp) && sctx.Err() == nil {
			if f := r.Config().Knobs.OnSnapshotBusy; f != nil {
				f()
			}
			select {
			case <-sctx.Done(): // the caller is gone: the busy answer stands
			case <-time.After(snapshotBusyWait):
				idx, err = r.Nodes()[i].raft.snapshot(sctx, shardID)
			}
		}
		cancel()
		if err != nil {
			out.Error = err.Error()
		}
		out.Index = idx
	}
	return out
}

// snapshotTimeout bounds the snapshot of one replica, its waits for
// another snapshot of it included.
const snapshotTimeout = 30 * time.Second

// snapshotBusyWait is how long snapshotLocal waits before it asks again
// for a snapshot of a replica that is taking another, and snapshotBusyFor
// how long it goes on asking. A local snapshot of an on-disk state
// machine syncs its database and records an index: milliseconds. The
// bound keeps a replica that stays busy from holding up the replicas
// after it and the CLI's call (10 s by default).
const (
	snapshotBusyWait = 50 * time.Millisecond
	snapshotBusyFor  = 5 * time.Second
)
