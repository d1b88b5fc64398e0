package router_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
)

// Case L15 (etcd #22082): a stale Release retry never ends a newer lease
// of the same holder. H releases L1 (the reply is lost), acquires again
// under a new request id, and the lost Release is delivered again: it
// answers released: false and changes nothing; the lease ids differ, the
// token rose, B cannot take the lock, and a RenewBatch of both leases
// renews only the current one.
func TestCaseL15StaleReleaseRetry(t *testing.T) {
	c := startCluster(t, router.DevConfig{})
	acquire := func(reqID, holder string) *wardenv1.AcquireResponse {
		resp, err := c.locks.Acquire(ctx(t), connect.NewRequest(&wardenv1.AcquireRequest{
			Resource: "r", RequestId: reqID, Holder: holder, LeaseTtl: durationpb.New(10 * time.Second)}))
		if err != nil {
			t.Fatalf("acquire %s: %v", reqID, err)
		}
		return resp.Msg
	}
	l1 := acquire("a1", "H")
	if ok, err := c.release("r", l1.GetLeaseId()); err != nil || !ok {
		t.Fatalf("release L1: %v %v", ok, err)
	}
	l2 := acquire("a2", "H")
	if l2.GetLeaseId() == l1.GetLeaseId() || l2.GetFencingToken() <= l1.GetFencingToken() {
		t.Fatalf("second lease %v after %v: the lease id must differ and the token rise", l2, l1)
	}
	if ok, err := c.release("r", l1.GetLeaseId()); err != nil || ok {
		t.Fatalf("the lost Release of L1 delivered again: released %v (%v), want false", ok, err)
	}
	if d := c.describe("r"); !d.GetHeld() || d.GetFencingToken() != l2.GetFencingToken() || d.GetHolder() != "H" {
		t.Fatalf("after the stale release: %v, want held by H with token %d", d, l2.GetFencingToken())
	}
	_, err := c.acquireWait(ctx(t), "r", "b1", 10*time.Second, time.Second)
	wantCode(t, err, connect.CodeDeadlineExceeded)
	out, err := c.renewBatch("r", l1.GetLeaseId(), "r", l2.GetLeaseId())
	if err != nil {
		t.Fatal(err)
	}
	if out[0].GetCode() != "failed_precondition" || out[1].GetCode() != "" || !out[1].GetExpiresAt().AsTime().After(l2.GetExpiresAt().AsTime()) {
		t.Fatalf("RenewBatch{L1, L2}: %v, want L1 refused and L2 renewed", out)
	}
}
