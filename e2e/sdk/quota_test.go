package client_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/client"
)

// The quota SDK: Reserve, the exhausted error, Commit, Release; a
// reserve whose first answer is lost is retried with the same
// reservation id and charged once.
func TestQuotaSDK(t *testing.T) {
	var lost atomic.Int32
	lost.Store(1)
	c := startCluster(t, connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			resp, err := next(ctx, req)
			if req.Spec().Procedure == "/warden.v1.QuotaService/Reserve" && lost.Add(-1) >= 0 {
				return nil, connect.NewError(connect.CodeUnavailable, errors.New("test: response lost"))
			}
			return resp, err
		}
	})))
	cl, err := client.New(c.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.SetLimit(ctx, "gpu", 10, 0); err != nil {
		t.Fatal(err)
	}
	r, err := cl.Reserve(ctx, "gpu/a", 6, client.ReserveOptions{TTL: time.Minute})
	if err != nil || r.Remaining != 4 {
		t.Fatalf("reserve (its first answer lost): %+v %v", r, err)
	}
	_, err = cl.Reserve(ctx, "gpu/b", 5, client.ReserveOptions{})
	var ex *client.ExhaustedError
	if !errors.Is(err, client.ErrExhausted) || !errors.As(err, &ex) || ex.Level != "gpu" || ex.Remaining != 4 || ex.RetryAfter <= 0 {
		t.Fatalf("a reserve past the limit: %v (%+v)", err, ex)
	}
	if n, err := cl.Commit(ctx, r, 2); err != nil || n != 2 {
		t.Fatalf("commit: %d %v", n, err)
	}
	if _, err := cl.ReleaseReservation(ctx, r); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("release of a committed reservation: %v", err)
	}
	r2, err := cl.Reserve(ctx, "gpu/b", 8, client.ReserveOptions{})
	if err != nil || r2.Remaining != 0 {
		t.Fatalf("the rest of the limit (2 committed of 10): %+v %v", r2, err)
	}
	if ok, err := cl.ReleaseReservation(ctx, r2); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
}
