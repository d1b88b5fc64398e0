// Package placement decides where shards live and moves them.
//
// The placement group is a Raft group of its own (MetaShardID), hosted by
// the cluster's initial members. Its state (ApplyMeta, pure like the data
// shards' apply) holds the hash ranges of the 64-bit xxhash space each
// data shard owns, the map generation, each shard's epoch and replicas
// (node, zone), the registered nodes, id allocators that never reuse a
// shard, replica or operator id, the fencing-token epoch limit, and the
// operators in progress. CheckMap states the map's invariant: the ranges
// cover the space exactly once, each owned by an active shard.
//
// Around it:
//
//   - Allocator hands out epochs from windows reserved a compare-and-set
//     at a time (as TiKV PD's timestamp oracle persists a window ahead),
//     so epochs never repeat across placement leader changes.
//   - Operators splits a shard and moves replicas. Every step is recorded
//     in the placement group after it is done in the shards, and is
//     idempotent, so a new placement leader resumes an interrupted
//     operator, or rolls it back before its point of no return.
//   - Agent starts and stops a node's replicas to match the map
//     (Dragonboat cannot create a group from inside a state machine).
//   - PlanRebalance evens out replicas within zones and leaders across
//     nodes.
//
// Zones: a shard's replicas are in distinct zones; a move stays in one.
package placement
