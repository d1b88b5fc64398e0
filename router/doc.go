// Package router is Warden's routing core. It finds the shard that owns
// each key and the node that leads it (lookup.go), stamps commands with
// the shard leader's clock and proposes them through the leader's Raft
// host or the node that hosts the leader (Propose, Read, Forward), waits
// for a queued Acquire's grant in log order (wait.go), and runs the
// leader-driven timers: expiry of leases, forgetting of old dedup
// entries, dropping of timed-out waiters, reclaiming of expired
// reservations. The API layer, package rpc, serves the Connect services
// over it and maps its errors (ErrNoLeader, ErrOutcomeUnknown,
// *RemoteLeader, *ResultError, ...) to the wire.
//
// Timers run only on a shard's leader, and only after a linearizable read
// in the current term has confirmed leadership and that every entry before
// the term is applied (Dragonboat's leader events are asynchronous). Their
// commands name exactly what they saw, so a deposed leader's late proposal
// is a no-op at apply time.
package router
