package shard

import (
	"bytes"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// Lock events are what a watcher of a lock sees (LockService.Watch,
// ElectionService.Observe, the SDKs' pushed lease-lost signal): every
// change of a lock's holder that an applied entry made, in commit order.
// They are not replicated state. Each replica derives them, as it
// applies, from the lock records an entry writes, so every replica that
// applies an entry derives the same events for it; a replica's history
// of them begins where its state did (Open, RecoverFromSnapshot:
// Hooks.Reset) and lives in its node's memory.

// EventKind says what a LockEvent reports.
type EventKind uint8

const (
	// EventGranted: a lease was granted (to an Acquire, or to the head
	// waiter in a hand-off).
	EventGranted EventKind = iota + 1
	// EventReleased: the holder released the lease before it expired
	// (Release, or CancelWait of a request granted in a race).
	EventReleased
	// EventExpired: the entry found the lease past its expires_at (an
	// Expire, or an Acquire that found the lease over) and ended it.
	EventExpired
	// EventRevoked: an operator's RevokeLease ended the lease before it
	// expired.
	EventRevoked
)

// String is the kind's name as watchers print it.
func (k EventKind) String() string {
	switch k {
	case EventGranted:
		return "GRANTED"
	case EventReleased:
		return "RELEASED"
	case EventExpired:
		return "EXPIRED"
	case EventRevoked:
		return "REVOKED"
	}
	return "UNKNOWN"
}

// LockEvent is one change of a lock's holder. Its position is (Index,
// Seq): the Raft index of the entry that made it, and its place among
// that entry's events (from 0), so positions increase strictly in
// commit order and are the same on every replica. It carries no lease
// id: watchers tell leases apart by their fencing tokens, which are
// unique per resource (DESIGN.md §1 rule 2).
type LockEvent struct {
	Index uint64
	Seq   uint32
	Kind  EventKind
	// Resource is the lock's name.
	Resource string
	// Holder and FencingToken are the lease's, for every kind: the
	// granted one, or the one that ended.
	Holder       string
	FencingToken uint64
	// ExpiresAtUnixNano is the lease's expires_at as the entry left it
	// (for an ended lease, as it was when it ended).
	ExpiresAtUnixNano int64
	// AtUnixNano is the shard's time as the entry applied it.
	AtUnixNano int64
}

// lockEvents returns the events of one change of resource's lock record
// from old to next (either may be nil or not held) by an entry that
// applied at shard time now; revoke says the entry is a RevokeLease.
// Index and Seq are left for the caller.
func lockEvents(old, next *shardv1.LockRecord, now int64, revoke bool) []LockEvent {
	oldHeld, nextHeld := old.GetHeld(), next.GetHeld()
	same := oldHeld && nextHeld && bytes.Equal(old.GetLeaseId(), next.GetLeaseId())
	if same {
		return nil // renewed, or a record rewritten in place
	}
	var evs []LockEvent
	if oldHeld {
		kind := EventReleased
		switch {
		case now >= old.GetExpiresAtUnixNano():
			kind = EventExpired
		case revoke:
			kind = EventRevoked
		}
		evs = append(evs, LockEvent{Kind: kind, Resource: old.GetResource(), Holder: old.GetHolder(),
			FencingToken: old.GetFencingToken(), ExpiresAtUnixNano: old.GetExpiresAtUnixNano(), AtUnixNano: now})
	}
	if nextHeld {
		evs = append(evs, LockEvent{Kind: EventGranted, Resource: next.GetResource(), Holder: next.GetHolder(),
			FencingToken: next.GetFencingToken(), ExpiresAtUnixNano: next.GetExpiresAtUnixNano(), AtUnixNano: now})
	}
	return evs
}

// movesRecords reports whether env's command copies lock records in or
// out of the shard for a range move (ImportRange, ReleaseRange): no lock
// changes holder, so it has no events. A watch of a moved range follows
// it to the new shard, which reports the holders it imported as its
// current state.
func movesRecords(env *shardv1.Envelope) bool {
	return env.GetImportRange() != nil || env.GetReleaseRange() != nil
}
