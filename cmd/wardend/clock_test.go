package main

import (
	"context"
	"net/http"
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
