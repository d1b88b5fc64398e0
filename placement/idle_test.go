package placement

import (
	"context"
	"testing"
	"time"
)

// A replica's log is compacted once its shard idles, never while it is
// busy, and not for a few entries: three nodes host the placement group
// with a snapshot by count out of reach. While proposals come without a
// pause, the log grows past twice the keep and no replica compacts it;
// once they stop, every replica compacts it to the keep
// (CompactionOverhead, below idleCompactionKeep here); as many entries
// again, then a pause, leave it alone.
func TestIdleLogsCompacted(t *testing.T) {
	const (
		interval = 100 * time.Millisecond
		overhead = 10
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g := startMetaGroup(t, ctx, NodeConfig{SnapshotEntries: 1_000_000, CompactionOverhead: overhead, IdleCompaction: interval})
	logRange := func(id uint64) (first, last uint64) {
		lr, err := g.nodes[id].NodeHost().GetLogReader(MetaShardID)
		if err != nil {
			t.Fatal(err)
		}
		return lr.GetRange()
	}
	// Each Next after a Discard reserves a new window: one entry.
	alloc := NewAllocator(g.nodes[1].Meta())
	propose := func() {
		for {
			_, err := alloc.Next(ctx)
			alloc.Discard()
			if err == nil {
				return
			}
			if ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond) // the first election
		}
	}
	firsts := map[uint64]uint64{}
	for id := range g.nodes {
		firsts[id], _ = logRange(id)
	}
	busy := time.Now()
	for {
		propose()
		first, last := logRange(1)
		if first != firsts[1] {
			t.Fatalf("node 1 compacted its log to index %d while proposals came", first-1)
		}
		if last+1-first > 4*overhead && time.Since(busy) > 10*interval {
			t.Logf("busy for %v: %d entries", time.Since(busy).Round(time.Millisecond), last+1-first)
			break
		}
	}
	for id := range g.nodes {
		if first, _ := logRange(id); first != firsts[id] {
			t.Fatalf("node %d compacted its log to index %d while proposals came", id, first-1)
		}
	}
	for id := range g.nodes {
		for {
			first, last := logRange(id)
			if n := last + 1 - first; n <= overhead {
				if n != overhead {
					t.Fatalf("node %d kept %d entries of its idle log, want %d", id, n, overhead)
				}
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("node %d: %d entries in the idle replica's log, want ≤ %d", id, last+1-first, overhead)
			}
			time.Sleep(interval / 4)
		}
	}
	for range overhead {
		propose()
	}
	time.Sleep(10 * interval) // real time must pass: ten looks at an idle log too short to compact
	for id := range g.nodes {
		if first, last := logRange(id); last+1-first < 2*overhead {
			t.Fatalf("node %d compacted an idle log of %d entries: %d left", id, 2*overhead, last+1-first)
		}
	}
}
