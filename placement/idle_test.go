package placement

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// A replica's log is compacted once its shard idles, never while it is
// busy, and not for a few entries: three nodes host the placement group
// with a snapshot by count out of reach. While proposals come without a
// pause, the log grows past twice the keep and no replica compacts it;
// once they stop, every replica compacts it to the keep
// (CompactionOverhead, below idleCompactionKeep here); as many entries
// again, then a pause, leave it alone. Restarted from the compacted log,
// the group has lost nothing: its next epoch is above every one before.
func TestIdleLogsCompacted(t *testing.T) {
	const (
		interval = 200 * time.Millisecond
		overhead = 10
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g := startMetaGroup(t, ctx, NodeConfig{SnapshotEntries: 1_000_000, CompactionOverhead: overhead, IdleCompaction: interval})
	logRange := func(id uint64) (first, last uint64) { return g.logRange(id, MetaShardID) }
	// Each Next after a Discard reserves a new window: one entry.
	alloc := NewAllocator(g.nodes[1].Meta())
	var epoch uint64 // the last one handed out
	propose := func() {
		for {
			e, err := alloc.Next(ctx)
			alloc.Discard()
			if err == nil {
				epoch = e
				return
			}
			if ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond) // the first election
		}
	}
	// Busy means no pause between entries that a look could see: a pause
	// of half an interval or more (a slow fsync under load) lets the
	// replicas compact, so the busy phase starts over two looks later.
	firsts := map[uint64]uint64{}
	var busy, grace time.Time
	for prev := time.Now(); ; prev = time.Now() {
		propose()
		now := time.Now()
		if gap := now.Sub(prev); gap >= interval/2 && !busy.IsZero() {
			t.Logf("a pause of %v between entries; the busy phase starts over", gap.Round(time.Millisecond))
			busy = time.Time{}
		}
		if busy.IsZero() {
			busy, grace = now.Add(2*interval), now.Add(2*interval)
		}
		if now.Before(grace) {
			for id := range g.nodes {
				firsts[id], _ = logRange(id)
			}
			continue
		}
		first, last := logRange(1)
		if first != firsts[1] {
			t.Fatalf("node 1 compacted its log to index %d while proposals came", first-1)
		}
		if last+1-first > 4*overhead && now.Sub(busy) > 10*interval {
			t.Logf("busy for %v: %d entries", now.Sub(busy).Round(time.Millisecond), last+1-first)
			break
		}
	}
	for id := range g.nodes {
		if first, _ := logRange(id); first != firsts[id] {
			t.Fatalf("node %d compacted its log to index %d while proposals came", id, first-1)
		}
	}
	for id := range g.nodes {
		g.awaitCompacted(ctx, id, MetaShardID, overhead, interval/4)
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
	for id := range g.nodes {
		g.nodes[id].Close()
		delete(g.nodes, id)
	}
	for id := range g.members {
		g.start(id)
	}
	before := epoch
	alloc = NewAllocator(g.nodes[1].Meta())
	propose()
	if epoch <= before {
		t.Fatalf("after a restart from compacted logs, epoch %d after %d", epoch, before)
	}
}

// A replica that was down while its shard's log was compacted for
// idleness catches up by a snapshot of the on-disk state machine: data
// shard 100 runs on three nodes; node 3 stops, the others apply more
// entries than twice the keep and, idle, compact their logs past what
// node 3 has; restarted, node 3 is sent a snapshot (saved on a live
// node, recovered on node 3) and reaches the others' last index.
func TestIdleCompactionCatchUp(t *testing.T) {
	const (
		interval = 100 * time.Millisecond
		overhead = 10
		shardID  = 100
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var saved, recovered atomic.Int32
	observe := func(kind string, _ time.Duration) {
		if kind == "save" {
			saved.Add(1)
		} else {
			recovered.Add(1)
		}
	}
	g := startMetaGroup(t, ctx, NodeConfig{SnapshotEntries: 1_000_000, CompactionOverhead: overhead, IdleCompaction: interval, OnSnapshot: observe})
	s := &placementv1.Shard{Id: shardID}
	for id := range g.members {
		s.Replicas = append(s.Replicas, &placementv1.Replica{NodeId: id, ReplicaId: id})
	}
	startData := func(id uint64) {
		if err := g.nodes[id].StartDataShard(s, g.members); err != nil {
			t.Fatal(err)
		}
	}
	for id := range g.members {
		startData(id)
	}
	// An envelope without a command is applied as a refused one: an entry.
	cmd, err := shard.EncodeCommand(&shardv1.Envelope{Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	propose := func(n int) {
		nh := g.nodes[1].NodeHost()
		for i := 0; i < n; {
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := nh.SyncPropose(pctx, nh.GetNoOPSession(shardID), cmd)
			pcancel()
			if err == nil {
				i++
				continue
			}
			if ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond) // the first election, or the one after node 3 stopped
		}
	}
	logRange := func(id uint64) (first, last uint64) { return g.logRange(id, shardID) }
	propose(5)
	g.nodes[3].Close()
	delete(g.nodes, 3)
	propose(4 * overhead)
	var last uint64
	for _, id := range []uint64{1, 2} {
		last = g.awaitCompacted(ctx, id, shardID, overhead, interval/4)
	}
	if saved.Load() != 0 || recovered.Load() != 0 {
		t.Fatalf("a snapshot was streamed before node 3 restarted (%d saved, %d recovered)", saved.Load(), recovered.Load())
	}
	g.start(3)
	startData(3)
	for {
		if _, l := logRange(3); l >= last && recovered.Load() > 0 {
			break
		}
		if ctx.Err() != nil {
			_, l := logRange(3)
			t.Fatalf("node 3 reached index %d of %d (%d snapshots saved, %d recovered)", l, last, saved.Load(), recovered.Load())
		}
		time.Sleep(interval / 4)
	}
	t.Logf("node 3 caught up to index %d by a snapshot (%d saved, %d recovered)", last, saved.Load(), recovered.Load())
}

// logRange is the first and the last index of node id's log of shardID.
func (g *metaGroup) logRange(id, shardID uint64) (first, last uint64) {
	lr, err := g.nodes[id].NodeHost().GetLogReader(shardID)
	if err != nil {
		g.t.Fatal(err)
	}
	return lr.GetRange()
}

// awaitCompacted waits, polling every poll until ctx ends, for node id's
// log of shardID to hold at most keep entries, fails the test unless it
// holds exactly keep (the idle snapshot's compaction), and returns the
// log's last index.
func (g *metaGroup) awaitCompacted(ctx context.Context, id, shardID, keep uint64, poll time.Duration) uint64 {
	for {
		first, last := g.logRange(id, shardID)
		if n := last + 1 - first; n <= keep {
			if n != keep {
				g.t.Fatalf("node %d kept %d entries of its idle log, want %d", id, n, keep)
			}
			return last
		}
		if ctx.Err() != nil {
			g.t.Fatalf("node %d: %d entries in the idle replica's log, want ≤ %d", id, last+1-first, keep)
		}
		time.Sleep(poll)
	}
}
