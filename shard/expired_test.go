package shard

import (
	"fmt"
	"testing"
	"time"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// A backlog of expired leases nobody waits for must not hold a waiter
// past its lock's expiry: the expiry candidates list the locks that
// waiters queue for first, then the rest in expiry order. Here 1,000
// leases expired before the waited one: with the expiry index alone the
// waited lock comes 1,001st, four batches of 256 later.
func TestExpiredListsWaitedLocksFirst(t *testing.T) {
	r := newReplica(t)
	ttl := int64(time.Second)
	now := int64(1_000_000_000_000)
	for i := range 1000 {
		if res := r.propose(now, acquireCmd(fmt.Sprintf("idle-%04d", i), "a", ttl, "h", leaseID(fmt.Sprintf("l%d", i)))); res.GetCode() != shardv1.Code_CODE_OK {
			t.Fatalf("acquire: %v", res)
		}
	}
	now += int64(time.Millisecond)
	if res := r.propose(now, acquireCmd("waited", "a", ttl, "h", leaseID("held"))); res.GetCode() != shardv1.Code_CODE_OK {
		t.Fatalf("acquire waited: %v", res)
	}
	wait := acquireCmd("waited", "w", ttl, "waiter", leaseID("next"))
	wait.GetAcquire().WaitTimeoutNanos = int64(time.Minute)
	if res := r.propose(now, wait); res.GetCode() != shardv1.Code_CODE_QUEUED {
		t.Fatalf("queue a waiter: %v", res)
	}
	later := now + 10*int64(time.Second)
	q := r.query(later, &shardv1.Query{Query: &shardv1.Query_Expired{Expired: &shardv1.ScanQuery{Limit: 256}}})
	items := q.GetExpire().GetItems()
	if len(items) != 256 || items[0].GetResource() != "waited" {
		t.Fatalf("first candidate of %d: %v, want the waited lock first", len(items), items[0])
	}
	seen := map[string]bool{}
	for _, it := range items {
		if seen[it.GetResource()] {
			t.Fatalf("%s listed twice", it.GetResource())
		}
		seen[it.GetResource()] = true
	}
	// Expiring that batch hands the lock to its waiter in the same entry.
	if res := r.propose(later, &shardv1.Envelope{Command: &shardv1.Envelope_Expire{Expire: q.GetExpire()}}); res.GetCount() != 256 {
		t.Fatalf("expire: %v", res)
	}
	d := r.query(later, &shardv1.Query{Query: &shardv1.Query_Describe{Describe: &shardv1.DescribeQuery{Resource: "waited"}}})
	if !d.GetLock().GetHeld() || d.GetLock().GetHolder() != "waiter" {
		t.Fatalf("after the expiry: %v, want held by the waiter", d.GetLock())
	}
}
