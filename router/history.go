package router

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/warden-dev/warden/shard"
)

// History keeps, per shard, the latest lock events this node's replica
// applied (shard.Hooks Events and Reset; DESIGN.md §2 "Lock events"): the
// source of watches served here. Watchers pull from it at their own pace,
// so an apply never waits on a watcher; a watcher that falls further
// behind than the history holds finds its place gone (ErrHistoryGone).
// One History serves one node: give its Heard and Reset to that node's
// replicas only, since each replica of a shard reports the same events.
type History struct {
	// keep is how many events a shard's history holds at most (whole
	// entries are dropped, oldest first).
	keep int
	mu   sync.Mutex
	// shards holds the history of each shard that has a replica here.
	shards map[uint64]*shardHistory
	// opening holds, per shard not kept yet, a channel closed when its
	// replica opens (Opened).
	opening map[uint64]chan struct{}
}

// shardHistory holds every event of the entries after index floor up to
// and including index through, in position order.
type shardHistory struct {
	floor, through uint64
	events         []shard.LockEvent
	// changed is closed, and replaced, whenever through moves or the
	// history restarts.
	changed chan struct{}
}

// HistoryKeep is how many lock events a node keeps per shard: at an
// estimated 150 bytes each (an 80-byte LockEvent and the strings it
// keeps), about 150 KB a shard. A watcher whose stream was cut resumes
// without reading the state again while fewer changes came meanwhile.
const HistoryKeep = 1024

// NewHistory returns a History that keeps up to keep events per shard.
func NewHistory(keep int) *History {
	return &History{keep: max(keep, 1), shards: map[uint64]*shardHistory{}, opening: map[uint64]chan struct{}{}}
}

// ErrHistoryGone: the events after a cursor are no longer (or never
// were) in this node's history: it was trimmed past the cursor, or the
// replica's state was loaded at a later index (a restart, a snapshot).
// The watcher must read the current state again (out_of_range).
var ErrHistoryGone = errors.New("router: the events after this position are no longer kept")

// ErrNoHistory: this node keeps no history of the shard (it has no
// replica of it, or the replica has not opened yet).
var ErrNoHistory = errors.New("router: no history of this shard here")

// Has reports whether the history of shardID is kept here (its replica
// here has opened).
func (h *History) Has(shardID uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.shards[shardID] != nil
}

// Opened returns a channel closed once the history of shardID is kept
// here (its replica here has opened).
func (h *History) Opened(shardID uint64) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.opening[shardID]
	if ch == nil {
		ch = make(chan struct{})
		if h.shards[shardID] != nil {
			close(ch)
			return ch
		}
		h.opening[shardID] = ch
	}
	return ch
}

// Reset is shard.Hooks.Reset: the replica of shardID loaded its state at
// index applied, so the history restarts there, empty.
func (h *History) Reset(shardID, applied uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.shards[shardID]
	if s == nil {
		s = &shardHistory{changed: make(chan struct{})}
		h.shards[shardID] = s
		if ch := h.opening[shardID]; ch != nil {
			close(ch)
			delete(h.opening, shardID)
		}
	}
	s.floor, s.through, s.events = applied, applied, nil
	close(s.changed)
	s.changed = make(chan struct{})
}

// Close is shard.Hooks.Closed: the replica of shardID stopped (a move
// took it from this node, or the node stops), so its history is dropped
// and its watchers woken, to find ErrNoHistory.
func (h *History) Close(shardID uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.shards[shardID]; s != nil {
		close(s.changed)
		delete(h.shards, shardID)
	}
}

// Heard is shard.Hooks.Events: the replica of shardID applied the entries
// through index applied, with events evs (in position order). It drops
// the oldest entries' events past keep (and up to a quarter more). It
// never blocks on a watcher.
func (h *History) Heard(shardID, applied uint64, evs []shard.LockEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.shards[shardID]
	if s == nil || applied <= s.through {
		return // Reset comes first; a report never goes back
	}
	s.events = append(s.events, evs...)
	s.through = applied
	// Trim to keep once a quarter more has come (so each event is copied
	// a bounded number of times). The floor becomes the index of the last
	// event dropped: a cursor needing any event of that entry is refused,
	// so the rest of the entry is dropped too.
	if over := len(s.events) - h.keep; over > h.keep/4 {
		cut := s.events[over-1].Index
		i := over
		for i < len(s.events) && s.events[i].Index == cut {
			i++
		}
		s.floor = cut
		s.events = slices.Clone(s.events[i:])
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

// Cursor is a watcher's place in a shard's events: it has seen every
// event of the entries up to index Index, and of entry Index+1 those
// before seq Next (0: none of them).
type Cursor struct {
	Index uint64
	Next  uint32
}

// After returns the cursor just past event e.
func After(e shard.LockEvent) Cursor { return Cursor{Index: e.Index - 1, Next: e.Seq + 1} }

// Through returns the cursor past every event of the entries up to index.
func Through(index uint64) Cursor { return Cursor{Index: index} }

// Since returns, for shard shardID, the events after cursor c that the
// history holds (at most limit of them), the cursor past them (past every
// entry the replica applied, when they are all it holds) and a channel
// closed when more arrive. When the replica has not applied past c yet,
// it returns no events and c: wait on the channel. Errors: ErrNoHistory,
// ErrHistoryGone.
func (h *History) Since(shardID uint64, c Cursor, limit int) (evs []shard.LockEvent, next Cursor, changed <-chan struct{}, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.shards[shardID]
	if s == nil {
		return nil, c, nil, fmt.Errorf("%w: shard %d", ErrNoHistory, shardID)
	}
	// The events the cursor still needs begin in entry c.Index+1 (at
	// seq c.Next): all of that entry must be held, so c.Index >= floor.
	if c.Index < s.floor {
		return nil, c, nil, fmt.Errorf("%w: shard %d keeps the events after index %d, the cursor is at %d", ErrHistoryGone, shardID, s.floor, c.Index)
	}
	if c.Index >= s.through {
		return nil, c, s.changed, nil
	}
	i := 0
	for i < len(s.events) && (s.events[i].Index <= c.Index || s.events[i].Index == c.Index+1 && s.events[i].Seq < c.Next) {
		i++
	}
	end := min(len(s.events), i+max(limit, 1))
	evs = slices.Clone(s.events[i:end])
	if end < len(s.events) {
		return evs, After(evs[len(evs)-1]), s.changed, nil
	}
	return evs, Through(s.through), s.changed, nil
}
