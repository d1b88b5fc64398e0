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

	"github.com/warden-dev/warden/client"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// fakeBatch grants an Acquire of any resource but "busy" with the lease
// id "lease-" + resource, refuses "busy" with aborted and a LockHeld of
// token 7, and releases any lease. Each call takes delay; with noBatch it
// does not implement Batch (an older server).
type fakeBatch struct {
	wardenv1connect.UnimplementedLockServiceHandler
	noBatch        bool
	delay          time.Duration
	batches, ones  atomic.Int64
	ops, maxInCall atomic.Int64
}

func (f *fakeBatch) acquire(m *wardenv1.AcquireRequest) (*wardenv1.AcquireResponse, error) {
	if m.GetResource() == "busy" {
		e := connect.NewError(connect.CodeAborted, errors.New("busy is held"))
		if d, err := connect.NewErrorDetail(&wardenv1.LockHeld{FencingToken: 7}); err == nil {
			e.AddDetail(d)
		}
		return nil, e
	}
	return &wardenv1.AcquireResponse{LeaseId: "lease-" + m.GetResource(), FencingToken: 1}, nil
}

func (f *fakeBatch) Acquire(_ context.Context, req *connect.Request[wardenv1.AcquireRequest]) (*connect.Response[wardenv1.AcquireResponse], error) {
	f.ones.Add(1)
	f.ops.Add(1)
	time.Sleep(f.delay)
	resp, err := f.acquire(req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

func (f *fakeBatch) Release(_ context.Context, req *connect.Request[wardenv1.ReleaseRequest]) (*connect.Response[wardenv1.ReleaseResponse], error) {
	f.ones.Add(1)
	f.ops.Add(1)
	time.Sleep(f.delay)
	return connect.NewResponse(&wardenv1.ReleaseResponse{Released: true}), nil
}

func (f *fakeBatch) Batch(_ context.Context, req *connect.Request[wardenv1.BatchRequest]) (*connect.Response[wardenv1.BatchResponse], error) {
	if f.noBatch {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("no Batch"))
	}
	f.batches.Add(1)
	n := int64(len(req.Msg.GetOps()))
	f.ops.Add(n)
	for m := f.maxInCall.Load(); n > m && !f.maxInCall.CompareAndSwap(m, n); m = f.maxInCall.Load() {
	}
	time.Sleep(f.delay)
	out := &wardenv1.BatchResponse{}
	for _, op := range req.Msg.GetOps() {
		if op.GetRelease() != nil {
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

func startBatchFake(t *testing.T, f *fakeBatch, calls int) *client.Batcher {
	mux := http.NewServeMux()
	mux.Handle(wardenv1connect.NewLockServiceHandler(f, connect.WithReadMaxBytes(64<<10)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return client.NewBatcher(wardenv1connect.NewLockServiceClient(srv.Client(), srv.URL), calls)
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
	mux := http.NewServeMux()
	mux.Handle(wardenv1connect.NewLockServiceHandler(f))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
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
}
