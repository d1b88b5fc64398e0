//go:build linux

package nemesis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/internal/ledgertest"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// The quota workload: a client per node reserving 1-3 units of a small
// pool, then committing or releasing each reservation. Committed usage
// never returns, so every phase of the run gets a fresh pool (pool<n>,
// poolLimit units), which the suite creates before it injects the fault.

const (
	poolLimit  = 24
	reserveTTL = 2 * time.Second
)

// qop is one recorded quota call.
type qop struct {
	client       int
	node         int
	kind         string // reserve, commit, release
	pool, id     string // the key and the reservation id
	amount       int64
	invoke, done time.Time
	outcome      string
	code         connect.Code
	expires      time.Time // reserve: the server's expires_at
	released     bool      // release: the answer
}

// pools is the suite's pools: the current one, and all of them.
type pools struct {
	current atomic.Pointer[string]
	all     []string
}

// quotaClient is node i's quota client.
func (w *workload) quotaClient(id, i int, rng *rand.Rand) {
	for n := 0; !w.stopped(); n++ {
		w.pause(time.Duration(30+rng.IntN(70)) * time.Millisecond)
		pool := w.pools.current.Load()
		if pool == nil {
			continue
		}
		rid := fmt.Sprintf("q%d-%d", id, n)
		amount := int64(1 + rng.IntN(3))
		r := w.quotaCall(qop{client: id, node: i, kind: "reserve", pool: *pool, id: rid, amount: amount})
		if r.outcome != okOutcome {
			continue
		}
		w.pause(time.Duration(rng.IntN(500)) * time.Millisecond)
		kind := "commit"
		if rng.IntN(2) == 0 {
			kind = "release"
		}
		w.quotaCall(qop{client: id, node: i, kind: kind, pool: *pool, id: rid, amount: amount})
	}
}

// quotaCall makes the call o describes, records it and returns it.
func (w *workload) quotaCall(o qop) qop {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	q := w.c.nodes[o.node].quota
	o.invoke = time.Now()
	var err error
	switch o.kind {
	case "reserve":
		var resp *connect.Response[wardenv1.ReserveResponse]
		resp, err = q.Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: o.pool, Amount: o.amount, ReservationId: o.id, Ttl: durationpb.New(reserveTTL)}))
		if err == nil {
			o.expires = resp.Msg.GetExpiresAt().AsTime()
		}
	case "commit":
		_, err = q.Commit(ctx, connect.NewRequest(&wardenv1.CommitRequest{Key: o.pool, ReservationId: o.id, Amount: o.amount}))
	case "release":
		var resp *connect.Response[wardenv1.QuotaServiceReleaseResponse]
		resp, err = q.Release(ctx, connect.NewRequest(&wardenv1.QuotaServiceReleaseRequest{Key: o.pool, ReservationId: o.id}))
		if err == nil {
			o.released = resp.Msg.GetReleased()
		}
	}
	o.done = time.Now()
	var cls op
	classify(&cls, err)
	o.outcome, o.code = cls.outcome, cls.code
	w.hist.addQuota(o)
	return o
}

// checkPool holds one pool's quota history to rule 7: at no moment does
// the usage the history proves exceed limit. Proven at t: every commit
// acknowledged before t (committed usage never returns), and every
// reservation acknowledged before t that was certainly live at t: no
// Commit or Release of it invoked by t, and its expires_at − margin
// after t.
func checkPool(ops []qop, pool string, limit int64, margin time.Duration) []violation {
	var reserves, commits []qop
	endOf := map[string]time.Time{} // reservation id → its first Commit or Release invoked
	for _, o := range ops {
		if o.pool != pool {
			continue
		}
		switch {
		case o.kind == "reserve" && o.outcome == okOutcome:
			reserves = append(reserves, o)
		case o.kind == "commit" || o.kind == "release":
			if e, ok := endOf[o.id]; !ok || o.invoke.Before(e) {
				endOf[o.id] = o.invoke
			}
			if o.kind == "commit" && o.outcome == okOutcome {
				commits = append(commits, o)
			}
		}
	}
	// The proven usage can only rise at a reserve's or a commit's
	// completion: check it there.
	var moments []time.Time
	for _, o := range append(append([]qop(nil), reserves...), commits...) {
		moments = append(moments, o.done)
	}
	sort.Slice(moments, func(a, b int) bool { return moments[a].Before(moments[b]) })
	var out []violation
	for _, t := range moments {
		var used int64
		var parts []string
		for _, c := range commits {
			if !c.done.After(t) {
				used += c.amount
				parts = append(parts, fmt.Sprintf("commit %s %d", c.id, c.amount))
			}
		}
		for _, r := range reserves {
			if e, ok := endOf[r.id]; !r.done.After(t) && (!ok || e.After(t)) && t.Before(r.expires.Add(-margin)) {
				used += r.amount
				parts = append(parts, fmt.Sprintf("reserve %s %d", r.id, r.amount))
			}
		}
		if used > limit {
			out = append(out, violation{"quota", t, fmt.Sprintf("%s: %d units in use at %s over its limit %d: %s", pool, used, stamp(t), limit, strings.Join(parts, ", "))})
			break // one proof per pool is enough
		}
	}
	return out
}

// checkLedger reads every pool's ledger and counters once the run is
// over, through node i, and holds them to the history: the ledger
// replays without going over a limit (ledgertest), its committed total
// equals the Query counter, every acknowledged Reserve and Commit is in
// it once, and no acknowledged Release is followed by its Commit.
func (s *suite) checkLedger(i int) []violation {
	t := s.t
	var out []violation
	q := s.c.nodes[i].quota
	ops := s.w.hist.quotaSnapshot()
	for _, pool := range s.w.pools.all {
		var events []*wardenv1.LedgerEvent
		var checkpoints []*wardenv1.LedgerCheckpoint
		for after := uint64(0); ; {
			var resp *connect.Response[wardenv1.ListLedgerResponse]
			err := retry(func(ctx context.Context) (err error) {
				resp, err = q.ListLedger(ctx, connect.NewRequest(&wardenv1.ListLedgerRequest{Key: pool, AfterSeq: after, Limit: 1000}))
				return err
			})
			if err != nil {
				t.Fatalf("ledger of %s: %v", pool, err)
			}
			if after == 0 {
				checkpoints = resp.Msg.GetCheckpoints()
			}
			events = append(events, resp.Msg.GetEvents()...)
			if len(resp.Msg.GetEvents()) < 1000 {
				break
			}
			after = events[len(events)-1].GetSeq()
		}
		l := ledgertest.New(t, events, checkpoints...)
		var query *connect.Response[wardenv1.QueryResponse]
		if err := retry(func(ctx context.Context) (err error) {
			query, err = q.Query(ctx, connect.NewRequest(&wardenv1.QueryRequest{Key: pool, Consistency: wardenv1.Consistency_CONSISTENCY_LINEARIZABLE}))
			return err
		}); err != nil {
			t.Fatalf("query %s: %v", pool, err)
		}
		for _, lv := range query.Msg.GetLevels() {
			if lv.GetKey() == pool && lv.GetCommitted() != l.Committed[pool] {
				out = append(out, violation{"ledger", time.Now(), fmt.Sprintf("%s: Query says %d committed, the ledger %d", pool, lv.GetCommitted(), l.Committed[pool])})
			}
		}
		for _, o := range ops {
			if o.pool != pool {
				continue
			}
			id := ledgertest.ID(o.pool, o.id)
			switch {
			case o.kind == "reserve" && o.outcome == okOutcome && l.Reserves[id] != 1:
				out = append(out, violation{"ledger", o.done, fmt.Sprintf("%s: acknowledged reservation %s has %d RESERVE events", pool, o.id, l.Reserves[id])})
			case o.kind == "commit" && o.outcome == okOutcome && l.Commits[id] != 1:
				out = append(out, violation{"ledger", o.done, fmt.Sprintf("%s: acknowledged commit of %s has %d COMMIT events", pool, o.id, l.Commits[id])})
			case o.kind == "release" && o.outcome == okOutcome && o.released && l.Commits[id] != 0:
				out = append(out, violation{"ledger", o.done, fmt.Sprintf("%s: reservation %s was committed after its release was acknowledged", pool, o.id)})
			}
		}
	}
	return out
}

// newPool creates the next pool (with poolLimit) through a node that
// answers, and makes it the workload's.
func (s *suite) newPool() {
	name := fmt.Sprintf("pool%d", len(s.w.pools.all)+1)
	err := retry(func(ctx context.Context) error {
		_, err := s.c.nodes[s.rng.IntN(3)].quota.SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: name, Limit: poolLimit}))
		return err
	})
	if err != nil {
		s.t.Fatalf("set the limit of %s: %v", name, err)
	}
	s.w.pools.all = append(s.w.pools.all, name)
	s.w.pools.current.Store(&name)
}

// retry calls f, each time with a fresh deadline, until it succeeds or
// 30 s have passed.
func retry(f func(ctx context.Context) error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := f(ctx)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}
