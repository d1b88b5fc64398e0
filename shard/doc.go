// Package shard is Warden's replicated state machine: one data shard's
// locks, dedup entries and config, stored in Pebble and driven by
// Dragonboat as an IOnDiskStateMachine.
//
// # The contract
//
// A caller (the router) and the state machine keep these duties:
//
//  1. Every command travels in a versioned Envelope carrying the command
//     version, the target shard, the placement generation the router used
//     and the proposing leader's clock (now). A replica refuses to apply a
//     version newer than CommandVersion by stopping (Update returns
//     ErrUnsupportedVersion) rather than diverge from newer replicas:
//     upgrade every replica before proposing a new version.
//  2. Apply is pure. It reads state through a Reader and returns a Result
//     and a list of Changes; it reads no clock, draws no random numbers and
//     does no I/O. Lease ids are drawn by the router and carried in the
//     command. So every replica that applies the same log reaches the same
//     state.
//  3. Time comes only from commands. The shard's time is the largest now
//     applied so far: max(now, last applied now), so it never runs
//     backwards, whichever leader stamped it.
//  4. A refused or invalid command is a Result with a non-OK code and no
//     changes (beyond the shard's time). Update returns an error only for
//     failures that must stop the replica: storage errors, corrupt records,
//     an unsupported version.
//  5. The Raft index of the last applied entry is written in the same
//     Pebble batch as the entries' changes, so Open returns an index that
//     matches the state exactly. Batches are written without fsync; Sync
//     makes them durable, and Dragonboat replays whatever a crash lost.
//
// # Leases and time (DESIGN.md §1 rule 6)
//
// A lease is valid while the shard's time is before expires_at; Renew
// sets expires_at = now + lease TTL. The lock can be granted to another
// lease only once the shard's time reaches expires_at + max_clock_skew.
// Leaders' clocks differ by less than max_clock_skew, so the new grant
// happens after the old expiry on every clock. expires_at is stored
// state, so a leader change neither shortens nor resets a lease.
//
// Expire commands are proposed by the leader's timer; each names the
// lease and the expiry it saw and applies only if that lease is still
// current, unchanged, and past expires_at + max_clock_skew. A deposed or
// paused leader's late proposal is therefore a no-op (etcd #12528, #15247).
//
// # Fencing tokens (DESIGN.md §1 rule 2)
//
// A token is Token(epoch, revision): the shard's epoch in the high bits and
// its revision, increased by every grant, in the low bits (see token.go).
// Each lock record keeps its last token and a grant asserts the new token
// is greater; the assertion failing refuses the grant with CODE_INTERNAL.
// Because the revision belongs to the shard, forgetting an idle lock
// record cannot make a later token smaller.
//
// # Idempotency (DESIGN.md §1 rules 5 and 8)
//
// An Acquire's request_id is remembered with the lease it got. A retry with
// the same resource, lease TTL and holder returns that lease (with its
// current expiry) while it is current, and CODE_FAILED_PRECONDITION once
// it has ended; other parameters are CODE_INVALID_ARGUMENT. Entries are
// forgotten one dedup window after their lease ended.
//
// # Wait queues (DESIGN.md §3, §5)
//
// An Acquire with a wait timeout on a held lock is queued: a waiter record
// per request, numbered in commit order, carrying the lease id it will get
// and its deadline. Whatever command ends the current lease (Release,
// Expire, CancelWait, or an Acquire that finds the lease over) grants the
// head waiter in that same command — dropping waiters past their deadline
// on the way — and reports the hand-off in Result.granted and
// Result.dropped, which an ApplyObserver passes on to the waiting RPCs. A
// free lock never has waiters, and a newcomer never jumps the queue.
// CancelWait removes an abandoned waiter, or releases the lease it was
// granted in a race, but only for the request's latest attempt, so a live
// retry keeps its place. Queue bounds come from the shard config.
//
// # Moving a hash range (DESIGN.md §2 "Placement and routing")
//
// A shard owns one contiguous hash range at a map generation; a command
// for a key outside it answers CODE_WRONG_SHARD with the range, and one
// routed by an older generation CODE_WRONG_SHARD too, so the router
// refreshes its map. A placement operator moves the upper (or lower) part
// of a range to a new shard: FenceRange (the moving keys answer
// CODE_UNAVAILABLE, retryably, and the leader's timers skip them, so the
// records stay exactly as exported), ImportRange into the new shard,
// which starts inactive and owns nothing, ActivateRange with a fresh epoch
// from the placement allocator (so its tokens exceed every token the
// source granted) and a time no earlier than the source's, then
// ReleaseRange in the source once the map is committed. Each step is
// idempotent; see move.go.
//
// # Storage
//
// See keys.go for the key layout: every record a hash range owns lies
// under 'r' + the key's hash, so splits can move one contiguous span.
// RecoverFromSnapshot builds a new Pebble directory and switches to it
// with an atomic rename of the CURRENT file.
package shard
