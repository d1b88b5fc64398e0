package rpc_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/internal/ledgertest"
	"github.com/warden-dev/warden/keyspace"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/server"
)

// untilKnown retries a quota call while its outcome is unknown
// (unavailable: a leader change, no quorum yet), with the same ids.
func untilKnown[T any](f func() (T, error)) (T, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, err := f()
		if connect.CodeOf(err) != connect.CodeUnavailable || time.Now().After(deadline) {
			return v, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The oversell test: 200 concurrent reservers against small limits on
// three levels, random amounts, retries of unknown outcomes with the same
// reservation id, commits and releases, with the shard's leader replica
// stopped in the middle and restarted. Replaying the ledger shows that no
// reserve ever took a level over its limit, that every acknowledged
// reserve and commit happened exactly once, and that the replayed totals
// equal what Query reports for every level.
func TestQuotaNeverOversells(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	quota := wardenv1connect.NewQuotaServiceClient(c.srv.Client(), c.srv.URL)
	checkNeverOversold(t, quota, func() {
		// The leader's replica stops in the middle of the traffic, then
		// returns.
		time.Sleep(300 * time.Millisecond)
		lead := c.leader()
		c.stopReplica(lead)
		time.Sleep(1500 * time.Millisecond)
		c.startReplica(lead)
	})
}

// checkNeverOversold runs the oversell test's reservers through quota
// while disturb runs, then replays the ledger and checks it against what
// was acknowledged and what Query reports.
func checkNeverOversold(t *testing.T, quota wardenv1connect.QuotaServiceClient, disturb func()) {
	setLimit := func(key string, limit int64) {
		if _, err := untilKnown(func() (*connect.Response[wardenv1.SetLimitResponse], error) {
			return quota.SetLimit(ctx(t), connect.NewRequest(&wardenv1.SetLimitRequest{Key: key, Limit: limit}))
		}); err != nil {
			t.Fatal(err)
		}
	}
	setLimit("o", 300)
	var keys []string
	for i := range 4 {
		setLimit(fmt.Sprintf("o/t%d", i), 120)
		for j := range 3 {
			k := fmt.Sprintf("o/t%d/p%d", i, j)
			setLimit(k, 50)
			keys = append(keys, k)
		}
	}
	var mu sync.Mutex
	acked := map[string]string{} // key NUL id → "reserved", "committed", "released"
	var wg sync.WaitGroup
	for w := range 200 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for n := range 4 {
				key := keys[rng.IntN(len(keys))]
				id := fmt.Sprintf("w%d-%d", w, n)
				amount := 1 + rng.Int64N(12) // a retry sends the same
				cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := untilKnown(func() (*connect.Response[wardenv1.ReserveResponse], error) {
					return quota.Reserve(cctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: key, Amount: amount, ReservationId: id, Ttl: durationpb.New(time.Minute)}))
				})
				if err != nil {
					cancel()
					if connect.CodeOf(err) != connect.CodeResourceExhausted {
						t.Errorf("reserve %s: %v", id, err)
					}
					continue
				}
				state := "reserved"
				switch rng.IntN(3) {
				case 0:
					if _, err := untilKnown(func() (*connect.Response[wardenv1.CommitResponse], error) {
						return quota.Commit(cctx, connect.NewRequest(&wardenv1.CommitRequest{Key: key, ReservationId: id}))
					}); err != nil {
						t.Errorf("commit %s: %v", id, err)
					}
					state = "committed"
				case 1:
					if _, err := untilKnown(func() (*connect.Response[wardenv1.QuotaServiceReleaseResponse], error) {
						return quota.Release(cctx, connect.NewRequest(&wardenv1.QuotaServiceReleaseRequest{Key: key, ReservationId: id}))
					}); err != nil {
						t.Errorf("release %s: %v", id, err)
					}
					state = "released"
				}
				cancel()
				mu.Lock()
				acked[key+"\x00"+id] = state
				mu.Unlock()
			}
		})
	}
	disturb()
	wg.Wait()

	var events []*wardenv1.LedgerEvent
	for {
		resp, err := untilKnown(func() (*connect.Response[wardenv1.ListLedgerResponse], error) {
			return quota.ListLedger(ctx(t), connect.NewRequest(&wardenv1.ListLedgerRequest{Key: "o", AfterSeq: uint64(len(events)), Limit: 1000}))
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Msg.GetEvents()) == 0 {
			break
		}
		events = append(events, resp.Msg.GetEvents()...)
	}
	l := ledgertest.New(t, events)
	for id, state := range acked {
		if l.Reserves[id] != 1 || (state == "committed") != (l.Commits[id] == 1) || l.Commits[id] > 1 {
			t.Fatalf("%q acknowledged %s: %d reserve and %d commit events", id, state, l.Reserves[id], l.Commits[id])
		}
	}
	query := func(key string) (*connect.Response[wardenv1.QueryResponse], error) {
		return untilKnown(func() (*connect.Response[wardenv1.QueryResponse], error) {
			return quota.Query(ctx(t), connect.NewRequest(&wardenv1.QueryRequest{Key: key}))
		})
	}
	resp, err := query("o")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range append([]string{"o", "o/t0", "o/t3"}, keys...) {
		q, err := query(k)
		if err != nil {
			t.Fatal(err)
		}
		lv := q.Msg.GetLevels()[len(q.Msg.GetLevels())-1]
		if want := l.Reserved(k, time.Now()); lv.GetCommitted() != l.Committed[k] || lv.GetReserved() != want {
			t.Fatalf("%s: committed %d reserved %d; the ledger replays to %d, %d", k, lv.GetCommitted(), lv.GetReserved(), l.Committed[k], want)
		}
	}
	t.Logf("%d ledger events; pool o: committed %d, reserved %d of 300; %d acknowledged reservations",
		len(events), resp.Msg.GetLevels()[0].GetCommitted(), resp.Msg.GetLevels()[0].GetReserved(), len(acked))
}

// Case Q7: restarts never hand out a fresh budget. limit(k)=10, 4
// reserved and committed; every replica restarts in turn (with a
// snapshot and a leader change on the way); then R(k,7) is exhausted
// with remaining 6 and R(k,6) succeeds, and the ledger has no gap.
func TestQuotaSurvivesRestarts(t *testing.T) {
	c := startCluster(t, server.DevConfig{SnapshotEntries: 20, CompactionOverhead: 5})
	quota := wardenv1connect.NewQuotaServiceClient(c.srv.Client(), c.srv.URL)
	if _, err := quota.SetLimit(ctx(t), connect.NewRequest(&wardenv1.SetLimitRequest{Key: "k", Limit: 10})); err != nil {
		t.Fatal(err)
	}
	if _, err := quota.Reserve(ctx(t), connect.NewRequest(&wardenv1.ReserveRequest{Key: "k", Amount: 4, ReservationId: "r"})); err != nil {
		t.Fatal(err)
	}
	if _, err := quota.Commit(ctx(t), connect.NewRequest(&wardenv1.CommitRequest{Key: "k", ReservationId: "r"})); err != nil {
		t.Fatal(err)
	}
	for i := range server.DevNodes {
		// Enough traffic for snapshots and log compaction on the way.
		for n := range 30 {
			if _, err := untilKnown(func() (*connect.Response[wardenv1.SetLimitResponse], error) {
				return quota.SetLimit(ctx(t), connect.NewRequest(&wardenv1.SetLimitRequest{Key: fmt.Sprintf("other/%d", n%3), Limit: int64(n)}))
			}); err != nil {
				t.Fatal(err)
			}
		}
		c.stopReplica(i)
		c.startReplica(i)
	}
	c.restart() // and the whole cluster
	quota = wardenv1connect.NewQuotaServiceClient(c.srv.Client(), c.srv.URL)
	_, err := untilKnown(func() (*connect.Response[wardenv1.ReserveResponse], error) {
		return quota.Reserve(ctx(t), connect.NewRequest(&wardenv1.ReserveRequest{Key: "k", Amount: 7, ReservationId: "r1"}))
	})
	var ce *connect.Error
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !errors.As(err, &ce) || detail[*wardenv1.QuotaExhausted](t, ce).GetRemaining() != 6 {
		t.Fatalf("R(k,7) after restarts: %v", err)
	}
	if _, err := quota.Reserve(ctx(t), connect.NewRequest(&wardenv1.ReserveRequest{Key: "k", Amount: 6, ReservationId: "r2"})); err != nil {
		t.Fatalf("R(k,6): %v", err)
	}
	resp, err := quota.ListLedger(ctx(t), connect.NewRequest(&wardenv1.ListLedgerRequest{Key: "k", Limit: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	ledgertest.New(t, resp.Msg.GetEvents()) // checks the sequence has no gap
	if n := len(resp.Msg.GetEvents()); n != 4 {
		t.Fatalf("ledger of k: %d events, want SET_LIMIT, RESERVE, COMMIT, RESERVE", n)
	}
}

// A split of the shard holding a pool under reserve traffic: no
// reservation is lost (each acknowledged one commits after the split),
// the ledger has no gap, and the limit holds.
func TestQuotaThroughSplit(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	quota := wardenv1connect.NewQuotaServiceClient(c.srv.Client(), c.srv.URL)
	admin := wardenv1connect.NewAdminServiceClient(c.srv.Client(), c.srv.URL)
	pools := []string{"alpha", "beta", "gamma", "delta", "epsilon", "zeta"}
	for _, p := range pools {
		if _, err := quota.SetLimit(ctx(t), connect.NewRequest(&wardenv1.SetLimitRequest{Key: p, Limit: 100})); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var held []*wardenv1.ReserveRequest
	var wg sync.WaitGroup
	stop := make(chan struct{})
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer halt() // when the test fails early too
	for w := range 4 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				req := &wardenv1.ReserveRequest{Key: pools[(w+n)%len(pools)] + "/job", Amount: 1, ReservationId: fmt.Sprintf("w%d-%d", w, n)}
				_, err := untilKnown(func() (*connect.Response[wardenv1.ReserveResponse], error) {
					return quota.Reserve(ctx(t), connect.NewRequest(req))
				})
				switch {
				case err == nil:
					mu.Lock()
					held = append(held, req)
					mu.Unlock()
				case connect.CodeOf(err) != connect.CodeResourceExhausted:
					t.Errorf("reserve: %v", err)
					return
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := admin.SplitShard(ctx(t), connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: 1})); err != nil {
		t.Fatalf("split: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	halt()
	for _, r := range held {
		if _, err := untilKnown(func() (*connect.Response[wardenv1.CommitResponse], error) {
			return quota.Commit(ctx(t), connect.NewRequest(&wardenv1.CommitRequest{Key: r.GetKey(), ReservationId: r.GetReservationId()}))
		}); err != nil {
			t.Fatalf("commit %s after the split: %v", r.GetReservationId(), err)
		}
	}
	moved := 0
	for _, p := range pools {
		resp, err := quota.ListLedger(ctx(t), connect.NewRequest(&wardenv1.ListLedgerRequest{Key: p, Limit: 1000}))
		if err != nil {
			t.Fatal(err)
		}
		l := ledgertest.New(t, resp.Msg.GetEvents())
		if l.Committed[p] > 100 {
			t.Fatalf("%s committed %d of 100", p, l.Committed[p])
		}
		if keyspace.Hash(p) >= 1<<63 {
			moved++
		}
	}
	t.Logf("%d reservations committed across the split; %d of %d pools moved", len(held), moved, len(pools))
}
