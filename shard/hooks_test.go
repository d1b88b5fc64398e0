package shard

import (
	"sync"
	"testing"
	"time"
)

// A replica's flushes and compactions reach Hooks.Storage with their
// durations.
func TestStorageHook(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	r := &replica{t: t, dir: t.TempDir(), shardID: FirstShard, generation: 1}
	r.sm = NewStateMachine(r.dir, Hooks{Storage: func(kind string, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if d > 0 {
			seen[kind]++
		}
	}})(FirstShard, 1).(*StateMachine)
	if _, err := r.sm.Open(nil); err != nil {
		t.Fatal(err)
	}
	defer r.sm.Close()
	for range 2 {
		fill(r)
		if err := r.sm.mu.db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.sm.mu.db.Compact([]byte{0}, []byte{0xff}, true); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen["flush"] < 2 || seen["compaction"] < 1 {
		t.Fatalf("storage events seen: %v, want two flushes and a compaction", seen)
	}
}
