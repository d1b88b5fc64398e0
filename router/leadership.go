package router

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Leadership follows which shards one node leads, and keeps each term's
// leader clock. Pass it as the NodeHost's RaftEventListener.
//
// A leader stamps commands with its wall clock read once, when it took
// office, plus its monotonic clock since (DESIGN.md "Time"), so a wall
// clock step during its term moves nothing.
type Leadership struct {
	// offset is added to the wall clock (TestingKnobs.ClockOffset, tests only).
	offset time.Duration
	mu     struct {
		sync.Mutex
		terms map[uint64]*leaderTerm // by shard id, only while leading
		// heard is the newest leader (replica id, 0 for none) and term
		// each local replica has reported, by shard id.
		heard map[uint64]heardLeader
		// changed is closed, and replaced, at every report.
		changed chan struct{}
	}
}

// heardLeader is a leader report: replica leader (0: none known) leads
// in term.
type heardLeader struct{ leader, term uint64 }

// leaderTerm is one term of leadership of one shard.
type leaderTerm struct {
	shardID uint64
	// replicaID is this node's replica in the shard (per shard, not the
	// node's id).
	replicaID uint64
	term      uint64
	anchor    time.Time // wall and monotonic reading when the term began
	offset    time.Duration
	// confirmed is set once a linearizable read succeeded in this term,
	// proving leadership and that every entry before the term is applied.
	// Time-driven commands wait for it.
	confirmed bool
	// clockOK is set once clock readings taken in this term confirmed
	// this node's clock within the skew bound (Router.awaitClock); no
	// command is stamped with the term's clock before.
	clockOK bool
	// ended is done once the term is over here: another leader or a
	// later term reported, a step-down, or a drop. Copies share it.
	ended context.Context
	end   context.CancelFunc
}

// errTermEnded is the cause of a request's cancellation when the term
// it was sent in ended with it in flight (leaderTerm.bound).
var errTermEnded = errors.New("this node's replica stopped leading the shard with the request in flight")

// bound returns ctx, canceled with cause errTermEnded when the term
// ends. A proposal or read left on a deposed leader is answered by
// nothing once its term is over (an entry the next leader overwrote is
// never applied, and Dragonboat does not tell): without this it waited
// out ProposeTimeout, 5 s, after every leader change (a `make loadtest`
// run with a restart and no forced snapshot saw p99 acquire of 4.8 s).
// release must be called when the request is done.
func (t leaderTerm) bound(ctx context.Context) (_ context.Context, release func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	if t.ended == nil { // a term the tests built by hand
		return ctx, func() { cancel(nil) }
	}
	stop := context.AfterFunc(t.ended, func() { cancel(errTermEnded) })
	return ctx, func() { stop(); cancel(nil) }
}

// over reports whether the term has ended.
func (t leaderTerm) over() bool { return t.ended != nil && t.ended.Err() != nil }

// newTerm returns term of shardID on local replica replicaID, begun now.
func (l *Leadership) newTerm(shardID, replicaID, term uint64) *leaderTerm {
	ended, end := context.WithCancel(context.Background())
	return &leaderTerm{shardID: shardID, replicaID: replicaID, term: term, anchor: time.Now(), offset: l.offset, ended: ended, end: end}
}

// endTerm forgets shardID's term, ending it; l.mu is held.
func (l *Leadership) endTerm(shardID uint64) {
	if t := l.mu.terms[shardID]; t != nil {
		t.end()
		delete(l.mu.terms, shardID)
	}
}

// now is the leader's clock in Unix nanoseconds.
func (t *leaderTerm) now() int64 {
	return t.anchor.Round(0).UnixNano() + int64(t.offset) + int64(time.Since(t.anchor))
}

// NewLeadership returns an empty Leadership whose leader clocks run
// clockOffset ahead of the wall clock (TestingKnobs.ClockOffset;
// zero but in clock skew tests).
func NewLeadership(clockOffset time.Duration) *Leadership {
	l := &Leadership{offset: clockOffset}
	l.mu.terms = map[uint64]*leaderTerm{}
	l.mu.heard = map[uint64]heardLeader{}
	l.mu.changed = make(chan struct{})
	return l
}

// leaderUpdated records that local replica replicaID of shardID has
// learned that replica leader (0: none) leads in term, and wakes every
// waiter on changes. It must not block: the Raft host calls it from its
// event loop.
func (l *Leadership) leaderUpdated(shardID, replicaID, leader, term uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Dragonboat reports every change of leader or term, in order, a
	// leader stepping down within its term (CheckQuorum) included, so
	// the last report is the newest. One of an older term is ignored
	// whole: it must not end the newer term a later report began (the
	// routing simulation delivers reports late and out of order, and
	// found a leader that never served again when it did).
	if h, ok := l.mu.heard[shardID]; ok && term < h.term {
		return
	}
	l.mu.heard[shardID] = heardLeader{leader: leader, term: term}
	close(l.mu.changed)
	l.mu.changed = make(chan struct{})
	cur := l.mu.terms[shardID]
	if leader != replicaID || leader == 0 {
		l.endTerm(shardID)
		return
	}
	if cur != nil && cur.term == term {
		return
	}
	l.endTerm(shardID)
	l.mu.terms[shardID] = l.newTerm(shardID, replicaID, term)
	metrics.leaderChanges.Inc()
}

// changes returns a channel closed at the next leader report.
func (l *Leadership) changes() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.changed
}

// heard returns the newest leader report of shardID.
func (l *Leadership) heard(shardID uint64) (heardLeader, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.mu.heard[shardID]
	return h, ok
}

// term returns a copy of the current term if this node leads shardID.
func (l *Leadership) term(shardID uint64) (leaderTerm, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.mu.terms[shardID]
	if t == nil {
		return leaderTerm{}, false
	}
	return *t, true
}

// led returns copies of every term this node holds.
func (l *Leadership) led() []leaderTerm {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]leaderTerm, 0, len(l.mu.terms))
	for _, t := range l.mu.terms {
		out = append(out, *t)
	}
	return out
}

// confirm marks the term confirmed if it is still the current one.
func (l *Leadership) confirm(shardID, term uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.mu.terms[shardID]; t != nil && t.term == term {
		t.confirmed = true
	}
}

// clockConfirmed marks the term's clock confirmed if it is still the
// current one.
func (l *Leadership) clockConfirmed(shardID, term uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.mu.terms[shardID]; t != nil && t.term == term {
		t.clockOK = true
	}
}

// drop forgets the term if it is still the current one.
func (l *Leadership) drop(shardID, term uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.mu.terms[shardID]; t != nil && t.term == term {
		l.endTerm(shardID)
	}
}
