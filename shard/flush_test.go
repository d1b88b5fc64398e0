package shard

import (
	"bytes"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble"
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

// A flushed memtable's write-ahead log is deleted, not kept for reuse
// (noRecycleCleaner).
func TestObsoleteLogsDeleted(t *testing.T) {
	dir, db := openTempDB(t)
	for i := range 5 {
		if err := db.Set([]byte{'k', byte(i)}, make([]byte, 1<<10), pebble.NoSync); err != nil {
			t.Fatal(err)
		}
		if err := db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if logs, _ := filepath.Glob(filepath.Join(dir, "*.log")); len(logs) != 1 {
		t.Fatalf("write-ahead logs after 5 flushes: %v, want the live one", logs)
	}
}

// A compaction (StateMachine.compact, which Update schedules once the
// records have shrunk: valueCache.compactDue) leaves a database whose
// records were all deleted with next to nothing in its tables.
func TestCompactReclaimsDeleted(t *testing.T) {
	r := newReplica(t)
	now := int64(1_700_000_000) * second
	const n = compactAfterDeletes / 2 // a lock and a dedup record each
	for i := range n {
		res := fmt.Sprintf("burst/%06d", i)
		r.propose(now, acquireCmd(res, fmt.Sprintf("req-%d", i), second, "w", leaseID(fmt.Sprint(i))))
	}
	tables := func() int64 {
		r.sm.mu.RLock()
		defer r.sm.mu.RUnlock()
		if err := r.sm.mu.db.Flush(); err != nil {
			t.Fatal(err)
		}
		m := r.sm.mu.db.Metrics()
		return m.Total().Size
	}
	full := tables()
	// Expire every lease and forget every record, as the leader's sweeps
	// would after the dedup window.
	later := now + 3600*second
	for {
		ex, err := r.sm.upd.expired(later, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(ex.GetItems()) == 0 {
			break
		}
		r.propose(later, expireCmd(ex.GetItems()...))
	}
	later += 3600 * second // past the dedup window
	for {
		f, err := r.sm.upd.forgettable(later, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(f.GetIdleLocks())+len(f.GetDedup()) == 0 {
			break
		}
		r.propose(later, forgetCmd(f))
	}
	if !r.sm.compactPending.Load() {
		t.Fatal("no compaction scheduled after every record was forgotten")
	}
	r.sm.compact()
	if after := tables(); after > full/20 {
		t.Fatalf("tables hold %d bytes after compaction, %d before the forgetting: want under 5 %%", after, full)
	}
	// The compaction flushed the memtable at the index every replica
	// reached: the next Update staggers the flushes again.
	r.sm.flushAt = 0
	r.propose(later, acquireCmd("after", "req-after", second, "w", leaseID("after")))
	if want := staggerFlush(r.sm.replicaID); want == 0 || r.sm.flushAt != want {
		t.Fatalf("flush point after the compaction %d, want the stagger's %d", r.sm.flushAt, want)
	}
}

// A replica's write-ahead log takes the disk its writes take, not the
// 70 MiB that Pebble would reserve ahead of them (unreservedLogs).
func TestLogNotReserved(t *testing.T) {
	dir, db := openTempDB(t)
	for i := range 64 {
		if err := db.Set([]byte{'k', byte(i)}, make([]byte, 1<<10), pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.LogData(nil, pebble.Sync); err != nil { // the writes reach the file
		t.Fatal(err)
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	if len(logs) != 1 {
		t.Fatalf("write-ahead logs: %v, want one", logs)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(logs[0], &st); err != nil {
		t.Fatal(err)
	}
	// 64 KiB written; st_blocks counts 512-byte units, reserved ones too.
	if allocated := st.Blocks * 512; allocated > 1<<20 {
		t.Fatalf("the log has %d bytes allocated for %d written, want no reservation", allocated, st.Size)
	}
}

// openTempDB opens a replica's database (openDB) in a new temporary
// directory, closed at the test's end.
func openTempDB(t *testing.T) (string, *pebble.DB) {
	t.Helper()
	dir := t.TempDir()
	db, err := openDB(dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return dir, db
}
