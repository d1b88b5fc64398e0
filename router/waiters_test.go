package router

import (
	"testing"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// A late report about an earlier queue entry of the same request id (an
// earlier attempt's timeout, applied by a slow replica) must not end the
// wait of the current entry.
func TestSubscriptionIgnoresOtherEntries(t *testing.T) {
	w := NewWaitRegistry()
	sub := w.Subscribe("r", "q")
	defer w.Unsubscribe(sub)
	stale := &shardv1.Result{Dropped: []*shardv1.WaiterEvent{{Resource: "r", RequestId: "q", Seq: 1}}}
	w.Observe(1, stale)
	w.Observe(1, &shardv1.Result{Granted: []*shardv1.WaiterEvent{{Resource: "q", RequestId: "q", Seq: 2}}}) // other resource
	if ev := sub.find(2); ev != nil {
		t.Fatalf("entry 2 saw %v", ev)
	}
	grant := &shardv1.Result{Granted: []*shardv1.WaiterEvent{{Resource: "r", RequestId: "q", Seq: 2, Lease: &shardv1.LeaseInfo{FencingToken: 9}}}}
	w.Observe(1, stale) // another replica's copy
	w.Observe(1, grant)
	w.Observe(1, grant)
	<-sub.notify
	if ev := sub.find(2); ev.GetLease().GetFencingToken() != 9 {
		t.Fatalf("entry 2 got %v", ev)
	}
	// A split moved the queued request to shard 2: its grant still counts.
	moved := &shardv1.Result{Granted: []*shardv1.WaiterEvent{{Resource: "r", RequestId: "q", Seq: 3, Lease: &shardv1.LeaseInfo{FencingToken: 11}}}}
	w.Observe(2, moved)
	<-sub.notify
	if ev := sub.find(3); ev.GetLease().GetFencingToken() != 11 {
		t.Fatalf("entry 3 got %v", ev)
	}
}
