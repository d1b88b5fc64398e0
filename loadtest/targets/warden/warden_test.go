package warden

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/loadtest/harness"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// node is a LockService that renews every lease, or, with leader set,
// answers Unavailable naming the node at leader as the shard's leader.
type node struct {
	wardenv1connect.UnimplementedLockServiceHandler
	leader string
	calls  atomic.Int32
}

func (n *node) Renew(context.Context, *connect.Request[wardenv1.RenewRequest]) (*connect.Response[wardenv1.RenewResponse], error) {
	n.calls.Add(1)
	if n.leader == "" {
		return connect.NewResponse(&wardenv1.RenewResponse{}), nil
	}
	e := connect.NewError(connect.CodeUnavailable, errors.New("not the leader"))
	d, err := connect.NewErrorDetail(&wardenv1.NotLeader{ShardId: 1, LeaderNodeId: 2, LeaderAddress: n.leader, Term: 4})
	if err != nil {
		return nil, err
	}
	e.AddDetail(d)
	return nil, e
}

func serve(t *testing.T, n *node) string { return serveHandler(t, n) }

// serveHandler serves a LockService over h2c, as the target speaks, for
// the test's life.
func serveHandler(t *testing.T, svc wardenv1connect.LockServiceHandler) string {
	_, h := wardenv1connect.NewLockServiceHandler(svc)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols) // h2c, as the target speaks
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// An unavailable answer that names the leader sends the retry there and
// reroutes the key's range, with no refresh of the map.
func TestUnavailableNamingTheLeaderReroutes(t *testing.T) {
	leader := &node{}
	leaderURL := serve(t, leader)
	far := &node{leader: strings.TrimPrefix(leaderURL, "http://")}
	farURL := serve(t, far)
	tg, err := New(Config{Endpoints: []string{farURL, leaderURL}, ConnsPerEndpoint: 1, SingleRenewals: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	tg.routes.Store(&[]route{{start: 0, end: 0, endpoint: 0}}) // everything to the far node
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tg.call(ctx, "orders/42", func(c conn) error {
		_, err := c.lock.Renew(ctx, connect.NewRequest(&wardenv1.RenewRequest{Resource: "orders/42", LeaseId: "00"}))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if far.calls.Load() != 1 || leader.calls.Load() != 1 {
		t.Fatalf("calls: far %d, leader %d; want 1 each", far.calls.Load(), leader.calls.Load())
	}
	if rs := *tg.routes.Load(); rs[0].endpoint != 1 {
		t.Fatalf("routes %v: want the key's range on the leader's endpoint (1)", rs)
	}
}

// releaser is a LockService whose Release answers already_released, as
// a node does whose own retry of a Release (after an answer it never
// saw) finds the lease released by the first attempt.
type releaser struct {
	wardenv1connect.UnimplementedLockServiceHandler
}

func (releaser) Release(context.Context, *connect.Request[wardenv1.ReleaseRequest]) (*connect.Response[wardenv1.ReleaseResponse], error) {
	return connect.NewResponse(&wardenv1.ReleaseResponse{AlreadyReleased: true}), nil
}

// The first Release of a lease that answers already_released released
// it (no lost lease for the checker); a second is a repeat (ErrLost).
func TestAlreadyReleasedIsReleasedOnce(t *testing.T) {
	tg, err := New(Config{Endpoints: []string{serveHandler(t, releaser{})}, ConnsPerEndpoint: 1, SingleCalls: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := harness.Lease{Resource: "orders/42", Handle: &lease{id: "00"}}
	if err := tg.Release(ctx, l); err != nil {
		t.Fatalf("first release: %v, want nil", err)
	}
	if err := tg.Release(ctx, l); !errors.Is(err, harness.ErrLost) {
		t.Fatalf("second release: %v, want ErrLost", err)
	}
}
