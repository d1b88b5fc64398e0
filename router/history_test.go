package router

import (
	"errors"
	"testing"

	"pgregory.net/rapid"

	"github.com/warden-dev/warden/shard"
)

// TestHistoryServesEveryEventOnce checks History against the plainest
// model: every event a replica reported since its last Reset, in order.
// From any cursor a watcher could hold, following Since's next cursors
// yields exactly the model's events after it, each once, with no gap; and
// a cursor is refused (ErrHistoryGone) only before the Reset or behind
// more events than the history keeps.
func TestHistoryServesEveryEventOnce(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		const id = 7
		keep := rapid.IntRange(1, 12).Draw(rt, "keep")
		h := NewHistory(keep)
		if _, _, _, err := h.Since(id, Cursor{}, 1); !errors.Is(err, ErrNoHistory) {
			rt.Fatalf("before any report: %v, want ErrNoHistory", err)
		}
		var era []shard.LockEvent // the model: events since the last Reset
		var resetAt, applied uint64
		cursors := []Cursor{{}}
		const maxPerEntry = 3
		reset := func(at uint64) {
			h.Reset(id, at)
			era, resetAt, applied = nil, at, at
			cursors = append(cursors, Through(at))
		}
		reset(rapid.Uint64Range(0, 5).Draw(rt, "open at"))
		rt.Repeat(map[string]func(*rapid.T){
			"apply": func(rt *rapid.T) {
				var evs []shard.LockEvent
				for range rapid.IntRange(1, 4).Draw(rt, "entries") {
					applied++
					for seq := range rapid.IntRange(0, maxPerEntry).Draw(rt, "events") {
						evs = append(evs, shard.LockEvent{Index: applied, Seq: uint32(seq), Kind: shard.EventGranted})
					}
				}
				h.Heard(id, applied, evs)
				era = append(era, evs...)
				for _, e := range evs {
					cursors = append(cursors, After(e))
				}
				cursors = append(cursors, Through(applied))
			},
			"restart": func(rt *rapid.T) {
				// A snapshot or a restart: the state loads at an index
				// after (or, replaying, before) the last applied.
				reset(rapid.Uint64Range(applied/2, applied+5).Draw(rt, "load at"))
			},
			"watch": func(rt *rapid.T) {
				c := rapid.SampledFrom(cursors).Draw(rt, "cursor")
				limit := rapid.IntRange(1, 5).Draw(rt, "limit")
				var want []shard.LockEvent
				for _, e := range era {
					if e.Index > c.Index+1 || e.Index == c.Index+1 && e.Seq >= c.Next {
						want = append(want, e)
					}
				}
				var got []shard.LockEvent
				for cur := c; ; {
					evs, next, changed, err := h.Since(id, cur, limit)
					if errors.Is(err, ErrHistoryGone) {
						if cur != c {
							rt.Fatalf("cursor %v: gone after serving %d events", c, len(got))
						}
						if c.Index >= resetAt && len(want) <= keep-maxPerEntry {
							rt.Fatalf("cursor %v refused with %d events after it (keep %d, reset at %d): %v", c, len(want), keep, resetAt, err)
						}
						return
					}
					if err != nil {
						rt.Fatal(err)
					}
					if c.Index < resetAt {
						rt.Fatalf("cursor %v before the reset at %d was served", c, resetAt)
					}
					if len(evs) > limit {
						rt.Fatalf("%d events, limit %d", len(evs), limit)
					}
					got = append(got, evs...)
					if next == cur {
						if len(evs) > 0 || changed == nil {
							rt.Fatalf("no progress from %v with %d events", cur, len(evs))
						}
						break
					}
					cur = next
				}
				if len(got) != len(want) {
					rt.Fatalf("from %v: %d events, want %d:\n%v\n%v", c, len(got), len(want), got, want)
				}
				for i := range got {
					if got[i] != want[i] {
						rt.Fatalf("from %v: event %d is %+v, want %+v", c, i, got[i], want[i])
					}
				}
			},
		})
	})
}

// TestHistoryWakesWatchers: Opened's channel closes when the replica
// opens, and Since's when it applies more, when its history restarts and
// when it stops.
func TestHistoryWakesWatchers(t *testing.T) {
	h := NewHistory(10)
	opened := h.Opened(1)
	select {
	case <-opened:
		t.Fatal("Opened is closed before the replica opened")
	default:
	}
	h.Reset(1, 4)
	for _, ch := range []<-chan struct{}{opened, h.Opened(1)} {
		select {
		case <-ch:
		default:
			t.Fatal("Opened is not closed once the replica opened")
		}
	}
	_, next, changed, err := h.Since(1, Through(4), 10)
	if err != nil || next != Through(4) {
		t.Fatalf("at the replica's index: next %v, %v", next, err)
	}
	h.Heard(1, 5, nil)
	select {
	case <-changed:
	default:
		t.Fatal("an apply did not wake the watcher")
	}
	_, _, changed, _ = h.Since(1, Through(5), 10)
	h.Reset(1, 9)
	select {
	case <-changed:
	default:
		t.Fatal("a restart of the history did not wake the watcher")
	}
	if _, _, _, err := h.Since(1, Through(5), 10); !errors.Is(err, ErrHistoryGone) {
		t.Fatalf("a cursor before the restart: %v, want ErrHistoryGone", err)
	}
	_, _, changed, _ = h.Since(1, Through(9), 10)
	h.Close(1)
	select {
	case <-changed:
	default:
		t.Fatal("the replica's stop did not wake the watcher")
	}
	if _, _, _, err := h.Since(1, Through(9), 10); !errors.Is(err, ErrNoHistory) || h.Has(1) {
		t.Fatalf("after the replica stopped: %v, kept %v; want ErrNoHistory", err, h.Has(1))
	}
}
