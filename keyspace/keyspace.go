// Package keyspace is the rule that places keys in Warden's shards, for
// every part that needs it: the shards themselves, the routers, the load
// harness and clients that route by key. A lock's resource is placed by
// the 64-bit xxhash of its name; a quota key by that of its pool, the
// first segment of the key, so a quota tree always lives in one shard.
// Shards own contiguous ranges [start, end) of the hash space, end 0
// meaning 2^64.
//
// It imports nothing of Warden's: a leaf that anything may import.
package keyspace

import (
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Hash is where key falls in the hash space: the 64-bit xxhash of its
// bytes.
func Hash(key string) uint64 { return xxhash.Sum64String(key) }

// Pool is a quota key's pool: its first segment ("team-a" of
// "team-a/batch/gpu"), by which the whole tree is placed.
func Pool(key string) string {
	if i := strings.IndexByte(key, '/'); i >= 0 {
		return key[:i]
	}
	return key
}

// Contains reports whether hash h is in the range [start, end), end 0
// meaning 2^64.
func Contains(start, end, h uint64) bool { return h >= start && (end == 0 || h < end) }
