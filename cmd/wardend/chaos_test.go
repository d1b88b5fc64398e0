package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/internal/ledgertest"
	"github.com/warden-dev/warden/keyspace"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/shard"
)

// refusal is a Reserve refused for want of room, and when it ran.
type refusal struct {
	key        string
	amount     int64
	start, end time.Time
}

// call runs f with a fresh RPC deadline, retrying with the same ids while
// the answer is unavailable.
func call(f func(ctx context.Context) error) error {
	return retryUnavailable(func() error {
		ctx, cancel := rpcCtx()
		defer cancel()
		return f(ctx)
	})
}

// ledgerOf reads pool's whole ledger, page by page.
func (c *procCluster) ledgerOf(pool string) ([]*wardenv1.LedgerEvent, []*wardenv1.LedgerCheckpoint) {
	c.t.Helper()
	var events []*wardenv1.LedgerEvent
	var checkpoints []*wardenv1.LedgerCheckpoint
	for after := uint64(0); ; {
		var resp *wardenv1.ListLedgerResponse
		if err := call(func(ctx context.Context) error {
			r, err := c.any().quota().ListLedger(ctx, connect.NewRequest(&wardenv1.ListLedgerRequest{Key: pool, AfterSeq: after, Limit: 1000}))
			if err == nil {
				resp = r.Msg
			}
			return err
		}); err != nil {
			c.t.Fatalf("ledger of %s: %v", pool, err)
		}
		if after == 0 {
			checkpoints = resp.GetCheckpoints()
		}
		events = append(events, resp.GetEvents()...)
		if len(resp.GetEvents()) < 1000 {
			return events, checkpoints
		}
		after = resp.GetEvents()[len(resp.GetEvents())-1].GetSeq()
	}
}

// totals queries every key's own level: committed and reserved.
func (c *procCluster) totals(keys []string) map[string][2]int64 {
	c.t.Helper()
	out := map[string][2]int64{}
	for _, k := range keys {
		if err := call(func(ctx context.Context) error {
			resp, err := c.any().quota().Query(ctx, connect.NewRequest(&wardenv1.QueryRequest{Key: k}))
			if err == nil {
				lv := resp.Msg.GetLevels()[len(resp.Msg.GetLevels())-1]
				out[k] = [2]int64{lv.GetCommitted(), lv.GetReserved()}
			}
			return err
		}); err != nil {
			c.t.Fatalf("query %s: %v", k, err)
		}
	}
	return out
}

// Case Q14 on three processes: counters equal the ledger everywhere,
// after chaos. Workers reserve, commit (in part), release, let expire,
// report corrections and change limits on pool/tenant/project keys of
// four pools, two on each side of a split, while the cluster goes
// through a SIGKILL and restart, a 3 s SIGSTOP of a leader, a leader
// transfer, a follower left behind a log compaction (it catches up by a
// snapshot), the split, and at the end a full restart. Then, for every
// key at every level, Query equals the totals rebuilt from ListLedger;
// every replica of each shard holds the same state; nothing changes
// across the full restart; and every refusal for want of room had a
// level without room in the ledger while it ran. make test runs it for
// about 30 s; WARDEN_SOAK=1 (make soak) repeats the chaos for ten
// minutes, as the case has it.
func TestClusterCaseQ14CountersEqualTheLedger(t *testing.T) {
	t.Parallel()
	rounds := 1
	if os.Getenv("WARDEN_SOAK") != "" {
		rounds = 20 // about 30 s each
	}
	c := startProcCluster(t)
	const at = uint64(1) << 63
	var pools []string
	for i, low, high := 0, 0, 0; low+high < 4; i++ {
		p := fmt.Sprintf("q14pool%d", i)
		switch h := keyspace.Hash(p); {
		case h < at && low < 2:
			low++
			pools = append(pools, p)
		case h >= at && high < 2:
			high++
			pools = append(pools, p)
		}
	}
	var keys, projects []string
	for _, p := range pools {
		keys = append(keys, p)
		for _, tn := range []string{"ta", "tb"} {
			keys = append(keys, p+"/"+tn)
			for _, pr := range []string{"p1", "p2"} {
				projects = append(projects, p+"/"+tn+"/"+pr)
			}
		}
	}
	keys = append(keys, projects...)
	setLimit := func(k string, limit int64) error {
		return call(func(ctx context.Context) error {
			_, err := c.any().quota().SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: k, Limit: limit}))
			return err
		})
	}
	// Limits on pools and projects only: tenants are not limited, so no
	// level has limited siblings under a limited parent, and every refusal
	// is for want of room (LIMIT), which the ledger can show.
	for _, p := range pools {
		if err := setLimit(p, 400); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range projects {
		if err := setLimit(k, 100); err != nil {
			t.Fatal(err)
		}
	}

	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		refused  []refusal
		errs     []error
		ops      atomic.Int64
		reported atomic.Int64
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for w := range 6 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 14))
			for n := 0; !stop.Load(); n++ {
				k := projects[rng.IntN(len(projects))]
				id := fmt.Sprintf("w%d-%d", w, n)
				amount := int64(1 + rng.IntN(5))
				ops.Add(1)
				switch r := rng.IntN(100); {
				case r < 3:
					if err := setLimit(k, int64(80+rng.IntN(41))); err != nil {
						fail(fmt.Errorf("set limit %s: %v", k, err))
					}
					continue
				case r < 8:
					var seq uint64
					if err := call(func(ctx context.Context) error {
						q, err := c.any().quota().Query(ctx, connect.NewRequest(&wardenv1.QueryRequest{Key: k}))
						if err == nil {
							seq = q.Msg.GetLedgerSeq()
						}
						return err
					}); err != nil {
						fail(fmt.Errorf("query %s: %v", k, err))
						continue
					}
					observed := int64(rng.IntN(10))
					if err := call(func(ctx context.Context) error {
						_, err := c.any().quota().ReportUsage(ctx, connect.NewRequest(&wardenv1.ReportUsageRequest{Key: k, Observed: observed, ReportId: id, Correct: true, ObservedSeq: &seq}))
						return err
					}); err != nil {
						fail(fmt.Errorf("report %s: %v", k, err))
					}
					reported.Add(1)
					continue
				}
				start := time.Now()
				ttl := durationpb.New(time.Duration(1+rng.IntN(3)) * time.Second) // a retry repeats it
				err := call(func(ctx context.Context) error {
					_, err := c.any().quota().Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: k, Amount: amount, ReservationId: id, Ttl: ttl}))
					return err
				})
				if connect.CodeOf(err) == connect.CodeResourceExhausted {
					mu.Lock()
					refused = append(refused, refusal{k, amount, start, time.Now()})
					mu.Unlock()
					continue
				}
				if err != nil {
					fail(fmt.Errorf("reserve %s %s: %v", k, id, err))
					continue
				}
				switch r, part := rng.IntN(10), 1+rng.Int64N(amount); {
				case r < 4:
					err = call(func(ctx context.Context) error {
						_, err := c.any().quota().Commit(ctx, connect.NewRequest(&wardenv1.CommitRequest{Key: k, ReservationId: id, Amount: part}))
						return err
					})
				case r < 7:
					err = call(func(ctx context.Context) error {
						_, err := c.any().quota().Release(ctx, connect.NewRequest(&wardenv1.QuotaServiceReleaseRequest{Key: k, ReservationId: id}))
						return err
					})
				}
				// A reservation that expired first (a pause, an election) is
				// refused its commit: that is its answer, not a fault.
				if err != nil && connect.CodeOf(err) != connect.CodeFailedPrecondition {
					fail(fmt.Errorf("end of %s %s: %v", k, id, err))
				}
			}
		})
	}
	step := func(d time.Duration) { time.Sleep(d) }
	for round := range rounds {
		step(3 * time.Second)
		if round == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_, err := c.any().admin.SplitShard(ctx, connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: c.shardOf(pools[0]).GetId(), SplitAt: at}))
			cancel()
			if err != nil {
				t.Fatalf("split: %v", err)
			}
		}
		victim := rand.IntN(3)
		c.kill(victim)
		step(2 * time.Second)
		c.start(victim)
		c.waitServing(victim)
		paused := c.leaderIndex(pools[rand.IntN(len(pools))])
		c.nodes[paused].up.Store(false)
		_ = c.nodes[paused].cmd.Process.Signal(syscall.SIGSTOP)
		step(3 * time.Second)
		_ = c.nodes[paused].cmd.Process.Signal(syscall.SIGCONT)
		c.nodes[paused].up.Store(true)
		s := c.shardOf(pools[rand.IntN(len(pools))])
		to := s.GetReplicas()[rand.IntN(len(s.GetReplicas()))].GetNodeId()
		if err := call(func(ctx context.Context) error {
			_, err := c.any().admin.TransferLeader(ctx, connect.NewRequest(&wardenv1.TransferLeaderRequest{ShardId: s.GetId(), NodeId: to}))
			return err
		}); err != nil {
			t.Fatalf("transfer shard %d to node %d: %v", s.GetId(), to, err)
		}
		behind := c.notLeader(pools[0])
		c.kill(behind)
		step(2 * time.Second)
		for _, sh := range c.checkShards() {
			if err := call(func(ctx context.Context) error {
				_, err := c.any().admin.Snapshot(ctx, connect.NewRequest(&wardenv1.SnapshotRequest{ShardId: sh.GetId()}))
				return err
			}); err != nil {
				t.Fatalf("snapshot of shard %d: %v", sh.GetId(), err)
			}
		}
		c.start(behind)
		c.waitServing(behind)
		c.waitSnapshotInstalled(behind)
	}
	step(2 * time.Second)
	stop.Store(true)
	wg.Wait()
	for _, err := range errs[:min(len(errs), 10)] {
		t.Error(err)
	}
	time.Sleep(4 * time.Second) // every reservation's ttl (at most 3 s) passes

	// Query equals the ledger, at every level.
	before := c.totals(keys)
	var events int
	for _, p := range pools {
		evs, cps := c.ledgerOf(p)
		events += len(evs)
		l := ledgertest.New(t, evs, cps...)
		now := time.Now()
		for _, k := range keys {
			if !shard.Under(k, p) {
				continue
			}
			if got, want := before[k], [2]int64{l.Committed[k], l.Reserved(k, now)}; got != want {
				t.Fatalf("%s: Query says committed, reserved = %v; the ledger replays to %v", k, got, want)
			}
		}
		// Every refusal had a level without room while it ran (at its
		// start, its end, or an event between).
		for _, r := range refused {
			if shard.Under(r.key, p) && !noRoom(t, evs, cps, r) {
				t.Fatalf("Reserve(%s, %d) was refused between %v and %v, but the ledger shows room on every level", r.key, r.amount, r.start.Format(time.StampMilli), r.end.Format(time.StampMilli))
			}
		}
	}
	// Every replica agrees; nothing changes across the full restart.
	ids := c.replicasAgree()
	for i := range c.nodes {
		c.start(i)
	}
	for i := range c.nodes {
		c.waitServing(i)
	}
	after := c.totals(keys)
	for _, k := range keys {
		if after[k] != before[k] {
			t.Fatalf("%s across the full restart: %v, then %v", k, before[k], after[k])
		}
	}
	t.Logf("%d operations (%d corrections), %d refused for want of room, %d ledger events over %d pools on %d shards; replicas agree, the restart changed nothing",
		ops.Load(), reported.Load(), len(refused), events, len(pools), len(ids))
}

// noRoom reports whether, by the ledger, some limited level on r's path
// lacked room for r's amount at r's start, its end, or an event between.
func noRoom(t *testing.T, events []*wardenv1.LedgerEvent, cps []*wardenv1.LedgerCheckpoint, r refusal) bool {
	instants := []time.Time{r.start, r.end}
	for _, e := range events {
		if at := e.GetAt().AsTime(); at.After(r.start) && at.Before(r.end) {
			instants = append(instants, at)
		}
	}
	for _, when := range instants {
		var upTo []*wardenv1.LedgerEvent
		for _, e := range events {
			if !e.GetAt().AsTime().After(when) {
				upTo = append(upTo, e)
			}
		}
		l := ledgertest.New(t, upTo, cps...)
		for _, lv := range shard.Levels(r.key) {
			if lim, ok := l.Limits[lv]; ok && l.Committed[lv]+l.Reserved(lv, when)+r.amount > lim {
				return true
			}
		}
	}
	return false
}
