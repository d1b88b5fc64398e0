package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// TestClusterThroughput measures acquire+release pairs per second (64
// clients, spread over the three nodes, closed loop) on a three-process
// cluster with one data shard, reserve+commit pairs on a three-level
// quota tree, then acquire+release again after splitting the shard. It
// runs only under make bench (WARDEN_BENCH=1): timing is a measurement,
// never an assertion. With WARDEN_BENCH_SECURE=1 the cluster serves TLS
// with authentication on, and the clients call as the admin token (the
// cost of TLS and authentication beside the plain run).
func TestClusterThroughput(t *testing.T) {
	t.Parallel()
	if os.Getenv("WARDEN_BENCH") == "" {
		t.Skip("a measurement: run with make bench (WARDEN_BENCH=1)")
	}
	var c *procCluster
	if os.Getenv("WARDEN_BENCH_SECURE") != "" {
		c = newSecureCluster(t).procCluster
		c.boot()
	} else {
		c = startProcCluster(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// op runs one acquire+release pair, or one reserve+commit pair.
	type opFunc func(n *node, label string, cl, i int) error
	lockPair := func(n *node, label string, cl, i int) error {
		r := fmt.Sprintf("bench-%s-%d-%d", label, cl, i%100)
		a, err := n.acquire(r, fmt.Sprintf("%s-%d-%d", label, cl, i), 30*time.Second, 0)
		if err == nil {
			_, err = n.release(r, a.GetLeaseId())
		}
		return err
	}
	quotaPair := func(n *node, label string, cl, i int) error {
		q := n.quota()
		key := fmt.Sprintf("bench/t%d/p%d", cl%8, cl)
		id := fmt.Sprintf("%s-%d-%d", label, cl, i)
		if _, err := q.Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: key, Amount: 1, ReservationId: id})); err != nil {
			return err
		}
		_, err := q.Commit(ctx, connect.NewRequest(&wardenv1.CommitRequest{Key: key, ReservationId: id}))
		return err
	}
	measure := func(label string, op opFunc) {
		const clients, d = 64, 10 * time.Second
		var mu sync.Mutex
		var lat []time.Duration
		var errs int
		var wg sync.WaitGroup
		end := time.Now().Add(d)
		for cl := range clients {
			n := c.nodes[cl%3]
			wg.Go(func() {
				for i := 0; time.Now().Before(end); i++ {
					start := time.Now()
					err := op(n, label, cl, i)
					mu.Lock()
					if err != nil {
						errs++
					} else {
						lat = append(lat, time.Since(start))
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		slices.Sort(lat)
		p := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))] }
		t.Logf("%s: %.0f pairs/s, p50 %v, p99 %v, %d errors (64 clients, %v)",
			label, float64(len(lat))/d.Seconds(), p(0.5).Round(100*time.Microsecond), p(0.99).Round(100*time.Microsecond), errs, d)
	}
	measure("acquire+release, one shard", lockPair)
	if _, err := c.nodes[0].quota().SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: "bench", Limit: 1 << 40})); err != nil {
		t.Fatal(err)
	}
	measure("reserve+commit, one shard", quotaPair)
	if _, err := c.nodes[0].admin.SplitShard(ctx, connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: 1})); err != nil {
		t.Fatal(err)
	}
	// Spread the two leaders over two nodes, as Rebalance would.
	if _, err := c.nodes[0].admin.Rebalance(ctx, connect.NewRequest(&wardenv1.RebalanceRequest{})); err != nil {
		t.Fatal(err)
	}
	measure("acquire+release, two shards", lockPair)
}
