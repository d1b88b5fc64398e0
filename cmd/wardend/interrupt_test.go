package main

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// A split interrupted by SIGKILLing the node that drives it (the
// placement leader), at several moments: after the node restarts, the
// next placement leader has completed it or rolled it back, the shards'
// ranges cover the hash space exactly once, no lock was lost, and tokens
// keep increasing.
func TestClusterInterruptedSplit(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	leases := c.holdMany("kept", 300, 5*time.Minute)
	for _, delay := range []time.Duration{0, 40 * time.Millisecond, 120 * time.Millisecond, 300 * time.Millisecond} {
		before := len(c.checkShards())
		var nodes *connect.Response[wardenv1.ListNodesResponse]
		err := retryUnavailable(func() (err error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			nodes, err = c.any().admin.ListNodes(ctx, connect.NewRequest(&wardenv1.ListNodesRequest{}))
			return err
		})
		if err != nil || nodes.Msg.GetPlacementLeaderId() == 0 {
			t.Fatalf("placement leader: %v %v", nodes, err)
		}
		driver := int(nodes.Msg.GetPlacementLeaderId() - 1)
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := c.nodes[driver].admin.SplitShard(ctx, connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: 1}))
			done <- err
		}()
		time.Sleep(delay)
		c.kill(driver)
		err = <-done
		c.start(driver)
		for i := range c.nodes {
			c.waitServing(i)
		}
		// Wait for the new placement leader to finish the operator.
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := c.any().shards()
			pending := err != nil
			for _, s := range resp.GetShards() {
				pending = pending || s.GetState() != "active"
			}
			if !pending {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the interrupted split did not finish: %v %v", resp, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		after := len(c.checkShards())
		t.Logf("killed the driver after %v (split answered %v): %d shards → %d", delay, err, before, after)
		if after != before && after != before+1 {
			t.Fatalf("%d shards before, %d after", before, after)
		}
		c.checkLeases(leases)
	}
	c.checkNextTokens(leases)
}
