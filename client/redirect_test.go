package client_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/client"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// notLeaderNode answers every Acquire Unavailable with a detail naming
// the node at leader as the shard's leader, as a node does that could
// not reach it.
type notLeaderNode struct {
	wardenv1connect.UnimplementedLockServiceHandler
	leader string
	calls  atomic.Int32
}

func (n *notLeaderNode) Acquire(context.Context, *connect.Request[wardenv1.AcquireRequest]) (*connect.Response[wardenv1.AcquireResponse], error) {
	n.calls.Add(1)
	e := connect.NewError(connect.CodeUnavailable, errors.New("the node that leads the key's shard did not answer"))
	d, err := connect.NewErrorDetail(&wardenv1.NotLeader{ShardId: 1, LeaderNodeId: 2, LeaderAddress: n.leader, Term: 3})
	if err != nil {
		return nil, err
	}
	e.AddDetail(d)
	return nil, e
}

// A retry goes, at once, to the endpoint an Unavailable answer names as
// the leader (the backoff here is an hour: waiting would end the test's
// context first), and the calls after it start there.
func TestRetryGoesToTheLeaderNamed(t *testing.T) {
	leader, leaderURL := newFakeLocks(t)
	far := &notLeaderNode{leader: strings.TrimPrefix(leaderURL, "http://")}
	_, h := wardenv1connect.NewLockServiceHandler(far)
	farSrv := httptest.NewServer(h)
	defer farSrv.Close()
	c, err := client.NewWithConfig(client.Config{Endpoints: []string{farSrv.URL, leaderURL}, RetryBase: time.Hour, RetryMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := c.Lock(ctx, "orders/42", client.LockOptions{TTL: time.Minute})
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	if far.calls.Load() != 1 || !leader.holds("orders/42") {
		t.Fatalf("the far node saw %d calls and the leader holds the lock: %v; want 1 and true", far.calls.Load(), leader.holds("orders/42"))
	}
	if _, err := c.Lock(ctx, "orders/43", client.LockOptions{TTL: time.Minute}); err != nil || far.calls.Load() != 1 {
		t.Fatalf("second Lock: %v, far node calls %d: want it sent to the leader first", err, far.calls.Load())
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// An endpoint that is not a base URL is refused when the client is made,
// naming it.
func TestEndpointMustBeAURL(t *testing.T) {
	_, err := client.New("127.0.0.1:7070")
	if err == nil || !strings.Contains(err.Error(), `"127.0.0.1:7070"`) {
		t.Fatalf("New(host:port): %v, want an error naming the endpoint", err)
	}
}
