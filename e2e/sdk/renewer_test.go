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
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/warden-dev/warden/client"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// fakeLocks answers renewals of lease "good" with an expiry and of any
// other lease with failed_precondition; it counts the calls, and with
// noBatch it does not implement RenewBatch (an older server).
type fakeLocks struct {
	wardenv1connect.UnimplementedLockServiceHandler
	noBatch       bool
	refuse        bool          // RenewBatch answers resource_exhausted
	delay         time.Duration // each plain Renew takes this long
	batches, ones atomic.Int64
	inFlight      atomic.Int64 // plain Renew calls being served
	maxInFlight   atomic.Int64
	renewals      atomic.Int64
}

var expiry = time.Unix(1000, 0)

func (f *fakeLocks) Renew(_ context.Context, req *connect.Request[wardenv1.RenewRequest]) (*connect.Response[wardenv1.RenewResponse], error) {
	f.ones.Add(1)
	f.renewals.Add(1)
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for m := f.maxInFlight.Load(); n > m && !f.maxInFlight.CompareAndSwap(m, n); m = f.maxInFlight.Load() {
	}
	time.Sleep(f.delay)
	if req.Msg.GetLeaseId() != "good" {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the lease is not current"))
	}
	return connect.NewResponse(&wardenv1.RenewResponse{ExpiresAt: timestamppb.New(expiry)}), nil
}

func (f *fakeLocks) RenewBatch(_ context.Context, req *connect.Request[wardenv1.RenewBatchRequest]) (*connect.Response[wardenv1.RenewBatchResponse], error) {
	if f.noBatch {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("no RenewBatch"))
	}
	if f.refuse {
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("refused"))
	}
	f.batches.Add(1)
	out := &wardenv1.RenewBatchResponse{}
	for _, r := range req.Msg.GetRenewals() {
		f.renewals.Add(1)
		if r.GetLeaseId() != "good" {
			out.Outcomes = append(out.Outcomes, &wardenv1.RenewOutcome{Code: "failed_precondition", Message: "the lease is not current"})
			continue
		}
		out.Outcomes = append(out.Outcomes, &wardenv1.RenewOutcome{ExpiresAt: timestamppb.New(expiry)})
	}
	return connect.NewResponse(out), nil
}

func startFake(t *testing.T, f *fakeLocks, linger time.Duration) *client.Renewer {
	mux := http.NewServeMux()
	// The server's request limit (rpc.NewHandler).
	mux.Handle(wardenv1connect.NewLockServiceHandler(f, connect.WithReadMaxBytes(64<<10)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return client.NewRenewer(wardenv1connect.NewLockServiceClient(srv.Client(), srv.URL), linger)
}

// renewAll renews n leases at once ("good" unless bad(i)) and checks
// each outcome.
func renewAll(t *testing.T, r *client.Renewer, n int, bad func(int) bool) {
	renewNamed(t, r, n, 0, bad)
}

// renewNamed is renewAll with resource names padded to pad bytes.
func renewNamed(t *testing.T, r *client.Renewer, n, pad int, bad func(int) bool) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			lease := "good"
			if bad(i) {
				lease = "stale"
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			before := time.Now()
			sent, exp, err := r.Renew(ctx, fmt.Sprintf("r%0*d", pad, i), lease)
			switch {
			case bad(i) && connect.CodeOf(err) != connect.CodeFailedPrecondition:
				t.Errorf("renewal %d of a stale lease: %v, want failed_precondition", i, err)
			case !bad(i) && (err != nil || !exp.Equal(expiry)):
				t.Errorf("renewal %d: %v %v", i, exp, err)
			case err == nil && sent.Before(before):
				t.Errorf("renewal %d: sent %v before it was asked for at %v", i, sent, before)
			}
		})
	}
	wg.Wait()
}

// Renewals due within the linger period share calls; each gets its own
// outcome.
func TestRenewerBatches(t *testing.T) {
	f := &fakeLocks{}
	r := startFake(t, f, 200*time.Millisecond)
	const n = 200
	renewAll(t, r, n, func(i int) bool { return i%7 == 0 })
	if f.renewals.Load() != n || f.ones.Load() != 0 {
		t.Fatalf("%d renewals, %d plain Renew calls; want %d and 0", f.renewals.Load(), f.ones.Load(), n)
	}
	if b := f.batches.Load(); b > 3 {
		t.Fatalf("%d RenewBatch calls for %d renewals due together", b, n)
	}
	t.Logf("%d renewals in %d calls", n, f.batches.Load())
}

// A server without RenewBatch is sent plain Renew calls.
func TestRenewerFallsBackToRenew(t *testing.T) {
	f := &fakeLocks{noBatch: true}
	r := startFake(t, f, 0)
	renewAll(t, r, 20, func(i int) bool { return i == 3 })
	if f.ones.Load() != 20 || f.batches.Load() != 0 {
		t.Fatalf("%d Renew and %d RenewBatch calls, want 20 and 0", f.ones.Load(), f.batches.Load())
	}
}

// A thousand renewals of long names do not fit the server's 64 KiB
// request limit in one call: they go in several, none refused.
func TestRenewerSplitsBySize(t *testing.T) {
	f := &fakeLocks{}
	r := startFake(t, f, 200*time.Millisecond)
	renewNamed(t, r, 1000, 200, func(int) bool { return false })
	if f.ones.Load() != 0 || f.batches.Load() < 4 {
		t.Fatalf("%d RenewBatch and %d plain Renew calls: want the batch split by size, never refused", f.batches.Load(), f.ones.Load())
	}
}

// A batch refused as a whole is renewed lease by lease, concurrently (one
// after another, slow renewals would miss their callers' deadlines).
func TestRenewerRenewsOneByOneWhenRefused(t *testing.T) {
	f := &fakeLocks{refuse: true, delay: 200 * time.Millisecond}
	r := startFake(t, f, 10*time.Millisecond)
	renewAll(t, r, 20, func(i int) bool { return i == 3 })
	if f.ones.Load() != 20 || f.maxInFlight.Load() < 2 {
		t.Fatalf("%d plain Renew calls, at most %d at once: want 20, concurrently", f.ones.Load(), f.maxInFlight.Load())
	}
}
