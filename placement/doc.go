// Package placement decides where shards live: the hash ranges of the
// 64-bit xxhash space each data shard owns, and the nodes (Dragonboat
// NodeHosts, one per availability zone) that host their replicas.
//
// This first version has one data shard owning the whole hash range, with
// one replica on each of three nodes. The placement Raft group, epoch
// allocator and split/move operators build on the same types.
package placement
