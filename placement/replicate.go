package placement

import _ "unsafe" // for go:linkname

// maxReplicateBytes bounds the entries a leader puts in one Raft
// Replicate message (4 MiB; etcd's MaxSizePerMsg is 1 MiB, CockroachDB's
// 32 KiB). Dragonboat's bound is 64 MiB: a leader catching up a replica
// that was down for 20 s at the reference load read and encoded some
// 25 MiB of log in one message on the shard's step worker, and the shard
// answered nothing for 0.6 to 1 s after the replica restarted. With 4 MiB
// messages the catch-up is paced by the replica's acknowledgements and the
// leader's own appends; three `make loadtest` runs gave p99 acquire of
// 138, 101 and 88 ms, against a median of 177 ms over six runs without.
const maxReplicateBytes = 4 << 20

// replicateBytes is Dragonboat's bound itself: its raft package copies
// settings.Soft.MaxEntrySize at init, and the only other way to tune it is
// a dragonboat-soft-settings.json in the process's working directory. The
// link fails to build if the pinned Dragonboat renames it.
//
//go:linkname replicateBytes github.com/lni/dragonboat/v4/internal/raft.maxEntrySize
var replicateBytes uint64

// Runs after Dragonboat's packages initialise (this package imports them).
// A smaller bound set by an operator's soft-settings file is kept.
func init() { replicateBytes = min(replicateBytes, maxReplicateBytes) }
