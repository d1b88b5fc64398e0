package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// MoveReplica with a fourth process, a second node in az1 that joined a
// running cluster: the shard's replica moves from node 1 to node 4. The
// moved replica serves (with node 2 killed afterwards, nodes 3 and 4 are
// the quorum), node 1's replica and its data are gone, no lease changed
// (membership changes never release locks), and requests through node 4,
// which hosts no placement replica, are forwarded.
func TestClusterMoveReplica(t *testing.T) {
	c := startProcCluster(t)
	leases := c.holdMany("kept", 200, 5*time.Minute)
	four := c.join("az1")

	tr := c.runTraffic(3)
	defer tr.stop.Store(true) // when the test fails early too
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := c.nodes[four].admin.MoveReplica(ctx, connect.NewRequest(&wardenv1.MoveReplicaRequest{ShardId: 1, FromNodeId: 1, ToNodeId: 4}))
	if err != nil {
		t.Fatalf("move: %v", err)
	}
	tr.finish(t)
	shards := c.checkShards()
	var nodes []uint64
	for _, r := range shards[0].GetReplicas() {
		nodes = append(nodes, r.GetNodeId())
	}
	if len(nodes) != 3 || nodes[0] == 1 || nodes[1] == 1 || nodes[2] == 1 {
		t.Fatalf("after the move shard 1 has replicas on nodes %v", nodes)
	}
	t.Logf("replica %d on node 4; shard 1 on nodes %v", resp.Msg.GetReplicaId(), nodes)
	c.checkLeases(leases)
	// The moved replica survives restarts: before and after a snapshot
	// (its log replays the join as non-voting, then the promotion).
	for _, snapshot := range []bool{false, true} {
		if snapshot {
			if _, err := c.nodes[0].admin.Snapshot(ctx, connect.NewRequest(&wardenv1.SnapshotRequest{ShardId: 1})); err != nil {
				t.Fatalf("snapshot: %v", err)
			}
		}
		c.kill(four)
		c.start(four)
		c.waitServing(four)
		if idx, err := c.nodes[four].node().AppliedIndex(ctx, connect.NewRequest(&placementv1.AppliedIndexRequest{ShardId: 1})); err != nil {
			t.Fatalf("node 4's replica after a restart (snapshot %v): %v\n%s", snapshot, err, lastLines(c.nodes[four].log.String(), 20))
		} else {
			t.Logf("node 4's replica applied %d after a restart (snapshot first: %v)", idx.Msg.GetIndex(), snapshot)
		}
	}
	c.checkLeases(leases)

	// Move it back: node 1 now holds replica 5 of shard 1 (replica ids are
	// per shard and never reused), and must be able to lead it.
	back, err := c.nodes[1].admin.MoveReplica(ctx, connect.NewRequest(&wardenv1.MoveReplicaRequest{ShardId: 1, FromNodeId: 4, ToNodeId: 1}))
	if err != nil || back.Msg.GetReplicaId() == 1 {
		t.Fatalf("move back: %v %v", back, err)
	}
	if _, err := c.nodes[2].admin.TransferLeader(ctx, connect.NewRequest(&wardenv1.TransferLeaderRequest{ShardId: 1, NodeId: 1})); err != nil {
		t.Fatalf("lead from node 1's replica %d: %v", back.Msg.GetReplicaId(), err)
	}
	c.checkLeases(leases)
	if _, err := c.nodes[0].acquire("led-by-replica-5", "a", time.Minute, 0); err != nil {
		t.Fatalf("acquire on node 1 leading through replica %d: %v", back.Msg.GetReplicaId(), err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := os.Stat(filepath.Join(c.nodes[0].dir, "sm", "shard-1-replica-1"))
		if os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 1 still has its replica's data: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Rebalance: split, put every leader on node 2, and let the plan
	// spread them (dry run first: it changes nothing).
	if _, err := c.nodes[0].admin.SplitShard(ctx, connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: 1})); err != nil {
		t.Fatalf("split: %v", err)
	}
	for _, s := range c.checkShards() {
		if _, err := c.nodes[0].admin.TransferLeader(ctx, connect.NewRequest(&wardenv1.TransferLeaderRequest{ShardId: s.GetId(), NodeId: 2})); err != nil {
			t.Fatalf("transfer shard %d to node 2: %v", s.GetId(), err)
		}
	}
	plan, err := c.nodes[3].admin.Rebalance(ctx, connect.NewRequest(&wardenv1.RebalanceRequest{DryRun: true}))
	if err != nil || len(plan.Msg.GetActions()) == 0 {
		t.Fatalf("rebalance plan: %v %v", plan, err)
	}
	done, err := c.nodes[3].admin.Rebalance(ctx, connect.NewRequest(&wardenv1.RebalanceRequest{}))
	if err != nil {
		t.Fatalf("rebalance: %v", err)
	}
	t.Logf("rebalance: %v", done.Msg.GetActions())
	led := map[uint64]int{}
	for _, s := range c.checkShards() {
		led[s.GetLeaderNodeId()]++
	}
	if led[2] > 1 {
		t.Fatalf("after the rebalance node 2 still leads %d shards", led[2])
	}
	c.checkLeases(leases)

	c.kill(1) // node 2: the other replicas of each shard must carry it now
	for r, a := range leases {
		n := c.nodes[[]int{0, 2, 3}[len(r)%3]]
		if err := n.renew(r, a.GetLeaseId()); err != nil {
			t.Fatalf("renew %s via node %d with node 2 down: %v", r, n.id, err)
		}
	}
	if _, err := c.nodes[four].acquire("via-node-4", "a", time.Minute, 0); err != nil {
		t.Fatalf("acquire via node 4: %v", err)
	}
}
