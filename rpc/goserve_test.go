package rpc

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// A panic in one part of a call (a Batch group or op, a RenewBatch
// renewal) fails that part alone, with an error saying so; the other
// parts finish, and so does the call. Unrecovered, it stopped the node.
func TestGoServeContainsAPanic(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	var wg sync.WaitGroup
	var failed error
	healthy := false
	goServe(log, &wg, func() { panic("a bug") }, func(err error) { failed = err })
	goServe(log, &wg, func() { healthy = true }, func(err error) { t.Errorf("the healthy part failed: %v", err) })
	wg.Wait()
	if failed == nil || !strings.Contains(failed.Error(), "internal error") {
		t.Errorf("the panicking part answered %v", failed)
	}
	if !healthy {
		t.Error("the healthy part did not run")
	}
}
