package router

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4/raftio"
	"github.com/prometheus/client_golang/prometheus/testutil"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

func TestLeadershipFollowsTerms(t *testing.T) {
	l := NewLeadership(0)
	l.LeaderUpdated(raftio.LeaderInfo{ShardID: 1, ReplicaID: 2, LeaderID: 3, Term: 4})
	if _, ok := l.term(1); ok {
		t.Fatal("leads a shard another replica leads")
	}
	l.LeaderUpdated(raftio.LeaderInfo{ShardID: 1, ReplicaID: 2, LeaderID: 2, Term: 5})
	t5, ok := l.term(1)
	if !ok || t5.term != 5 || t5.confirmed {
		t.Fatalf("term %+v, %v: want term 5, not yet confirmed", t5, ok)
	}
	// A repeated event for the same term keeps the clock's anchor.
	l.LeaderUpdated(raftio.LeaderInfo{ShardID: 1, ReplicaID: 2, LeaderID: 2, Term: 5})
	if again, _ := l.term(1); !again.anchor.Equal(t5.anchor) {
		t.Fatal("the same term re-anchored its clock")
	}
	l.confirm(1, 4) // an old term's confirmation does not count
	if got, _ := l.term(1); got.confirmed {
		t.Fatal("confirmed by a stale term")
	}
	l.confirm(1, 5)
	if got, _ := l.term(1); !got.confirmed {
		t.Fatal("not confirmed")
	}
	// A new term must be confirmed again before timers run.
	l.LeaderUpdated(raftio.LeaderInfo{ShardID: 1, ReplicaID: 2, LeaderID: 2, Term: 7})
	if got, _ := l.term(1); got.term != 7 || got.confirmed {
		t.Fatalf("new term %+v", got)
	}
	l.LeaderUpdated(raftio.LeaderInfo{ShardID: 1, ReplicaID: 2, LeaderID: 0, Term: 8})
	if _, ok := l.term(1); ok {
		t.Fatal("still leading with no leader known")
	}
}

// The leader clock is the wall clock at takeover plus the monotonic time
// since: it advances with real time and never runs backwards.
func TestLeaderClockIsAnchored(t *testing.T) {
	anchor := time.Now()
	lt := leaderTerm{anchor: anchor}
	a := lt.now()
	time.Sleep(10 * time.Millisecond)
	b := lt.now()
	if b-a < int64(10*time.Millisecond) || a < anchor.UnixNano() {
		t.Fatalf("clock read %d then %d from anchor %d", a, b, anchor.UnixNano())
	}
}

// A GetLeaderID answer that lags the LeaderUpdated event keeps the term:
// dropping it there lost the term for good (seen in CI as a leader that
// answered "no leader" for its whole term after a restart). Only a
// stopped replica, a later term or another leader ends it.
func TestDeposedOnlyByALaterView(t *testing.T) {
	cur := leaderTerm{shardID: 1, replicaID: 2, term: 5}
	for _, c := range []struct {
		name     string
		id, term uint64
		valid    bool
		err      error
		want     bool
	}{
		{name: "view of the previous term", id: 3, term: 4, valid: true},
		{name: "view of an election in an earlier term", term: 4},
		{name: "view of this term's election", term: 5},
		{name: "view of this term", id: 2, term: 5, valid: true},
		{name: "another leader in this term", id: 3, term: 5, valid: true, want: true},
		{name: "a later term's election", term: 6, want: true},
		{name: "a later term, led here again", id: 2, term: 6, valid: true, want: true},
		{name: "replica stopped", err: errors.New("shard not found"), want: true},
	} {
		if got := deposed(cur, c.id, c.term, c.valid, c.err); got != c.want {
			t.Errorf("%s: deposed = %v, want %v", c.name, got, c.want)
		}
	}
}

// A request whose deadline passes while the router retries a refusal that
// is worth retrying (a busy or starting shard, a moving range) ends with
// the deadline's error (deadline_exceeded to a client: rpc's errors test), as one whose deadline was too short to propose: the
// caller's deadline decides (CI once saw unavailable for a 1 ms deadline).
func TestRetriesEndWithTheCallersDeadline(t *testing.T) {
	r := &Router{cfg: Config{LeaderWait: time.Minute, MoveWait: time.Minute}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	err := r.retryDropped(ctx, func() error { return fmt.Errorf("%w (%w): busy", ErrNoLeader, ErrDropped) })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dropped until the deadline: %v, want the deadline's error (deadline_exceeded to a client)", err)
	}
	// Within retryMoved's first pause (20 ms), before it refreshes the map.
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	_, err = r.retryMoved(ctx, "k", func() (*shardv1.Result, error) {
		return &shardv1.Result{Code: shardv1.Code_CODE_WRONG_SHARD, Reason: "moved"}, nil
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("moved until the deadline: %v, want the deadline's error (deadline_exceeded to a client)", err)
	}
}

// The leader timer's passes after expiry: each reads its own candidates
// and turns a non-empty answer (only) into its command; the reclaimer
// also reports how far behind it is.
func TestLeaderTasks(t *testing.T) {
	scan := &shardv1.ScanQuery{Limit: 7}
	want := []struct {
		name    string
		query   func(*shardv1.Query) bool
		some    *shardv1.QueryResult
		command func(*shardv1.Envelope) bool
	}{
		{"drop waiters", func(q *shardv1.Query) bool { return q.GetTimedOut() == scan },
			&shardv1.QueryResult{Drop: &shardv1.DropWaitersCmd{Items: []*shardv1.WaiterRef{{}}}},
			func(e *shardv1.Envelope) bool { return e.GetDropWaiters() != nil }},
		{"forget", func(q *shardv1.Query) bool { return q.GetForgettable() == scan },
			&shardv1.QueryResult{Forget: &shardv1.ForgetCmd{Dedup: []*shardv1.DedupRef{{}}}},
			func(e *shardv1.Envelope) bool { return e.GetForget() != nil }},
		{"reclaim", func(q *shardv1.Query) bool { return q.GetReclaimable() == scan },
			&shardv1.QueryResult{Reclaim: &shardv1.ReclaimCmd{Items: []*shardv1.ReservationRef{{ExpiresAtUnixNano: 1e9}}}},
			func(e *shardv1.Envelope) bool { return e.GetReclaim() != nil }},
		{"compact ledger", func(q *shardv1.Query) bool { return q.GetCompactable() == scan },
			&shardv1.QueryResult{Compact: &shardv1.CompactLedgerCmd{Items: []*shardv1.PoolSeq{{}}}},
			func(e *shardv1.Envelope) bool { return e.GetCompactLedger() != nil }},
	}
	if len(leaderTasks) != len(want) {
		t.Fatalf("%d leader tasks, want %d", len(leaderTasks), len(want))
	}
	for i, w := range want {
		task := leaderTasks[i]
		if task.name != w.name {
			t.Fatalf("task %d is %q, want %q", i, task.name, w.name)
		}
		if q := task.query(5e9, scan); !w.query(q) || q.GetNowUnixNano() != 5e9 {
			t.Errorf("%s reads %v", task.name, q)
		}
		if env := task.command(5e9, &shardv1.QueryResult{}); env != nil {
			t.Errorf("%s proposes %v with no candidates", task.name, env)
		}
		if env := task.command(5e9, w.some); env == nil || !w.command(env) {
			t.Errorf("%s proposes %v for its candidates", task.name, env)
		}
	}
	if lag := testutil.ToFloat64(metrics.reclaimLag); lag != 4 {
		t.Errorf("reclaim lag %v s, want 4 (now 5 s, the oldest expired at 1 s)", lag)
	}
}

// A node is unresponsive, and the calls forwarded to it are given up,
// only once it has failed peerDownAfter clock readings in a row: one
// failed reading may be a pause of a busy node, and a waiting Acquire
// given up on it would leave its place in the queue (issue 41's review).
func TestUnresponsiveAfterMissedReadings(t *testing.T) {
	r := &Router{}
	r.clock.missed = map[uint64]int{}
	for missed, want := range map[int]bool{0: false, 1: false, peerDownAfter: true, peerDownAfter + 1: true} {
		r.clock.missed[3] = missed
		if got := r.Unresponsive(3); got != want {
			t.Errorf("%d readings missed: unresponsive %v, want %v", missed, got, want)
		}
	}
	if peerDownAfter < 2 {
		t.Fatalf("peerDownAfter %d: one missed reading would give up a call", peerDownAfter)
	}
}
