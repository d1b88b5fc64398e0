package router

import (
	"testing"
	"time"

	"github.com/lni/dragonboat/v4/raftio"
)

func TestLeadershipFollowsTerms(t *testing.T) {
	l := NewLeadership()
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
