package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
)

// TransferLeader moves shardID's leadership to node's replica, through
// a node that hosts one (forwarded: the call came from another node,
// which found none here), waits up to 5 s for it, and returns the node
// that leads then.
func (r *Router) TransferLeader(ctx context.Context, shardID, node uint64, forwarded bool) (uint64, error) {
	if err := r.RefreshMap(ctx); err != nil { // a move may have just placed the replica
		return 0, fmt.Errorf("%w: %v", ErrNoLeader, err)
	}
	sh := r.Map().Shard(shardID)
	if sh == nil {
		return 0, connect.NewError(connect.CodeNotFound, fmt.Errorf("shard_id: shard %d does not exist", shardID))
	}
	var target uint64
	for _, rep := range sh.GetReplicas() {
		if rep.GetNodeId() == node {
			target = rep.GetReplicaId()
		}
	}
	if target == 0 {
		return 0, connect.NewError(connect.CodeNotFound, fmt.Errorf("node_id: node %d has no replica of shard %d", node, shardID))
	}
	n, _ := r.localReplica(sh.GetId())
	if n == nil {
		addr := r.replicaHost(sh.GetId())
		if addr == "" || forwarded || r.cfg.Remote == nil {
			return 0, fmt.Errorf("%w: no node hosting shard %d answers", ErrNoLeader, sh.GetId())
		}
		return r.cfg.Remote.TransferLeader(ctx, addr, shardID, node)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if r.LeaderNode(sh.GetId()) == node {
			return node, nil
		}
		if err := n.Raft.TransferLeader(sh.GetId(), target); err != nil && !errors.Is(err, ErrDropped) {
			return 0, fmt.Errorf("%w: %v", ErrNoLeader, err)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%w: shard %d is still led from node %d", ErrNoLeader, sh.GetId(), r.LeaderNode(sh.GetId()))
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// SnapshotLocal snapshots the replica of shardID on local node nodeID and
// compacts its log behind the snapshot. A replica taking another
// snapshot (errSnapshotBusy: the node's idle compaction, or a second
// admin call) is asked again every snapshotBusyWait for snapshotBusyFor;
// it then reports a snapshot, or nothing to snapshot when the other took
// everything applied, or, still busy, errSnapshotBusy. It returns the
// snapshot's log index (0 and nil when nodeID is not a local node).
func (r *Router) SnapshotLocal(ctx context.Context, shardID, nodeID uint64) (uint64, error) {
	for i := range r.Nodes() {
		if r.Nodes()[i].ID != nodeID {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
		idx, err := r.Nodes()[i].Raft.Snapshot(sctx, shardID)
		giveUp := time.Now().Add(snapshotBusyFor)
		for errors.Is(err, ErrSnapshotBusy) && time.Now().Before(giveUp) && sctx.Err() == nil {
			if f := r.Config().Knobs.OnSnapshotBusy; f != nil {
				f()
			}
			select {
			case <-sctx.Done(): // the caller is gone: the busy answer stands
			case <-time.After(snapshotBusyWait):
				idx, err = r.Nodes()[i].Raft.Snapshot(sctx, shardID)
			}
		}
		cancel()
		return idx, err
	}
	return 0, nil
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
