package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/warden-dev/warden/client"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// fakeBatch grants an Acquire of any resource but "busy" with the lease
// id "lease-" + resource, refuses "busy" with aborted and a LockHeld of
// token 7, and releases any lease. Each call takes delay, unless its
// context ends first (then it does nothing, or, with commitFirst, only
// fails to answer); with noBatch it does not implement Batch (an older
// server). granted and released record the resources it acquired and
// released.
type fakeBatch struct {
	wardenv1connect.UnimplementedLockServiceHandler
	noBatch           bool
	commitFirst       bool
	delay             time.Duration
	batches, ones     atomic.Int64
	ops, maxInCall    atomic.Int64
	calls             atomic.Int64 // in progress
	granted, released sync.Map     // resource → struct{}
}

// sleep waits out f.delay, or until ctx ends, with an error then.
func (f *fakeBatch) sleep(ctx context.Context) error {
	select {
	case <-time.After(f.delay):
		return nil
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}
		return connect.NewError(connect.CodeCanceled, ctx.Err())
	}
}

func (f *fakeBatch) acquire(m *wardenv1.AcquireRequest) (*wardenv1.AcquireResponse, error) {
	if m.GetResource() == "busy" {
		e := connect.NewError(connect.CodeAborted, errors.New("busy is held"))
		if d, err := connect.NewErrorDetail(&wardenv1.LockHeld{FencingToken: 7}); err == nil {
			e.AddDetail(d)
		}
		return nil, e
	}
	f.granted.Store(m.GetResource(), struct{}{})
	ttl := m.GetLeaseTtl().AsDuration()
	if ttl == 0 {
		ttl = 30 * time.Second
	}
	return &wardenv1.AcquireResponse{LeaseId: "lease-" + m.GetResource(), FencingToken: 1,
		ExpiresAt: timestamppb.New(time.Now().Add(ttl)), LeaseTtl: durationpb.New(ttl)}, nil
}

func (f *fakeBatch) Acquire(ctx context.Context, req *connect.Request[wardenv1.AcquireRequest]) (*connect.Response[wardenv1.AcquireResponse], error) {
	f.calls.Add(1)
	defer f.calls.Add(-1)
	f.ones.Add(1)
	f.ops.Add(1)
	if !f.commitFirst {
		if err := f.sleep(ctx); err != nil {
			return nil, err
		}
	}
	resp, err := f.acquire(req.Msg)
	if err != nil {
		return nil, err
	}
	if f.commitFirst {
		if err := f.sleep(ctx); err != nil {
			return nil, err
		}
	}
	return connect.NewResponse(resp), nil
}

func (f *fakeBatch) Release(ctx context.Context, req *connect.Request[wardenv1.ReleaseRequest]) (*connect.Response[wardenv1.ReleaseResponse], error) {
	f.calls.Add(1)
	defer f.calls.Add(-1)
	f.ones.Add(1)
	f.ops.Add(1)
	if err := f.sleep(ctx); err != nil {
		return nil, err
	}
	f.released.Store(req.Msg.GetResource(), struct{}{})
	return connect.NewResponse(&wardenv1.ReleaseResponse{Released: true}), nil
}

func (f *fakeBatch) Batch(ctx context.Context, req *connect.Request[wardenv1.BatchRequest]) (resp *connect.Response[wardenv1.BatchResponse], rerr error) {
	f.calls.Add(1)
	defer f.calls.Add(-1)
	if f.noBatch {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("no Batch"))
	}
	f.batches.Add(1)
	n := int64(len(req.Msg.GetOps()))
	f.ops.Add(n)
	for m := f.maxInCall.Load(); n > m && !f.maxInCall.CompareAndSwap(m, n); m = f.maxInCall.Load() {
	}
	if !f.commitFirst {
		if err := f.sleep(ctx); err != nil {
			return nil, err
		}
	}
	out := &wardenv1.BatchResponse{}
	defer func() {
		if f.commitFirst {
			if err := f.sleep(ctx); err != nil {
				resp, rerr = nil, err
			}
		}
	}()
	for _, op := range req.Msg.GetOps() {
		if op.GetRelease() != nil {
			f.released.Store(op.GetRelease().GetResource(), struct{}{})
			out.Outcomes = append(out.Outcomes, &wardenv1.BatchOutcome{Result: &wardenv1.BatchOutcome_Release{Release: &wardenv1.ReleaseResponse{Released: true}}})
			continue
		}
		resp, err := f.acquire(op.GetAcquire())
		if err != nil {
			d, _ := anypb.New(&wardenv1.LockHeld{FencingToken: 7})
			out.Outcomes = append(out.Outcomes, &wardenv1.BatchOutcome{Code: "aborted", Message: "busy is held", Details: []*anypb.Any{d}})
			continue
		}
		out.Outcomes = append(out.Outcomes, &wardenv1.BatchOutcome{Result: &wardenv1.BatchOutcome_Acquire{Acquire: resp}})
	}
	return connect.NewResponse(out), nil
}

// serveFake serves f over HTTP until the test ends and returns its URL.
func serveFake(t *testing.T, f *fakeBatch) string {
	mux := http.NewServeMux()
	mux.Handle(wardenv1connect.NewLockServiceHandler(f, connect.WithReadMaxBytes(64<<10)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func startBatchFake(t *testing.T, f *fakeBatch, calls int) *client.Batcher {
	return client.NewBatcher(wardenv1connect.NewLockServiceClient(http.DefaultClient, serveFake(t, f)), calls)
}

// fakeClient is a Client of f.
func fakeClient(t *testing.T, f *fakeBatch) *client.Client {
	c, err := client.New(serveFake(t, f))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// acquireAll runs n concurrent Acquires of r0..r(n-1) and "busy" through
// b and checks each answer is its own.
func acquireAll(t *testing.T, b *client.Batcher, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := fmt.Sprintf("r%d", i)
			resp, err := b.Acquire(t.Context(), &wardenv1.AcquireRequest{Resource: r, RequestId: "q"})
			if err != nil || resp.GetLeaseId() != "lease-"+r {
				t.Errorf("acquire %s: %v %v", r, resp, err)
			}
		})
	}
	wg.Go(func() {
		_, err := b.Acquire(t.Context(), &wardenv1.AcquireRequest{Resource: "busy", RequestId: "q"})
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeAborted || len(ce.Details()) != 1 {
			t.Errorf("acquire busy: %v, want aborted with one detail", err)
			return
		}
		if m, derr := ce.Details()[0].Value(); derr != nil || m.(*wardenv1.LockHeld).GetFencingToken() != 7 {
			t.Errorf("acquire busy: detail %v %v, want LockHeld token 7", m, derr)
		}
	})
	wg.Wait()
}

// Calls made while a Batch call is in flight share the next one; each
// caller gets its own answer, error details included.
func TestBatcherBatches(t *testing.T) {
	f := &fakeBatch{delay: 20 * time.Millisecond}
	b := startBatchFake(t, f, 1)
	acquireAll(t, b, 300)
	calls := f.batches.Load() + f.ones.Load()
	if f.ops.Load() != 301 || calls > 30 {
		t.Errorf("%d ops in %d Batch and %d plain calls, want 301 ops in at most 30 calls", f.ops.Load(), f.batches.Load(), f.ones.Load())
	}
	if _, err := b.Release(t.Context(), &wardenv1.ReleaseRequest{Resource: "r", LeaseId: "x"}); err != nil {
		t.Error(err)
	}
}

// A server without Batch gets plain calls, with the same answers.
func TestBatcherWithoutBatch(t *testing.T) {
	f := &fakeBatch{noBatch: true, delay: 5 * time.Millisecond}
	b := startBatchFake(t, f, 2)
	acquireAll(t, b, 50)
	if f.ones.Load() != 51 {
		t.Errorf("%d plain calls, want 51", f.ones.Load())
	}
}

// An Acquire that waits never shares a call.
func TestBatcherSendsWaitsAlone(t *testing.T) {
	f := &fakeBatch{}
	b := startBatchFake(t, f, 1)
	req := &wardenv1.AcquireRequest{Resource: "w", RequestId: "q", WaitTimeout: durationpb.New(time.Second)}
	if _, err := b.Acquire(t.Context(), req); err != nil || f.ones.Load() != 1 || f.batches.Load() != 0 {
		t.Errorf("waiting acquire: %v; %d plain, %d Batch calls; want 1 plain", err, f.ones.Load(), f.batches.Load())
	}
}

// A batched Lock that runs out of time answers as its own call would:
// deadline_exceeded wrapping the context's error, not a wait timeout
// (it did not wait), whether its batch ran out at its deadline or not.
func TestBatcherDeadline(t *testing.T) {
	f := &fakeBatch{delay: 300 * time.Millisecond}
	c := fakeClient(t, f)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), time.Duration(20+i%3*20)*time.Millisecond)
			defer cancel()
			_, err := c.Lock(ctx, fmt.Sprintf("d%d", i), client.LockOptions{TTL: 10 * time.Second})
			if errors.Is(err, client.ErrWaitTimeout) || connect.CodeOf(err) != connect.CodeDeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("lock %d: %v (code %v), want deadline_exceeded", i, err, connect.CodeOf(err))
			}
		})
	}
	wg.Wait()
	// The server granted them after all: the SDK releases them.
	awaitReleases(t, f, func(any) bool { return true })
}

// awaitReleases waits up to 5 s until no call is in progress at f and f
// has released every resource it granted for which orphan is true, and
// returns how many there were.
func awaitReleases(t *testing.T, f *fakeBatch, orphan func(r any) bool) int {
	t.Helper()
	n := 0
	deadline := time.Now().Add(5 * time.Second)
	for f.calls.Load() > 0 && time.Now().Before(deadline) { // calls still to grant
		time.Sleep(10 * time.Millisecond)
	}
	f.granted.Range(func(r, _ any) bool {
		if !orphan(r) {
			return true
		}
		n++
		for _, ok := f.released.Load(r); !ok; _, ok = f.released.Load(r) {
			if time.Now().After(deadline) {
				t.Errorf("%s: granted after its Lock gave up, never released", r)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		return true
	})
	return n
}

// A lease the server grants to a batched Lock after the Lock gave up
// (its Batch call went on for the other callers in it) is held by no one;
// the SDK releases it when the request id was its own, and leaves it when
// the caller chose the id (it may retry with it). The SDK's Unlock is not
// involved: no Lease was returned.
func TestLockReleasesOrphanedLeases(t *testing.T) {
	f := &fakeBatch{delay: 300 * time.Millisecond}
	c := fakeClient(t, f)
	var leases sync.Map // resource → *client.Lease
	lock := func(r string, d time.Duration, id string) error {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		defer cancel()
		l, err := c.Lock(ctx, r, client.LockOptions{TTL: 10 * time.Second, RequestID: id})
		if err == nil {
			leases.Store(r, l)
		}
		return err
	}
	// Four Locks that give up at 30 ms fill the Batcher's four calls, as
	// plain Acquires (with request ids of their own, so their calls end
	// with them); when they end, the Locks queued meanwhile go in Batch
	// calls that outlast their short callers (150 ms) because each also
	// carries a caller with time left (5 s).
	var wg sync.WaitGroup
	for i := range client.DefaultBatchCalls {
		wg.Go(func() { _ = lock(fmt.Sprintf("first%d", i), 30*time.Millisecond, fmt.Sprintf("first%d", i)) })
	}
	time.Sleep(5 * time.Millisecond)
	var failed, kept, held sync.Map // resource → struct{}
	for i := range 60 {
		r := fmt.Sprintf("r%d", i)
		wg.Go(func() {
			id, d := "", 5*time.Second
			switch i % 3 {
			case 0:
				d = 150 * time.Millisecond
			case 1:
				id, d = "chosen-"+r, 150*time.Millisecond
			}
			switch err := lock(r, d, id); {
			case err == nil:
				held.Store(r, struct{}{})
			case id != "":
				kept.Store(r, struct{}{})
			default:
				if d > time.Second {
					t.Errorf("lock %s with time to spare: %v", r, err)
				}
				failed.Store(r, struct{}{})
			}
		})
	}
	wg.Wait()
	orphans := awaitReleases(t, f, func(r any) bool { _, ok := failed.Load(r); return ok })
	if orphans == 0 {
		t.Fatal("no Lock was granted after it gave up: the test did not reach its case")
	}
	time.Sleep(100 * time.Millisecond) // for releases that should not come
	for _, m := range []*sync.Map{&held, &kept} {
		m.Range(func(r, _ any) bool {
			if _, ok := f.released.Load(r); ok {
				t.Errorf("%s released, though its lease is held or its request id is the caller's", r)
			}
			return true
		})
	}
	t.Logf("%d orphaned leases released", orphans)
	leases.Range(func(r, l any) bool {
		wg.Go(func() {
			if err := l.(*client.Lease).Unlock(t.Context()); err != nil {
				t.Errorf("unlock %s: %v", r, err)
			}
		})
		return true
	})
	wg.Wait()
}

// When every caller of a call gives up before the server answers, the
// call goes on a little (orphanLinger) for Locks whose request id is the
// SDK's, so that a grant the server made anyway is learned and released,
// whether the Lock went in a Batch or alone.
func TestLockReleasesOrphanedLeasesWhenAllGaveUp(t *testing.T) {
	f := &fakeBatch{delay: 300 * time.Millisecond, commitFirst: true}
	c := fakeClient(t, f)
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
			defer cancel()
			if _, err := c.Lock(ctx, fmt.Sprintf("g%d", i), client.LockOptions{TTL: 10 * time.Second}); err == nil {
				t.Errorf("g%d: locked in 100 ms from a server that answers in 300 ms", i)
			}
		})
	}
	wg.Wait()
	granted := awaitReleases(t, f, func(any) bool { return true })
	if granted == 0 {
		t.Fatal("nothing was granted: the test did not reach its case")
	}
	t.Logf("%d orphaned leases released", granted)
}
