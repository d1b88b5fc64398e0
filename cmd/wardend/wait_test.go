package main

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/internal/realtime"
	"github.com/warden-dev/warden/keyspace"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// shardOf returns resource's shard as a running node lists it, once its
// leader is known.
func (c *procCluster) shardOf(resource string) *wardenv1.ShardInfo {
	c.t.Helper()
	h := keyspace.Hash(resource)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.any().shards()
		for _, s := range resp.GetShards() {
			if s.GetState() == "active" && h >= s.GetRangeStart() && (s.GetRangeEnd() == 0 || h < s.GetRangeEnd()) && s.GetLeaderNodeId() != 0 {
				return s
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no leader known for %q's shard: %v %v", resource, resp, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leaderIndex returns the index of the node that leads resource's shard.
func (c *procCluster) leaderIndex(resource string) int {
	return int(c.shardOf(resource).GetLeaderNodeId()) - 1
}

// waitAnswer is what a waiting Acquire was told, and when.
type waitAnswer struct {
	lease *wardenv1.AcquireResponse
	err   error
	at    time.Time
}

// waitRun is a dead holder of a resource and two waiters, W1 then W2,
// each one Acquire call with a 30 s wait through node via.
type waitRun struct {
	c        *procCluster
	resource string
	via      int
	holder   *wardenv1.AcquireResponse
	w1, w2   chan waitAnswer
}

// startWaiters takes resource for ttl (the holder then dies: it never
// renews) and queues W1 then W2 behind it through node via.
func (c *procCluster) startWaiters(resource string, ttl time.Duration, via int) *waitRun {
	c.t.Helper()
	h, err := c.nodes[via].acquire(resource, "holder", ttl, 0)
	if err != nil {
		c.t.Fatalf("holder of %s: %v", resource, err)
	}
	w := &waitRun{c: c, resource: resource, via: via, holder: h, w1: make(chan waitAnswer, 1), w2: make(chan waitAnswer, 1)}
	for k, ch := range []chan waitAnswer{w.w1, w.w2} {
		go func() {
			l, err := c.nodes[via].acquire(resource, []string{"w1", "w2"}[k], 5*time.Second, 30*time.Second)
			ch <- waitAnswer{l, err, time.Now()}
		}()
		c.waitWaiters(resource, uint32(k+1))
	}
	return w
}

// waitWaiters waits until resource has n waiters queued.
func (c *procCluster) waitWaiters(resource string, n uint32) {
	c.t.Helper()
	c.waitWaitersWithin(resource, n, 15*time.Second)
}

// waitWaitersWithin waits up to d until resource has n waiters queued.
func (c *procCluster) waitWaitersWithin(resource string, n uint32, d time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for {
		d, err := c.any().describe(resource)
		if err == nil && d.GetWaiters() == n {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: %v %v, want %d waiters", resource, d, err, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// check asserts case L18's outcome: W1 is granted once the holder's lease
// ends, within rule 6's bound and never before, with no unavailable (or
// any other) answer first; W2 waits on, and is granted when W1 releases;
// tokens increase.
func (w *waitRun) check(label string) {
	t := w.c.t
	t.Helper()
	var a1 waitAnswer
	select {
	case a1 = <-w.w1:
	case <-time.After(40 * time.Second):
		t.Fatalf("%s: W1 was not answered", label)
	}
	if a1.err != nil {
		t.Fatalf("%s: W1: %v (code %v), want the grant", label, a1.err, connect.CodeOf(a1.err))
	}
	expires := w.holder.GetExpiresAt().AsTime()
	const skew, scan = 500 * time.Millisecond, 250 * time.Millisecond // the defaults
	// Rule 6: grantable only past expires_at + max_clock_skew (safety,
	// however slow the machine), free by TTL + 2 × skew + scan interval
	// + election time (2.5 s here, with slack for three processes on two
	// cores; liveness, on a machine no busier than its CPUs).
	if a1.at.Before(expires.Add(skew)) {
		t.Fatalf("%s: W1 granted at %v; the holder's lease expired at %v", label, a1.at.Format(time.StampMilli), expires.Format(time.StampMilli))
	}
	realtime.Within(t, label+": W1's grant after the holder's lease expired", a1.at.Sub(expires), 2*skew+scan+2500*time.Millisecond)
	if a1.lease.GetFencingToken() <= w.holder.GetFencingToken() {
		t.Fatalf("%s: W1's token %#x is not above the holder's %#x", label, a1.lease.GetFencingToken(), w.holder.GetFencingToken())
	}
	select {
	case a2 := <-w.w2:
		t.Fatalf("%s: W2 was answered while W1 holds the lock: %v %v", label, a2.lease, a2.err)
	default:
	}
	if ok, err := w.c.nodes[w.via].release(w.resource, a1.lease.GetLeaseId()); err != nil || !ok {
		t.Fatalf("%s: W1's release: %v %v", label, ok, err)
	}
	var a2 waitAnswer
	select {
	case a2 = <-w.w2:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: W2 was not granted after W1's release", label)
	}
	if a2.err != nil || a2.lease.GetFencingToken() <= a1.lease.GetFencingToken() {
		t.Fatalf("%s: W2: %v %v (W1's token %#x)", label, a2.lease, a2.err, a1.lease.GetFencingToken())
	}
	t.Logf("%s: W1 granted %v after the holder's expiry, W2 after W1's release", label, a1.at.Sub(expires).Round(time.Millisecond))
}

// notLeader returns the index of a running node that does not lead
// resource's shard.
func (c *procCluster) notLeader(resource string) int {
	l := c.leaderIndex(resource)
	for i, n := range c.nodes {
		if i != l && n.up.Load() {
			return i
		}
	}
	c.t.Fatal("no running node but the leader")
	return -1
}

// Cases L3 and L18 on three processes: a waiting Acquire (one call, no
// SDK) made through a node that survives rides through five leadership
// transfers 1 s apart, a SIGKILL of the shard's leader, a split that
// moves the resource to a new shard, and a move of the leader's replica
// to another node, each with no unavailable answer.
func TestClusterWaitersRideThroughLeaderChanges(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)

	// (a) Five transfers, 1 s apart, while the holder's 8 s run out.
	w := c.startWaiters("ride-transfer", 8*time.Second, c.notLeader("ride-transfer"))
	for i := range 5 {
		from := c.leaderIndex(w.resource)
		to := (from + 1) % 3
		ctx, cancel := rpcCtx()
		_, err := c.nodes[to].admin.TransferLeader(ctx, connect.NewRequest(&wardenv1.TransferLeaderRequest{ShardId: c.shardOf(w.resource).GetId(), NodeId: c.nodes[to].id}))
		cancel()
		if err != nil {
			t.Fatalf("transfer %d: %v", i+1, err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for c.leaderIndex(w.resource) != to {
			if time.Now().After(deadline) {
				t.Fatalf("transfer %d: the leader did not move from node %d to node %d", i+1, from+1, to+1)
			}
			time.Sleep(20 * time.Millisecond)
		}
		select {
		case a := <-w.w1:
			t.Fatalf("W1 was answered during transfer %d, before the holder's lease ended: %v %v", i+1, a.lease, a.err)
		case <-time.After(time.Second):
		}
	}
	w.check("five transfers")

	// (b) SIGKILL of the shard's leader 3 s after the waiters queue (the
	// case says 1 s; 3 s is past the 2 s leader wait of the call that the
	// waiters' node forwarded to the leader, so the test shows that a
	// forwarded wait is sent again however long it ran before).
	w = c.startWaiters("ride-kill", 6*time.Second, c.notLeader("ride-kill"))
	time.Sleep(3 * time.Second)
	killed := c.leaderIndex(w.resource)
	c.kill(killed)
	c.waitLeaderNot(killed)
	w.check("leader killed")
	c.start(killed)
	c.waitServing(killed)

	// (c) A split that puts the resource in the new shard.
	w = c.startWaiters("ride-split", 4*time.Second, c.notLeader("ride-split"))
	time.Sleep(time.Second)
	from := c.shardOf(w.resource)
	ctx, cancel := rpcCtx()
	defer cancel()
	split, err := c.nodes[0].admin.SplitShard(ctx, connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: from.GetId(), SplitAt: keyspace.Hash(w.resource)}))
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	if now := c.shardOf(w.resource); now.GetId() != split.Msg.GetNewShardId() {
		t.Fatalf("premise: %s is in shard %d after the split, not the new shard %d", w.resource, now.GetId(), split.Msg.GetNewShardId())
	}
	w.check("split")

	// (d) A move of the leader's replica to a new node, with the waiters
	// connected to the leader's node: it no longer hosts the shard, and
	// hands the waits on to a node that does.
	leader := c.leaderIndex("ride-move")
	w = c.startWaiters("ride-move", 6*time.Second, leader)
	s := c.shardOf(w.resource)
	four := c.join(c.nodes[leader].zone)
	mctx, mcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer mcancel()
	if _, err := c.nodes[four].admin.MoveReplica(mctx, connect.NewRequest(&wardenv1.MoveReplicaRequest{ShardId: s.GetId(), FromNodeId: c.nodes[leader].id, ToNodeId: c.nodes[four].id})); err != nil {
		t.Fatalf("move: %v", err)
	}
	for _, r := range c.shardOf(w.resource).GetReplicas() {
		if r.GetNodeId() == c.nodes[leader].id {
			t.Fatalf("premise: node %d still hosts shard %d after the move", leader+1, s.GetId())
		}
	}
	w.check("leader's replica moved")
}
