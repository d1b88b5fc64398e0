package shard

import (
	"bytes"
	"fmt"
	"testing"
	"time"
)

// The replicas of a shard flush their first memtable at different points
// (staggerFlush), so their later flushes do not coincide; the early flush
// happens once per database.
func TestStaggeredFlush(t *testing.T) {
	seen := map[uint64]bool{}
	for id := uint64(1); id <= 3; id++ {
		at := staggerFlush(id)
		if seen[at] || at >= memTableSize {
			t.Fatalf("replica %d flushes early at %d bytes; offsets so far %v", id, at, seen)
		}
		seen[at] = true
	}
	r := newReplica(t)
	if r.sm.flushAt != staggerFlush(1) {
		t.Fatalf("opened with flushAt %d, want %d", r.sm.flushAt, staggerFlush(1))
	}
	r.sm.flushAt = 4 << 10 // a third of a memtable's worth takes long to write
	flushes := func() int64 {
		r.sm.mu.RLock()
		defer r.sm.mu.RUnlock()
		return r.sm.mu.db.Metrics().Flush.Count
	}
	acquire := func(i int) {
		r.propose(int64(i+1)*second, acquireCmd(fmt.Sprintf("r%d", i), fmt.Sprintf("q%d", i), 60*second, "h", leaseID(fmt.Sprintf("l%d", i))))
	}
	i := 0
	for ; r.sm.written < 4<<10; i++ {
		acquire(i)
	}
	waitFlushes := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for flushes() < want && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := flushes(); got != want {
			t.Fatalf("%d flushes after %d bytes written, want %d", got, r.sm.written, want)
		}
	}
	waitFlushes(1)
	for end := i + 2*i; i < end; i++ {
		acquire(i)
	}
	time.Sleep(200 * time.Millisecond) // time for a second flush, were one started
	waitFlushes(1)

	// A database loaded from a snapshot is not flushed early.
	r.sm.flushAt = 1
	if err := r.sm.RecoverFromSnapshot(bytes.NewReader(snapshotOf(t, r)), nil); err != nil {
		t.Fatal(err)
	}
	if r.sm.flushAt != 0 {
		t.Fatalf("recovered database flushes early after %d bytes", r.sm.flushAt)
	}
}
