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
	batches, ones atomic.Int64
	renewals      atomic.Int64
}

var expiry = time.Unix(1000, 0)

func (f *fakeLocks) Renew(_ context.Context, req *connect.Request[wardenv1.RenewRequest]) (*connect.Response[wardenv1.RenewResponse], error) {
	f.ones.Add(1)
	f.renewals.Add(1)
	if req.Msg.GetLeaseId() != "good" {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the lease is not current"))
	}
	return connect.NewResponse(&wardenv1.RenewResponse{ExpiresAt: timestamppb.New(expiry)}), nil
}

func (f *fakeLocks) RenewBatch(_ context.Context, req *connect.Request[wardenv1.RenewBatchRequest]) (*connect.Response[wardenv1.RenewBatchResponse], error) {
	if f.noBatch {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("no RenewBatch"))
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
	mux.Handle(wardenv1connect.NewLockServiceHandler(f))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return client.NewRenewer(wardenv1connect.NewLockServiceClient(srv.Client(), srv.URL), linger)
}

// renewAll renews n leases at once ("good" unless bad(i)) and checks
// each outcome.
func renewAll(t *testing.T, r *client.Renewer, n int, bad func(int) bool) {
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
			sent, exp, err := r.Renew(ctx, fmt.Sprintf("r%d", i), lease)
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
