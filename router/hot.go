package router

import (
	"cmp"
	"container/heap"
	"slices"
	"sync"
	"time"
)

// RateTracker estimates the Acquire rate of the busiest resources in
// bounded memory with the space-saving algorithm (Metwally, Agrawal and El
// Abbadi, "Efficient Computation of Frequent and Top-k Elements in Data
// Streams", 2005): it counts at most capacity resources; a new one takes
// the place of the least counted, inheriting its count. Counts are kept
// for the current and the previous window, so a rate covers between one
// and two windows.
type RateTracker struct {
	capacity int
	window   time.Duration

	mu struct {
		sync.Mutex
		start time.Time // of the current window
		cur   *spaceSaving
		prev  *spaceSaving
	}
}

// spaceSaving is one window's counts: a map from resource to its entry,
// and the entries in a min-heap by count, so the least counted is found
// in O(1) and replaced in O(log capacity).
type spaceSaving struct {
	byResource map[string]*hotEntry
	heap       hotHeap
}

type hotEntry struct {
	resource string
	count    uint64
	index    int // in the heap
}

type hotHeap []*hotEntry

func (h hotHeap) Len() int           { return len(h) }
func (h hotHeap) Less(i, j int) bool { return h[i].count < h[j].count }
func (h hotHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *hotHeap) Push(x any) {
	e := x.(*hotEntry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *hotHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func newSpaceSaving() *spaceSaving { return &spaceSaving{byResource: map[string]*hotEntry{}} }

func (s *spaceSaving) add(resource string, capacity int) {
	if e, ok := s.byResource[resource]; ok {
		e.count++
		heap.Fix(&s.heap, e.index)
		return
	}
	if len(s.heap) < capacity {
		e := &hotEntry{resource: resource, count: 1}
		heap.Push(&s.heap, e)
		s.byResource[resource] = e
		return
	}
	// The least counted gives its place, and its count, to the newcomer.
	e := s.heap[0]
	delete(s.byResource, e.resource)
	e.resource = resource
	e.count++
	s.byResource[resource] = e
	heap.Fix(&s.heap, 0)
}

func newRateTracker(capacity int, window time.Duration) *RateTracker {
	t := &RateTracker{capacity: capacity, window: window}
	t.mu.start = time.Now()
	t.mu.cur, t.mu.prev = newSpaceSaving(), newSpaceSaving()
	return t
}

// rollLocked starts a new window when the current one is over.
func (t *RateTracker) rollLocked(now time.Time) {
	switch {
	case now.Sub(t.mu.start) >= 2*t.window:
		t.mu.prev, t.mu.cur, t.mu.start = newSpaceSaving(), newSpaceSaving(), now
	case now.Sub(t.mu.start) >= t.window:
		t.mu.prev, t.mu.cur, t.mu.start = t.mu.cur, newSpaceSaving(), t.mu.start.Add(t.window)
	}
}

// Add counts one Acquire of resource.
func (t *RateTracker) Add(resource string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rollLocked(time.Now())
	t.mu.cur.add(resource, t.capacity)
}

type resourceRate struct {
	Resource string
	PerSec   float64
}

// Top returns up to n resources by rate, highest first.
func (t *RateTracker) Top(n int) []resourceRate {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	t.rollLocked(now)
	span := (t.window + now.Sub(t.mu.start)).Seconds()
	counts := map[string]uint64{}
	for _, w := range []*spaceSaving{t.mu.prev, t.mu.cur} {
		for r, e := range w.byResource {
			counts[r] += e.count
		}
	}
	out := make([]resourceRate, 0, len(counts))
	for r, c := range counts {
		out = append(out, resourceRate{r, float64(c) / span})
	}
	slices.SortFunc(out, func(a, b resourceRate) int {
		if c := cmp.Compare(b.PerSec, a.PerSec); c != 0 {
			return c
		}
		return cmp.Compare(a.Resource, b.Resource)
	})
	return out[:min(n, len(out))]
}
