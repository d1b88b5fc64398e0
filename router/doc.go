// Package router serves Warden's Connect API. It validates requests,
// finds the shard that owns each key, stamps commands with the shard
// leader's clock and proposes them through the leader's NodeHost, maps
// results to Connect error codes in one place (errors.go), and runs the
// leader-driven timers: expiry of leases and forgetting of old dedup
// entries.
//
// Timers run only on a shard's leader, and only after a linearizable read
// in the current term has confirmed leadership and that every entry before
// the term is applied (Dragonboat's leader events are asynchronous). Their
// commands name exactly what they saw, so a deposed leader's late proposal
// is a no-op at apply time.
package router
