package main

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

func (n *node) quota() wardenv1connect.QuotaServiceClient {
	return wardenv1connect.NewQuotaServiceClient(http.DefaultClient, "http://"+n.listen)
}

// Case Q1: two routers, one last unit. limit(ns)=5 with 4 committed;
// R(ns,1,a) through node 1 and R(ns,1,b) through node 2 at once: exactly
// one succeeds with remaining 0, the other is resource_exhausted naming
// ns, and Query shows committed 4, reserved 1. Then, with two nodes
// down, reserves fail closed: unavailable, not exhausted.
func TestClusterQuotaLastUnit(t *testing.T) {
	c := startProcCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q1, q2 := c.nodes[0].quota(), c.nodes[1].quota()
	if _, err := q1.SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: "ns", Limit: 5})); err != nil {
		t.Fatal(err)
	}
	if _, err := q2.Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: "ns", Amount: 4, ReservationId: "base"})); err != nil {
		t.Fatal(err)
	}
	if _, err := q1.Commit(ctx, connect.NewRequest(&wardenv1.CommitRequest{Key: "ns", ReservationId: "base"})); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([]error, 2)
	remaining := make([]int64, 2)
	for i, q := range []wardenv1connect.QuotaServiceClient{q1, q2} {
		wg.Go(func() {
			resp, err := q.Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: "ns", Amount: 1, ReservationId: []string{"a", "b"}[i]}))
			results[i] = err
			if err == nil {
				remaining[i] = resp.Msg.GetRemaining()
			}
		})
	}
	wg.Wait()
	ok := 0
	for i, err := range results {
		var ce *connect.Error
		switch {
		case err == nil:
			ok++
			if remaining[i] != 0 {
				t.Fatalf("the winner has remaining %d, want 0", remaining[i])
			}
		case connect.CodeOf(err) != connect.CodeResourceExhausted || !errors.As(err, &ce):
			t.Fatalf("the loser: %v, want resource_exhausted", err)
		default:
			for _, d := range ce.Details() {
				if v, derr := d.Value(); derr == nil {
					if qe, isQE := v.(*wardenv1.QuotaExhausted); isQE && qe.GetLevel() != "ns" {
						t.Fatalf("the refusal names %q, want ns", qe.GetLevel())
					}
				}
			}
		}
	}
	if ok != 1 {
		t.Fatalf("%d of the two reserves for the last unit succeeded: %v", ok, results)
	}
	resp, err := c.nodes[2].quota().Query(ctx, connect.NewRequest(&wardenv1.QueryRequest{Key: "ns"}))
	if err != nil || resp.Msg.GetLevels()[0].GetCommitted() != 4 || resp.Msg.GetLevels()[0].GetReserved() != 1 {
		t.Fatalf("query: %v %v", resp, err)
	}

	c.kill(1)
	c.kill(2)
	rctx, rcancel := context.WithTimeout(ctx, 8*time.Second)
	defer rcancel()
	_, err = q1.Reserve(rctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: "ns", Amount: 1, ReservationId: "minority"}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("reserve without quorum: %v, want unavailable (fail closed)", err)
	}
}
