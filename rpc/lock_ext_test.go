package rpc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/server"
	"github.com/warden-dev/warden/shard"
)

func TestLockLifecycle(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	a := c.mustAcquire("orders/42", "a1", 0)
	if a.GetLeaseTtl().AsDuration() != 30*time.Second {
		t.Fatalf("effective lease_ttl %v, want the 30s default", a.GetLeaseTtl().AsDuration())
	}
	if len(a.GetLeaseId()) != 32 || a.GetFencingToken() >= 1<<63 {
		t.Fatalf("lease id %q, token %d", a.GetLeaseId(), a.GetFencingToken())
	}
	if e, _ := shard.SplitToken(a.GetFencingToken()); e != 1 {
		t.Fatalf("token %d has epoch %d, want 1", a.GetFencingToken(), e)
	}
	if left := time.Until(a.GetExpiresAt().AsTime()); left < 29*time.Second || left > 31*time.Second {
		t.Fatalf("expires in %v", left)
	}

	// Held: a second acquirer is refused with the holder's token, whoever it is.
	_, err := c.acquire("orders/42", "b1", 0)
	wantCode(t, err, connect.CodeAborted)
	var ce *connect.Error
	if errors.As(err, &ce) {
		held := detail[*wardenv1.LockHeld](t, ce)
		if held.GetFencingToken() != a.GetFencingToken() {
			t.Fatalf("LockHeld token %d, want %d", held.GetFencingToken(), a.GetFencingToken())
		}
	}

	d := c.describe("orders/42")
	if !d.GetHeld() || d.GetFencingToken() != a.GetFencingToken() || !d.GetExpiresAt().AsTime().Equal(a.GetExpiresAt().AsTime()) {
		t.Fatalf("describe %v", d)
	}

	r, err := c.renew("orders/42", a.GetLeaseId())
	if err != nil || r.GetExpiresAt().AsTime().Before(a.GetExpiresAt().AsTime()) {
		t.Fatalf("renew: %v %v", r, err)
	}
	// Rule 3: a wrong lease id neither renews nor releases.
	other := strings.Repeat("0", 32)
	_, err = c.renew("orders/42", other)
	wantCode(t, err, connect.CodeFailedPrecondition)
	if ok, err := c.release("orders/42", other); err != nil || ok {
		t.Fatalf("stale release: %v %v", ok, err)
	}
	if ok, err := c.release("orders/42", a.GetLeaseId()); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	if d := c.describe("orders/42"); d.GetHeld() || d.GetFencingToken() != a.GetFencingToken() {
		t.Fatalf("after release: %v", d)
	}
	b := c.mustAcquire("orders/42", "b2", 2*time.Second)
	if b.GetFencingToken() <= a.GetFencingToken() {
		t.Fatalf("token %d after %d", b.GetFencingToken(), a.GetFencingToken())
	}
	if d := c.describe("never-locked"); d.GetHeld() || d.GetFencingToken() != 0 {
		t.Fatalf("free resource: %v", d)
	}
}

func TestInvalidInputNamesTheField(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	held := c.mustAcquire("busy", "h1", 5*time.Second)
	long := strings.Repeat("x", 257)
	cases := []struct {
		name  string
		req   *wardenv1.AcquireRequest
		field string
	}{
		{"empty resource", &wardenv1.AcquireRequest{RequestId: "q"}, "resource"},
		{"long resource", &wardenv1.AcquireRequest{Resource: long, RequestId: "q"}, "resource"},
		{"control char", &wardenv1.AcquireRequest{Resource: "a\nb", RequestId: "q"}, "resource"},
		{"no request id", &wardenv1.AcquireRequest{Resource: "r"}, "request_id"},
		{"long request id", &wardenv1.AcquireRequest{Resource: "r", RequestId: long[:129]}, "request_id"},
		{"long holder", &wardenv1.AcquireRequest{Resource: "r", RequestId: "q", Holder: long}, "holder"},
		{"ttl too short", &wardenv1.AcquireRequest{Resource: "r", RequestId: "q", LeaseTtl: durationpb.New(time.Millisecond)}, "lease_ttl"},
		{"ttl too long", &wardenv1.AcquireRequest{Resource: "r", RequestId: "q", LeaseTtl: durationpb.New(11 * time.Minute)}, "lease_ttl"},
		{"zero ttl", &wardenv1.AcquireRequest{Resource: "r", RequestId: "q", LeaseTtl: durationpb.New(0)}, "lease_ttl"},
		{"bidi override", &wardenv1.AcquireRequest{Resource: "a\u202eb", RequestId: "q"}, "resource"},
		{"spoofing holder", &wardenv1.AcquireRequest{Resource: "r", RequestId: "q", Holder: "ok\u2028admin"}, "holder"},
		{"negative ttl", &wardenv1.AcquireRequest{Resource: "r", RequestId: "q", LeaseTtl: durationpb.New(-time.Second)}, "lease_ttl"},
		{"negative wait", &wardenv1.AcquireRequest{Resource: "r", RequestId: "q", WaitTimeout: durationpb.New(-time.Second)}, "wait_timeout"},
		{"wait too long", &wardenv1.AcquireRequest{Resource: "r", RequestId: "q", WaitTimeout: durationpb.New(time.Hour)}, "wait_timeout"},
		// Rule 5: the same id with other parameters.
		{"reused request id", &wardenv1.AcquireRequest{Resource: "busy", RequestId: "h1", LeaseTtl: durationpb.New(6 * time.Second)}, "request_id"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.locks.Acquire(ctx(t), connect.NewRequest(tc.req))
			wantCode(t, err, connect.CodeInvalidArgument)
			var ce *connect.Error
			if errors.As(err, &ce) {
				if fv := detail[*wardenv1.FieldViolation](t, ce); fv.GetField() != tc.field {
					t.Fatalf("field %q, want %q (%v)", fv.GetField(), tc.field, err)
				}
			}
		})
	}
	_, err := c.renew("busy", "not-hex")
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = c.release("", held.GetLeaseId())
	wantCode(t, err, connect.CodeInvalidArgument)
	// Nothing above changed the held lock.
	if d := c.describe("busy"); !d.GetHeld() || d.GetFencingToken() != held.GetFencingToken() {
		t.Fatalf("busy: %v", d)
	}
}

// Case L7: the grant commits but its response is lost; the retry with the
// same request_id gets the same lease, and exactly one grant was made.
func TestLostAcquireResponse(t *testing.T) {
	c := startCluster(t, server.DevConfig{}, dropResponses(1, func(r connect.AnyRequest) bool {
		m, ok := r.Any().(*wardenv1.AcquireRequest)
		return ok && m.GetRequestId() == "q42"
	}))
	_, err := c.acquire("r", "q42", 30*time.Second)
	wantCode(t, err, connect.CodeUnavailable)
	got := c.mustAcquire("r", "q42", 30*time.Second)
	d := c.describe("r")
	if !d.GetHeld() || d.GetFencingToken() != got.GetFencingToken() || !d.GetExpiresAt().AsTime().Equal(got.GetExpiresAt().AsTime()) {
		t.Fatalf("retry returned %v, lock is %v", got, d)
	}
	again := c.mustAcquire("r", "q42", 30*time.Second)
	if again.GetLeaseId() != got.GetLeaseId() || again.GetFencingToken() != got.GetFencingToken() || !again.GetExpiresAt().AsTime().Equal(got.GetExpiresAt().AsTime()) {
		t.Fatalf("second retry %v, first %v", again, got)
	}
	// Exactly one grant: the shard's revision moved by one, so the next
	// grant anywhere in the shard is the very next token.
	next := c.mustAcquire("other", "o1", 0)
	if next.GetFencingToken() != got.GetFencingToken()+1 {
		t.Fatalf("next token %d after %d: the lost acquire granted more than once", next.GetFencingToken(), got.GetFencingToken())
	}
	if ok, err := c.release("r", got.GetLeaseId()); err != nil || !ok {
		t.Fatalf("release with the retried lease: %v %v", ok, err)
	}
}

// Case L7, variant: the client never retries; the lock frees once the
// lease ends and the next acquirer gets it with a higher token.
func TestLostAcquireResponseWithoutRetry(t *testing.T) {
	c := startCluster(t, server.DevConfig{}, dropResponses(1, func(r connect.AnyRequest) bool {
		_, ok := r.Any().(*wardenv1.AcquireRequest)
		return ok
	}))
	start := time.Now()
	_, err := c.acquire("r", "q42", time.Second)
	wantCode(t, err, connect.CodeUnavailable)
	lost := c.describe("r")
	if !lost.GetHeld() {
		t.Fatal("the lost grant did not commit")
	}
	got, at := c.acquireWhenFree("r", "b", time.Second, 10*time.Second)
	if got.GetFencingToken() <= lost.GetFencingToken() {
		t.Fatalf("token %d after %d", got.GetFencingToken(), lost.GetFencingToken())
	}
	if !at.After(lost.GetExpiresAt().AsTime()) || at.Sub(start) < time.Second {
		t.Fatalf("granted at %v, before the lost lease's expiry %v", at, lost.GetExpiresAt().AsTime())
	}
}

// Case L10 A: a renewal that arrives after the lease expired and the lock
// went to someone else neither resurrects the old lease nor hurts the new.
func TestLateRenewAfterExpiry(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	a := c.mustAcquire("r", "a", time.Second)
	if _, err := c.renew("r", a.GetLeaseId()); err != nil {
		t.Fatal(err)
	}
	// A stalls; B polls until granted.
	b, _ := c.acquireWhenFree("r", "b", 5*time.Second, 10*time.Second)
	_, err := c.renew("r", a.GetLeaseId())
	wantCode(t, err, connect.CodeFailedPrecondition)
	if ok, err := c.release("r", a.GetLeaseId()); err != nil || ok {
		t.Fatalf("late release: %v %v", ok, err)
	}
	if d := c.describe("r"); !d.GetHeld() || d.GetFencingToken() != b.GetFencingToken() {
		t.Fatalf("B's lease was disturbed: %v", d)
	}
	// Rule 8: the retry of A's request now says its lease ended.
	_, err = c.acquire("r", "a", time.Second)
	wantCode(t, err, connect.CodeFailedPrecondition)
}

// Case L10 B: a renewal delayed past the release fails; the lock stays free.
func TestRenewAfterRelease(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	a := c.mustAcquire("r", "a", 10*time.Second)
	if ok, err := c.release("r", a.GetLeaseId()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	_, err := c.renew("r", a.GetLeaseId())
	wantCode(t, err, connect.CodeFailedPrecondition)
	if d := c.describe("r"); d.GetHeld() {
		t.Fatalf("renewal resurrected the lock: %v", d)
	}
	b := c.mustAcquire("r", "b", 0)
	if b.GetFencingToken() <= a.GetFencingToken() {
		t.Fatalf("token %d after %d", b.GetFencingToken(), a.GetFencingToken())
	}
}

// Case L11: a release whose reply was lost can be retried without error.
func TestLostReleaseResponse(t *testing.T) {
	c := startCluster(t, server.DevConfig{}, dropResponses(1, func(r connect.AnyRequest) bool {
		_, ok := r.Any().(*wardenv1.ReleaseRequest)
		return ok
	}))
	a := c.mustAcquire("r", "a", 0)
	_, err := c.release("r", a.GetLeaseId())
	wantCode(t, err, connect.CodeUnavailable)
	if ok, err := c.release("r", a.GetLeaseId()); err != nil || ok {
		t.Fatalf("retried release: released=%v err=%v, want false and no error", ok, err)
	}
	if d := c.describe("r"); d.GetHeld() {
		t.Fatalf("still held after release: %v", d)
	}
	c.mustAcquire("r", "b", 0)
}

// Past MaxProposing, requests wait in line rather than fail, and one
// whose deadline passes while it waits is never proposed.
func TestProposalsPastTheBoundWaitInLine(t *testing.T) {
	c := startCluster(t, server.DevConfig{Router: router.Config{MaxProposing: 1}})
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.acquire(fmt.Sprintf("line-%d", i), "q", time.Minute); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a request in line failed: %v", err)
	}

	// Without a quorum the one slot stays taken by a blocked proposal.
	leader := c.leader()
	for i := range c.dev.Nodes {
		if i != leader {
			c.stopReplica(i)
		}
	}
	blocked := make(chan error, 1)
	go func() {
		bctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := c.acquireWait(bctx, "blocker", "b", time.Minute, 0)
		blocked <- err
	}()
	time.Sleep(200 * time.Millisecond)
	lctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := c.acquireWait(lctx, "late", "l", time.Minute, 0)
	cancel()
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("late acquire behind a full line: %v, want deadline_exceeded", err)
	}
	<-blocked
	for i := range c.dev.Nodes {
		if i != leader {
			c.startReplica(i)
		}
	}
	// Once the shard commits again, "late" was never proposed; "blocker"
	// may have been.
	for range 100 {
		if _, err := c.acquire("probe", "p", time.Minute); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d := c.describe("late"); d.GetHeld() {
		t.Fatalf("the late acquire was proposed after its deadline: %v", d)
	}
}
