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

func serve(t *testing.T, n *node) string {
	_, h := wardenv1connect.NewLockServiceHandler(n)
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
