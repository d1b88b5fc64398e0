package shard

import (
	"testing"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

func batchCmd(items ...*shardv1.BatchItem) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_Batch{Batch: &shardv1.BatchCmd{Items: items}}}
}

func acquireItem(resource, reqID string, leaseID []byte) *shardv1.BatchItem {
	return &shardv1.BatchItem{Command: &shardv1.BatchItem_Acquire{Acquire: acquireCmd(resource, reqID, 10*second, "", leaseID).GetAcquire()}}
}

func releaseItem(resource string, leaseID []byte) *shardv1.BatchItem {
	return &shardv1.BatchItem{Command: &shardv1.BatchItem_Release{Release: &shardv1.ReleaseCmd{Resource: resource, LeaseId: leaseID}}}
}

// A BatchCmd applies its items in order, each seeing the ones before it
// (rules 1 and 2 hold inside one entry), and refuses alone an item that
// would wait or holds no command; an empty or oversized batch changes
// nothing.
func TestBatchCmdItems(t *testing.T) {
	r := newReplica(t)
	id1, id2, id3 := []byte("lease-1-00000000"), []byte("lease-2-00000000"), []byte("lease-3-00000000")
	waiting := acquireItem("b", "rw", id3)
	waiting.GetAcquire().WaitTimeoutNanos = second
	got := r.propose(second, batchCmd(
		acquireItem("a", "r1", id1),
		acquireItem("a", "r2", id2), // held by item 0
		acquireItem("a", "r1", id3), // item 0's retry: the same lease
		waiting,
		&shardv1.BatchItem{},
		releaseItem("a", id1),
		acquireItem("a", "r3", id3), // free again: a new lease, a newer token
	))
	if got.GetCode() != shardv1.Code_CODE_OK || len(got.GetItems()) != 7 {
		t.Fatalf("batch: %v", got)
	}
	items := got.GetItems()
	want := []shardv1.Code{shardv1.Code_CODE_OK, shardv1.Code_CODE_CONFLICT, shardv1.Code_CODE_OK,
		shardv1.Code_CODE_INVALID_ARGUMENT, shardv1.Code_CODE_INVALID_ARGUMENT, shardv1.Code_CODE_OK, shardv1.Code_CODE_OK}
	for i, w := range want {
		if c := items[i].GetCode(); c != w {
			t.Errorf("item %d: %v, want %v (%v)", i, c, w, items[i])
		}
	}
	if !items[2].GetReplayed() || items[2].GetLease().GetFencingToken() != items[0].GetLease().GetFencingToken() {
		t.Errorf("retry in the batch: %v, first %v", items[2], items[0])
	}
	if f := items[3].GetField(); f != "items[3].wait_timeout_nanos" {
		t.Errorf("waiting item names %q", f)
	}
	if f := items[4].GetField(); f != "items[4]" {
		t.Errorf("empty item names %q", f)
	}
	if !items[5].GetReleased() {
		t.Errorf("release of item 0's lease: %v", items[5])
	}
	if a, b := items[0].GetLease().GetFencingToken(), items[6].GetLease().GetFencingToken(); b <= a {
		t.Errorf("tokens %d then %d", a, b)
	}
	// The refused waiting item queued nothing: b is free and unwaited.
	if d := r.query(second, describeQuery("b")); d.GetLock() != nil {
		t.Errorf("b after the batch: %v", d.GetLock())
	}

	for _, n := range []int{0, MaxBatch + 1} {
		items := make([]*shardv1.BatchItem, n)
		for i := range items {
			items[i] = acquireItem("c", "rc", id1)
		}
		res := r.propose(2*second, batchCmd(items...))
		if res.GetCode() != shardv1.Code_CODE_INVALID_ARGUMENT || res.GetField() != "items" {
			t.Errorf("%d items: %v", n, res)
		}
	}
	if d := r.query(2*second, describeQuery("c")); d.GetLock() != nil {
		t.Errorf("c after refused batches: %v", d.GetLock())
	}
}

// A BatchCmd in an envelope older than version 3 is an unknown command,
// as it is to a binary that predates it.
func TestBatchCmdNeedsVersion3(t *testing.T) {
	r := newReplica(t)
	env := batchCmd(acquireItem("a", "r1", []byte("lease-1-00000000")))
	if VersionOf(env) != 3 {
		t.Fatalf("version %d", VersionOf(env))
	}
	env.Version, env.ShardId, env.Generation, env.NowUnixNano = 2, r.shardID, r.generation, second
	b, err := EncodeCommand(env)
	if err != nil {
		t.Fatal(err)
	}
	if res := r.proposeRaw(b)[0]; res.GetCode() != shardv1.Code_CODE_INVALID_ARGUMENT || res.GetField() != "command" {
		t.Fatalf("version 2 batch: %v", res)
	}
	if d := r.query(second, describeQuery("a")); d.GetLock() != nil {
		t.Errorf("the version 2 batch acquired a: %v", d.GetLock())
	}
}

// From envelope version 10, a Release repeated in the same batch as the
// Release that ended its lease answers replayed (already released), as it
// would in a later entry: the batch reads its own writes.
func TestBatchCmdRepeatedRelease(t *testing.T) {
	r := newReplica(t)
	id := []byte("lease-1-00000000")
	got := r.propose(second, batchCmd(acquireItem("a", "r1", id), releaseItem("a", id), releaseItem("a", id)))
	items := got.GetItems()
	if len(items) != 3 || !items[1].GetReleased() || items[2].GetReleased() || !items[2].GetReplayed() {
		t.Fatalf("acquire, release, release again in one batch: %v, want the repeat replayed, not released", items)
	}
	if again := r.propose(2*second, releaseCmd("a", id)); again.GetReleased() || !again.GetReplayed() {
		t.Fatalf("the Release repeated in a later entry: %v, want replayed", again)
	}
}
