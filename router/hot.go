package router

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// rateTracker estimates the Acquire rate of the busiest resources in
// bounded memory with the space-saving algorithm (Metwally, Agrawal and El
// Abbadi, "Efficient Computation of Frequent and Top-k Elements in Data
// Streams", 2005): it counts at most capacity resources; a new one takes
// the place of the least counted, inheriting its count. Counts are kept
// for the current and the previous window, so a rate covers between one
// and two windows.
type rateTracker struct {
	capacity int
	window   time.Duration

	mu struct {
		sync.Mutex
		start time.Time // of the current window
		cur   map[string]uint64
		prev  map[string]uint64
	}
}

func newRateTracker(capacity int, window time.Duration) *rateTracker {
	t := &rateTracker{capacity: capacity, window: window}
	t.mu.start = time.Now()
	t.mu.cur, t.mu.prev = map[string]uint64{}, map[string]uint64{}
	return t
}

// rollLocked starts a new window when the current one is over.
func (t *rateTracker) rollLocked(now time.Time) {
	switch {
	case now.Sub(t.mu.start) >= 2*t.window:
		t.mu.prev, t.mu.cur, t.mu.start = map[string]uint64{}, map[string]uint64{}, now
	case now.Sub(t.mu.start) >= t.window:
		t.mu.prev, t.mu.cur, t.mu.start = t.mu.cur, map[string]uint64{}, t.mu.start.Add(t.window)
	}
}

// add counts one Acquire of resource.
func (t *rateTracker) add(resource string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rollLocked(time.Now())
	if _, ok := t.mu.cur[resource]; !ok && len(t.mu.cur) >= t.capacity {
		minRes, minN := "", uint64(0)
		for r, n := range t.mu.cur {
			if minRes == "" || n < minN {
				minRes, minN = r, n
			}
		}
		delete(t.mu.cur, minRes)
		t.mu.cur[resource] = minN
	}
	t.mu.cur[resource]++
}

type resourceRate struct {
	resource string
	perSec   float64
}

// top returns up to n resources by rate, highest first.
func (t *rateTracker) top(n int) []resourceRate {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	t.rollLocked(now)
	span := (t.window + now.Sub(t.mu.start)).Seconds()
	counts := map[string]uint64{}
	for r, c := range t.mu.prev {
		counts[r] += c
	}
	for r, c := range t.mu.cur {
		counts[r] += c
	}
	out := make([]resourceRate, 0, len(counts))
	for r, c := range counts {
		out = append(out, resourceRate{r, float64(c) / span})
	}
	slices.SortFunc(out, func(a, b resourceRate) int {
		if c := cmp.Compare(b.perSec, a.perSec); c != 0 {
			return c
		}
		return cmp.Compare(a.resource, b.resource)
	})
	return out[:min(n, len(out))]
}
