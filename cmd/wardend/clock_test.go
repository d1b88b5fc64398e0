package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// offsetOf reads node i's warden_clock_offset_seconds for peer.
func (c *procCluster) offsetOf(i int, peer string) (float64, bool) {
	return c.nodes[i].metric(`warden_clock_offset_seconds{peer="` + peer + `"}`)
}

// DESIGN.md "Time": nodes measure their clock offsets; a node whose clock
// is more than max_clock_skew/2 from the majority's exports it, stops
// proposing time-driven commands and hands leadership away. Node 3 runs
// 3 s ahead: the others see it 3 s ahead, and when given the shard's
// leadership it gives it back within a few seconds.
func TestClusterNodeWithSkewedClockStepsDown(t *testing.T) {
	c := startProcCluster(t, map[int][]string{2: {"--debug-clock-offset", "3s"}})
	deadline := time.Now().Add(15 * time.Second)
	for {
		seen, ok1 := c.offsetOf(0, "3")
		own, ok2 := c.offsetOf(2, "1")
		if ok1 && ok2 && seen > 2.5 && seen < 3.5 && own < -2.5 && own > -3.5 {
			t.Logf("node 1 sees node 3 at %+.3f s; node 3 sees node 1 at %+.3f s", seen, own)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("clock offsets not measured: node 1 sees node 3 at %v (%v), node 3 sees node 1 at %v (%v)", seen, ok1, own, ok2)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The transfer may or may not complete before node 3 hands it back.
	_, _ = c.nodes[0].admin.TransferLeader(ctx, connect.NewRequest(&wardenv1.TransferLeaderRequest{ShardId: 1, NodeId: 3}))
	deadline = time.Now().Add(10 * time.Second)
	for {
		resp, err := c.nodes[0].shards()
		if err == nil && len(resp.GetShards()) == 1 {
			if l := resp.GetShards()[0].GetLeaderNodeId(); l != 0 && l != 3 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 3 kept the leadership with a skewed clock: %v %v", resp, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The node-to-node API refuses callers without the cluster secret.
	bare := placementv1connect.NewNodeServiceClient(http.DefaultClient, "http://"+c.nodes[0].listen)
	_, err := bare.ReadMeta(ctx, connect.NewRequest(&placementv1.ReadMetaRequest{}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("NodeService without the secret: %v, want unauthenticated", err)
	}
	if _, err := c.nodes[0].node().ReadMeta(ctx, connect.NewRequest(&placementv1.ReadMetaRequest{})); err != nil {
		t.Fatalf("NodeService with the secret: %v", err)
	}
	// And the cluster serves.
	if _, err := c.any().acquire("skew/r", "a", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
}

// A leader whose wall clock is 10 s ahead proposes nothing: it waits for
// a clock reading taken in its term to confirm its offset against a
// quorum, finds it outside the bound and hands leadership away. So while
// it leads, Acquires of locks whose 8 s leases are due within its offset
// are never granted, and once a node with a good clock leads again, a
// renewal extends a lease by its TTL from the real time, not from the
// skewed leader's (the shard's time high-water mark would otherwise
// carry the jump: max(now, last)). Before the gate, client commands were
// stamped with the skewed clock: the held locks were granted at once to
// other requesters, and shard time then stood still for 10 s.
func TestClusterSkewedLeaderStampsNothing(t *testing.T) {
	c := startProcCluster(t, map[int][]string{2: {"--debug-clock-offset", "10s"}})
	for { // node 3 knows its clock is off, and the others have read its version
		if own, ok := c.offsetOf(2, "1"); ok && own < -9 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	const ttl = 8 * time.Second
	leases := c.holdMany("skew", 20, ttl)
	terms := func() float64 {
		v, _ := c.nodes[2].metric("warden_raft_leader_changes_total")
		return v
	}
	before := terms()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Contenders for every held lock, through every node, while node 3
	// is given the shard's leadership (again and again, for 3 s).
	var granted, tried atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				for r := range leases {
					a, err := c.nodes[i].acquire(r, fmt.Sprintf("steal-%d-%d", i, k), time.Minute, 0)
					tried.Add(1)
					if err == nil {
						granted.Add(1)
						t.Errorf("%s granted to a contender (token %#x) while its lease had %v left", r, a.GetFencingToken(), time.Until(leases[r].GetExpiresAt().AsTime()))
					}
				}
			}
		})
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		_, _ = c.nodes[0].admin.TransferLeader(ctx, connect.NewRequest(&wardenv1.TransferLeaderRequest{ShardId: 1, NodeId: 3}))
		time.Sleep(200 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if terms() == before {
		t.Fatal("node 3 never became the shard's leader: the test did not exercise a skewed leader")
	}
	t.Logf("node 3 led %v terms; %d acquires of held locks tried, %d granted", terms()-before, tried.Load(), granted.Load())
	// A good clock leads again, and a renewal runs from the real time.
	for r, a := range leases {
		var d *wardenv1.DescribeResponse
		err := retryUnavailable(func() (err error) { d, err = c.nodes[0].describe(r); return err })
		if err != nil || !d.GetHeld() || d.GetFencingToken() != a.GetFencingToken() {
			t.Fatalf("%s after the skewed leader: %v %v, want held with token %#x", r, d, err, a.GetFencingToken())
		}
		if err := retryUnavailable(func() error { return c.nodes[0].renew(r, a.GetLeaseId()) }); err != nil {
			t.Fatalf("renew %s: %v", r, err)
		}
		d, err = c.nodes[0].describe(r)
		if err != nil {
			t.Fatal(err)
		}
		if late := time.Until(d.GetExpiresAt().AsTime()) - ttl; late > time.Second {
			t.Fatalf("%s renewed to expire %v past now + ttl: shard time jumped with the skewed leader's clock", r, late)
		}
	}
}
