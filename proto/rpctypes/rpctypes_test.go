package rpctypes_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/proto/rpctypes"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// unknownDescriber answers every Describe with a server-side Unknown.
type unknownDescriber struct {
	wardenv1connect.UnimplementedLockServiceHandler
}

func (unknownDescriber) Describe(context.Context, *connect.Request[wardenv1.DescribeRequest]) (*connect.Response[wardenv1.DescribeResponse], error) {
	return nil, connect.NewError(connect.CodeUnknown, errors.New("a server's own unknown"))
}

// Retryable: Unavailable, or a connection that broke before the answer
// (a node killed mid-call) — never the server's own answer of another
// code, the caller's deadline, or an error that is not Connect's.
func TestRetryable(t *testing.T) {
	_, h := wardenv1connect.NewLockServiceHandler(unknownDescriber{})
	wire := httptest.NewServer(h)
	defer wire.Close()
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Headers out, then the process "dies" before the body.
		w.Header().Set("Content-Type", "application/proto")
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	defer broken.Close()
	describe := func(url string, ctx context.Context) error {
		_, err := wardenv1connect.NewLockServiceClient(http.DefaultClient, url).Describe(ctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: "r"}))
		return err
	}
	brokenErr := describe(broken.URL, context.Background())
	if connect.CodeOf(brokenErr) != connect.CodeUnknown || connect.IsWireError(brokenErr) {
		t.Fatalf("premise: a connection broken mid-answer gives %v (wire: %v), not a local Unknown", brokenErr, connect.IsWireError(brokenErr))
	}
	expired, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-expired.Done()
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"unavailable", connect.NewError(connect.CodeUnavailable, errors.New("no leader")), true},
		{"connection broken mid-answer", brokenErr, true},
		{"the server's own unknown", describe(wire.URL, context.Background()), false},
		{"the caller's deadline", describe(wire.URL, expired), false},
		{"failed precondition", connect.NewError(connect.CodeFailedPrecondition, errors.New("lease ended")), false},
		{"not a Connect error", errors.New("local"), false},
		{"nil", nil, false},
	} {
		if got := rpctypes.Retryable(c.err); got != c.want {
			t.Errorf("%s: Retryable(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// LeaderAddress: the address a NotLeader or RangeMoved detail names, ""
// when the detail names none or there is none.
func TestLeaderAddress(t *testing.T) {
	withDetail := func(m proto.Message) error {
		e := connect.NewError(connect.CodeUnavailable, errors.New("not here"))
		d, err := connect.NewErrorDetail(m)
		if err != nil {
			t.Fatal(err)
		}
		e.AddDetail(d)
		return fmt.Errorf("wrapped: %w", e)
	}
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"not leader", withDetail(&wardenv1.NotLeader{ShardId: 2, LeaderAddress: "10.0.0.2:7070", LeaderNodeId: 2, Term: 3}), "10.0.0.2:7070"},
		{"range moved", withDetail(&wardenv1.RangeMoved{ShardId: 4, LeaderAddress: "10.0.0.3:7070"}), "10.0.0.3:7070"},
		{"leader unknown", withDetail(&wardenv1.NotLeader{ShardId: 2}), ""},
		{"no detail", connect.NewError(connect.CodeUnavailable, errors.New("no leader")), ""},
		{"not a Connect error", errors.New("local"), ""},
	} {
		if got := rpctypes.LeaderAddress(c.err); got != c.want {
			t.Errorf("%s: LeaderAddress = %q, want %q", c.name, got, c.want)
		}
	}
}
