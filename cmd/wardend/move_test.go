package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
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
	t.Parallel()
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
			t.Fatalf("node 4's replica after a restart (snapshot %v): %v\n%s", snapshot, err, c.nodes[four].log.Tail(20))
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

// pause SIGSTOPs node i: its process keeps its sockets but answers
// nothing, as a hung machine would. (Callable from any goroutine: it
// does not fail the test.)
func (c *procCluster) pause(i int) {
	c.nodes[i].up.Store(false)
	_ = c.nodes[i].cmd.Process.Signal(syscall.SIGSTOP)
}

// resume SIGCONTs node i.
func (c *procCluster) resume(i int) {
	_ = c.nodes[i].cmd.Process.Signal(syscall.SIGCONT)
	c.nodes[i].up.Store(true)
}

// Fault 3 of issue 41: moves while one of shard 1's voters (node 3) is
// SIGSTOPped, with three 8 s leases renewed every second (each renewal
// must succeed within 2.5 s, failing over between nodes) throughout.
//
//   - Moving a live voter (node 2's replica to node 5) would need every
//     other live node to stay up until it ends: it is refused up front,
//     failed_precondition naming node 3 (before, it hung 30–60 s and a
//     lease expired).
//   - A move to a target stopped just before is refused, or rolls back
//     (aborted), the replicas staying on nodes 1, 2 and 3.
//   - The down voter's own replica moves to node 4, and node 4 is
//     SIGSTOPped the moment its replica votes: the move removed node 3's
//     replica before promoting node 4's, so the shard (nodes 1, 2 and 4)
//     has a quorum throughout and the move completes (before, the shard
//     had two live voters of four and stalled).
func TestClusterMoveWithVoterDown(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	four, five := c.join("az3"), c.join("az2")
	const ttl = 8 * time.Second
	var renewers []*rawRenewer
	defer func() {
		for _, w := range renewers {
			w.finish(t)
		}
	}()
	for i := range 3 {
		r := fmt.Sprintf("kept-%d", i)
		var l *wardenv1.AcquireResponse
		if err := retryUnavailable(func() (err error) {
			l, err = c.nodes[0].acquire(r, "hold-"+r, ttl, 0)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		renewers = append(renewers, c.renewEvery(r, l, ttl, time.Second, 2500*time.Millisecond, i%2))
	}
	c.pause(2)
	c.waitLeaderNot(2)
	c.nodeUp(0, 3, false)
	c.nodeUp(1, 3, false)
	move := func(from, to uint64) (*wardenv1.MoveReplicaResponse, time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		start := time.Now()
		resp, err := c.nodes[0].admin.MoveReplica(ctx, connect.NewRequest(&wardenv1.MoveReplicaRequest{ShardId: 1, FromNodeId: from, ToNodeId: to}))
		if err != nil {
			return nil, time.Since(start), err
		}
		return resp.Msg, time.Since(start), nil
	}

	// A live voter's replica, with node 3 down.
	_, took, err := move(2, c.nodes[five].id)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "node 3") {
		t.Fatalf("moving node 2's replica with node 3 down: %v (after %v), want failed_precondition naming node 3", err, took)
	}
	if got := slices.Sorted(slices.Values(c.replicaNodes(1))); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("after the refused move shard 1 is on nodes %v", got)
	}
	t.Logf("moving node 2's replica: %v (after %v)", err, took.Round(time.Millisecond))

	// To a target stopped just before.
	c.pause(four)
	_, took, err = move(3, c.nodes[four].id)
	if code := connect.CodeOf(err); code != connect.CodeFailedPrecondition && code != connect.CodeAborted {
		t.Fatalf("moving to a stopped node: %v (after %v), want failed_precondition or aborted", err, took)
	}
	if got := slices.Sorted(slices.Values(c.replicaNodes(1))); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("after the move to a stopped node shard 1 is on nodes %v", got)
	}
	t.Logf("moving to a stopped node: %v (after %v)", err, took.Round(time.Millisecond))
	c.resume(four)
	c.nodeUp(0, c.nodes[four].id, true)
	c.nodeUp(1, c.nodes[four].id, true)

	// The down voter's replica, its target stopped as soon as it votes.
	watch, stopWatch := context.WithCancel(context.Background())
	voted := make(chan time.Time, 1)
	go func() {
		defer close(voted)
		for watch.Err() == nil {
			ctx, cancel := context.WithTimeout(watch, time.Second)
			m, err := c.nodes[0].node().Membership(ctx, connect.NewRequest(&placementv1.MembershipRequest{ShardId: 1, Change: placementv1.MembershipChange_MEMBERSHIP_CHANGE_NONE}))
			cancel()
			// Replicas 1 to 3 are the shard's first; the rolled-back move's
			// was 4: any other voting is node 4's new one.
			if err == nil && len(slices.DeleteFunc(slices.Collect(maps.Keys(m.Msg.GetVoting())), func(id uint64) bool { return id <= 3 })) > 0 {
				c.pause(four)
				voted <- time.Now()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	resp, took, err := move(3, c.nodes[four].id)
	answered := time.Now()
	stopWatch()
	at, stopped := <-voted
	if err != nil || !stopped {
		t.Fatalf("moving node 3's replica to node 4: %v (after %v); node 4 stopped as it voted: %v", err, took, stopped)
	}
	t.Logf("node 3's replica moved to node 4 (replica %d) in %v, node 4 stopped %v before the answer", resp.GetReplicaId(), took.Round(time.Millisecond), answered.Sub(at).Round(time.Millisecond))
	if got := slices.Sorted(slices.Values(c.replicaNodes(1))); !slices.Equal(got, []uint64{1, 2, 4}) {
		t.Fatalf("after the move shard 1 is on nodes %v", got)
	}
	time.Sleep(ttl) // renewals go on, through the two live voters
	c.resume(four)
	c.resume(2)
}
