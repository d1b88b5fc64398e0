package router

import (
	"context"
	"sync"
)

// admission lets at most a fixed number of proposals be in flight on a
// node. Requests past the bound wait, and the newest waiter is served
// first: under sustained overload a first-in-first-out line grows until
// every request in it has outlived its caller's deadline, and goodput
// falls to nothing; served newest first, the requests that still have
// time get through and the old ones run out of time in line, unproposed.
// This is the adaptive LIFO of Facebook's "Fail at Scale" (Maurer, ACM
// Queue 2015); the line only forms when the node is already at its bound.
type admission struct {
	mu      sync.Mutex
	free    int
	waiters []*admissionWaiter // a stack: the newest on top
	gone    int                // waiters in the stack whose caller left
}

type admissionWaiter struct {
	ready chan struct{} // closed when the slot is handed over
	gone  bool
}

func newAdmission(slots int) *admission { return &admission{free: slots} }

// acquire takes a slot, waiting until one is handed over or ctx ends
// (then ctx's error: the request was not admitted).
func (a *admission) acquire(ctx context.Context) error {
	a.mu.Lock()
	if a.free > 0 {
		a.free--
		a.mu.Unlock()
		return nil
	}
	w := &admissionWaiter{ready: make(chan struct{})}
	a.waiters = append(a.waiters, w)
	a.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	a.mu.Lock()
	select {
	case <-w.ready: // handed over just as ctx ended: pass it on
		a.mu.Unlock()
		a.release()
		return ctx.Err()
	default:
	}
	w.gone = true
	a.gone++
	if a.gone > 1024 && 2*a.gone > len(a.waiters) {
		a.compact()
	}
	a.mu.Unlock()
	return ctx.Err()
}

// release returns a slot: to the newest waiter still waiting, if any.
func (a *admission) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for n := len(a.waiters); n > 0; n = len(a.waiters) {
		w := a.waiters[n-1]
		a.waiters[n-1] = nil
		a.waiters = a.waiters[:n-1]
		if w.gone {
			a.gone--
			continue
		}
		close(w.ready)
		return
	}
	a.free++
}

// compact drops the waiters whose callers left (with a.mu held).
func (a *admission) compact() {
	kept := a.waiters[:0]
	for _, w := range a.waiters {
		if !w.gone {
			kept = append(kept, w)
		}
	}
	clear(a.waiters[len(kept):])
	a.waiters, a.gone = kept, 0
}
