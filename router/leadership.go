package router

import (
	"sync"
	"time"

	"github.com/lni/dragonboat/v4/raftio"
)

// Leadership follows which shards one node leads, and keeps each term's
// leader clock. Pass it as the NodeHost's RaftEventListener.
//
// A leader stamps commands with its wall clock read once, when it took
// office, plus its monotonic clock since (DESIGN.md "Time"), so a wall
// clock step during its term moves nothing.
type Leadership struct {
	// offset is added to the wall clock (Config.ClockOffset, tests only).
	offset time.Duration
	mu     struct {
		sync.Mutex
		terms map[uint64]*leaderTerm // by shard id, only while leading
	}
}

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
}

// now is the leader's clock in Unix nanoseconds.
func (t *leaderTerm) now() int64 {
	return t.anchor.Round(0).UnixNano() + int64(t.offset) + int64(time.Since(t.anchor))
}

// NewLeadership returns an empty Leadership.
func NewLeadership() *Leadership {
	l := &Leadership{}
	l.mu.terms = map[uint64]*leaderTerm{}
	return l
}

// LeaderUpdated implements raftio.IRaftEventListener. Dragonboat calls it
// asynchronously; it must not block.
func (l *Leadership) LeaderUpdated(info raftio.LeaderInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := l.mu.terms[info.ShardID]
	if info.LeaderID != info.ReplicaID || info.LeaderID == 0 {
		delete(l.mu.terms, info.ShardID)
		return
	}
	if cur != nil && cur.term == info.Term {
		return
	}
	l.mu.terms[info.ShardID] = &leaderTerm{shardID: info.ShardID, replicaID: info.ReplicaID, term: info.Term, anchor: time.Now(), offset: l.offset}
	metrics.leaderChanges.Inc()
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
		delete(l.mu.terms, shardID)
	}
}
