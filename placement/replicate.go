package placement

import _ "unsafe" // for go:linkname

// maxReplicateBytes bounds the entries a leader puts in one Raft
// Replicate message (1 MiB, as etcd's MaxSizePerMsg; CockroachDB's is
// 32 KiB). Dragonboat's bound is 64 MiB. A leader reads the entries of a
// lagging replica from its log database on the shard's step worker, and
// sends no heartbeat meanwhile:
//   - at 64 MiB, catching up a replica that was down for 20 s at the
//     reference load read some 25 MiB in one message, and the shard
//     answered nothing for 0.6 to 1 s;
//   - at 4 MiB (2026-12-04), goroutine dumps still showed the step worker
//     in log reads for 0.6 s on end, 2 s after the restart. The other
//     follower's election timeout (200 ms) ran out, and it took over the
//     shard in every one of three `make loadtest` runs with a restart and
//     no forced snapshot (max acquire 0.9 to 1.2 s);
//   - at 1 MiB, the same three runs saw no leader change, with max acquire
//     190 to 393 ms.
const maxReplicateBytes = 1 << 20

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
