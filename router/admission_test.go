package router

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Past the bound the newest waiter gets the next slot; a waiter whose
// context ends leaves unadmitted, and its turn passes on.
func TestAdmissionServesNewestFirst(t *testing.T) {
	a := newAdmission(1)
	if err := a.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	order := make(chan int, 3)
	for i := range 3 {
		go func() {
			if err := a.acquire(context.Background()); err != nil {
				t.Error(err)
				return
			}
			order <- i
		}()
		// Each waits before the next arrives.
		for deadline := time.Now().Add(5 * time.Second); ; {
			a.mu.Lock()
			n := len(a.waiters)
			a.mu.Unlock()
			if n == i+1 || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := a.acquire(ctx); !errors.Is(err, context.DeadlineExceeded) { // the newest, but it leaves
		t.Fatalf("a waiter whose deadline passed: %v", err)
	}
	for want := 2; want >= 0; want-- {
		a.release()
		if got := <-order; got != want {
			t.Fatalf("slot went to waiter %d, want %d (newest first)", got, want)
		}
	}
	a.release()
	if a.free != 1 || len(a.waiters) != 0 || a.gone != 0 {
		t.Fatalf("after all left: free %d, waiters %d, gone %d", a.free, len(a.waiters), a.gone)
	}
}

// Waiters whose callers left do not pile up while no slot frees.
func TestAdmissionCompactsLeftWaiters(t *testing.T) {
	a := newAdmission(0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 3000 {
		if err := a.acquire(ctx); err == nil {
			t.Fatal("admitted with no slot")
		}
	}
	if len(a.waiters) > 2100 {
		t.Fatalf("%d waiters kept after their callers left", len(a.waiters))
	}
}
