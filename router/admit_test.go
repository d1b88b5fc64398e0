package router

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// A request that finds every proposal slot taken waits in line; it gives
// up unproposed when its deadline passes (the caller's error) or after
// ProposeQueueWait (ErrOverloaded), and gets the first slot that frees.
func TestAdmitWaitsInLineThenSheds(t *testing.T) {
	r := &Router{cfg: Config{ProposeQueueWait: 100 * time.Millisecond}, proposing: make(chan struct{}, 1)}
	if err := r.admit(context.Background()); err != nil {
		t.Fatalf("a free slot: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := r.admit(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline in line: %v", err)
	}
	start := time.Now()
	if err := r.admit(context.Background()); !errors.Is(err, ErrOverloaded) || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("after %v in line: %v, want ErrOverloaded after 100 ms", time.Since(start), err)
	}
	if got := connect.CodeOf(toConnect(ErrOverloaded)); got != connect.CodeUnavailable || outcome(ErrOverloaded) != "unavailable" {
		t.Fatalf("ErrOverloaded maps to %v / %s", got, outcome(ErrOverloaded))
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		<-r.proposing // the slot frees
	}()
	if err := r.admit(context.Background()); err != nil {
		t.Fatalf("the slot freed while waiting: %v", err)
	}
}
