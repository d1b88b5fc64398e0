package shard

import (
	"errors"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
)

// A replica started again before its previous instance closed (Dragonboat
// may run StopReplica's Close after StartReplica's Open) waits for that
// Close, then opens the same state; stopped while waiting, it gives up.
func TestOpenWaitsForThePreviousInstance(t *testing.T) {
	dir := t.TempDir()
	first := openReplica(t, dir, FirstShard)
	first.propose(second, acquireCmd("r", "q", 60*second, "h", leaseID("l")))
	again := NewStateMachine(dir, Hooks{})(FirstShard, 1).(*StateMachine)
	opened := make(chan error, 1)
	var idx uint64
	go func() {
		var err error
		idx, err = again.Open(nil)
		opened <- err
	}()
	select {
	case err := <-opened:
		t.Fatalf("opened while the previous instance was open (err %v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := first.sm.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-opened:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still waiting after the previous instance closed")
	}
	defer again.Close()
	if idx != 1 {
		t.Fatalf("reopened at applied index %d, want 1", idx)
	}

	stop := make(chan struct{})
	close(stop)
	third := NewStateMachine(dir, Hooks{})(FirstShard, 1).(*StateMachine)
	if _, err := third.Open(stop); !errors.Is(err, sm.ErrOpenStopped) {
		t.Fatalf("stopped while waiting: %v, want ErrOpenStopped", err)
	}
}
