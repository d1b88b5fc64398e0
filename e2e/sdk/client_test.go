package client_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/client"
	"github.com/warden-dev/warden/placement"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/rpc"
	"github.com/warden-dev/warden/server"
)

func TestMain(m *testing.M) {
	placement.RouteRaftLogs(slog.LevelError + 4)
	slog.SetDefault(slog.New(slog.NewTextHandler(discard{}, nil)))
	goleak.VerifyTestMain(m)
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

type cluster struct {
	t     *testing.T
	dev   *server.Dev
	srv   *httptest.Server
	locks wardenv1connect.LockServiceClient
}

func startCluster(t *testing.T, opts ...connect.HandlerOption) *cluster {
	t.Helper()
	dev, err := server.StartDev(server.DevConfig{DataDir: t.TempDir(), Router: router.Config{ScanInterval: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, dev: dev, srv: httptest.NewServer(rpc.NewHandler(dev.Router, opts...))}
	c.locks = wardenv1connect.NewLockServiceClient(c.srv.Client(), c.srv.URL)
	t.Cleanup(func() { c.srv.Close(); dev.Close() })
	return c
}

// partition is an HTTP transport that a test can cut off from the
// cluster, as a network partition would.
type partition struct {
	cut atomic.Bool
	rt  http.RoundTripper
}

func (p *partition) RoundTrip(r *http.Request) (*http.Response, error) {
	if p.cut.Load() {
		return nil, errors.New("test: partitioned")
	}
	return p.rt.RoundTrip(r)
}

func (c *cluster) client(p *partition) *client.Client {
	c.t.Helper()
	cfg := client.Config{Endpoints: []string{c.srv.URL}}
	if p != nil {
		p.rt = c.srv.Client().Transport
		cfg.HTTPClient = &http.Client{Transport: p}
	} else {
		cfg.HTTPClient = c.srv.Client()
	}
	cl, err := client.NewWithConfig(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

func (c *cluster) describe(resource string) *wardenv1.DescribeResponse {
	c.t.Helper()
	resp, err := c.locks.Describe(context.Background(), connect.NewRequest(&wardenv1.DescribeRequest{Resource: resource}))
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.Msg
}

func (c *cluster) leader() int {
	for {
		for i, n := range c.dev.Nodes {
			if id, _, ok, err := n.Node.NodeHost().GetLeaderID(placement.FirstDataShard); err == nil && ok && id == n.Node.ID() {
				return i
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func bg(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestLockUnlock(t *testing.T) {
	c := startCluster(t)
	cl := c.client(nil)
	l, err := cl.Lock(bg(t), "r", client.LockOptions{TTL: 3 * time.Second, Holder: "sdk"})
	if err != nil {
		t.Fatal(err)
	}
	if d := c.describe("r"); !d.GetHeld() || d.GetFencingToken() != l.Token() || d.GetHolder() != "sdk" {
		t.Fatalf("describe %v, lease token %d", d, l.Token())
	}
	select {
	case <-l.Done():
		t.Fatal("Done closed while held")
	default:
	}
	_, err = cl.Lock(bg(t), "r", client.LockOptions{})
	var he *client.HeldError
	if !errors.Is(err, client.ErrHeld) || !errors.As(err, &he) || he.FencingToken != l.Token() {
		t.Fatalf("second lock: %v", err)
	}
	if err := l.Unlock(bg(t)); err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	if !errors.Is(l.Err(), client.ErrUnlocked) {
		t.Fatalf("Err after Unlock: %v", l.Err())
	}
	if d := c.describe("r"); d.GetHeld() {
		t.Fatalf("held after Unlock: %v", d)
	}
	if err := l.Unlock(bg(t)); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
}

// Renewal keeps a lease alive through leader changes: far longer than its
// TTL, with leadership moving every second.
func TestRenewalSurvivesLeaderChanges(t *testing.T) {
	c := startCluster(t)
	l, err := c.client(nil).Lock(bg(t), "r", client.LockOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(context.Background())
	first := l.ExpiresAt()
	for i := range 4 {
		time.Sleep(time.Second)
		lead := c.leader()
		_ = c.dev.Nodes[lead].Node.NodeHost().RequestLeaderTransfer(placement.FirstDataShard, c.dev.Nodes[(lead+1)%server.DevNodes].Node.ID())
		for deadline := time.Now().Add(3 * time.Second); c.leader() == lead; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("transfer %d: the leader did not change from node %d", i+1, lead+1)
			}
		}
	}
	time.Sleep(time.Second)
	select {
	case <-l.Done():
		t.Fatalf("lease lost through leader changes: %v", l.Err())
	default:
	}
	if d := c.describe("r"); !d.GetHeld() || d.GetFencingToken() != l.Token() || !l.ExpiresAt().After(first) {
		t.Fatalf("after 5 s of a 2 s lease: %v (expiry %v, first %v)", d, l.ExpiresAt(), first)
	}
}

// Without quorum renewals fail; Done closes before the server-side
// expiry of the lease's last renewal.
func TestDoneClosesBeforeExpiryWithoutQuorum(t *testing.T) {
	c := startCluster(t)
	l, err := c.client(nil).Lock(bg(t), "r", client.LockOptions{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lead := c.leader()
	for i, n := range c.dev.Nodes {
		if i != lead {
			if err := n.Node.NodeHost().StopReplica(placement.FirstDataShard, n.Node.ID()); err != nil {
				t.Fatal(err)
			}
		}
	}
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done did not close without quorum")
	}
	closed := time.Now()
	if !errors.Is(l.Err(), client.ErrLeaseUncertain) {
		t.Fatalf("Err: %v", l.Err())
	}
	if !closed.Before(l.ExpiresAt()) {
		t.Fatalf("Done closed at %v, not before the server's expiry %v", closed, l.ExpiresAt())
	}
}

// Case L5: a client cut off from every node closes Done strictly before
// the server grants the lock to the next waiter.
func TestPartitionedClientStopsFirst(t *testing.T) {
	c := startCluster(t)
	p := &partition{}
	l, err := c.client(p).Lock(bg(t), "r", client.LockOptions{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // a renewal or so succeeds
	p.cut.Store(true)
	doneAt := make(chan time.Time, 1)
	go func() { <-l.Done(); doneAt <- time.Now() }()
	b, err := c.client(nil).Lock(bg(t), "r", client.LockOptions{TTL: 3 * time.Second, Wait: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	grantedAt := time.Now()
	defer b.Unlock(context.Background())
	closed := <-doneAt
	if !closed.Before(grantedAt) {
		t.Fatalf("A's Done closed at %v, after B was granted at %v", closed, grantedAt)
	}
	if b.Token() <= l.Token() {
		t.Fatalf("B's token %d after A's %d", b.Token(), l.Token())
	}
}

// A lost Acquire response is retried with the same request id: the client
// gets the lease the first attempt created, and only one grant is made.
func TestLockRetryGetsTheOriginalLease(t *testing.T) {
	var dropped atomic.Bool
	c := startCluster(t, connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			resp, err := next(ctx, req)
			if _, ok := req.Any().(*wardenv1.AcquireRequest); ok && err == nil && dropped.CompareAndSwap(false, true) {
				return nil, connect.NewError(connect.CodeUnavailable, errors.New("test: response lost"))
			}
			return resp, err
		}
	})))
	cl := c.client(nil)
	l, err := cl.Lock(bg(t), "r", client.LockOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !dropped.Load() {
		t.Fatal("no response was dropped")
	}
	if d := c.describe("r"); d.GetFencingToken() != l.Token() {
		t.Fatalf("lock token %d, lease %d", d.GetFencingToken(), l.Token())
	}
	next, err := cl.Lock(bg(t), "other", client.LockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() != l.Token()+1 {
		t.Fatalf("next grant %d after %d: the retried acquire granted twice", next.Token(), l.Token())
	}
	_ = next.Unlock(bg(t))
	_ = l.Unlock(bg(t))
}

func TestLockWaits(t *testing.T) {
	c := startCluster(t)
	cl := c.client(nil)
	a, err := cl.Lock(bg(t), "r", client.LockOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = a.Unlock(context.Background())
	}()
	b, err := cl.Lock(bg(t), "r", client.LockOptions{TTL: 10 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Unlock(context.Background())
	if b.Token() <= a.Token() {
		t.Fatalf("token %d after %d", b.Token(), a.Token())
	}
	_, err = cl.Lock(bg(t), "r", client.LockOptions{Wait: 300 * time.Millisecond})
	if !errors.Is(err, client.ErrWaitTimeout) {
		t.Fatalf("short wait: %v", err)
	}
}

// LockAll takes locks in sorted order and gives back what it took when one
// fails.
func TestLockAll(t *testing.T) {
	c := startCluster(t)
	cl := c.client(nil)
	held, err := cl.Lock(bg(t), "b", client.LockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.LockAll(bg(t), []string{"c", "b", "a"}, client.LockOptions{}); !errors.Is(err, client.ErrHeld) {
		t.Fatalf("LockAll over a held lock: %v", err)
	}
	if d := c.describe("a"); d.GetHeld() || d.GetFencingToken() == 0 {
		t.Fatalf("a should have been locked first and then released: %v", d)
	}
	if d := c.describe("c"); d.GetFencingToken() != 0 {
		t.Fatalf("c was locked although b, before it, failed: %v", d)
	}
	_ = held.Unlock(bg(t))
	all, err := cl.LockAll(bg(t), []string{"c", "b", "a", "a"}, client.LockOptions{})
	if err != nil || len(all) != 3 || all[0].Resource() != "a" || all[2].Resource() != "c" {
		t.Fatalf("LockAll: %v %v", all, err)
	}
	for _, l := range all {
		_ = l.Unlock(bg(t))
	}
}

// A Lock with the caller's request id may get back a grant older than
// the call (a retry after giving up): its lease is renewed at once, so
// that the local deadline runs from that renewal's send time and never
// from the call's, which would lie beyond the grant's server expiry.
func TestLockReplayRenewsAtOnce(t *testing.T) {
	c := startCluster(t)
	ctx := bg(t)
	first, err := c.locks.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "replay", RequestId: "mine", LeaseTtl: durationpb.New(10 * time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // real time: the replay comes later than the grant
	l, err := c.client(nil).Lock(ctx, "replay", client.LockOptions{TTL: 10 * time.Second, RequestID: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(context.Background())
	if l.Token() != first.Msg.GetFencingToken() {
		t.Fatalf("the replay got token %d; the grant was %d", l.Token(), first.Msg.GetFencingToken())
	}
	if !l.ExpiresAt().After(first.Msg.GetExpiresAt().AsTime()) {
		t.Fatalf("the replayed lease's expiry %v is the grant's (%v): it was not renewed at once", l.ExpiresAt(), first.Msg.GetExpiresAt().AsTime())
	}
}

// A safety margin outside [0, TTL) is refused before anything is
// acquired: a negative one would keep Done open past the point where the
// server may grant the lock to another holder.
func TestLockRefusesBadSafetyMargin(t *testing.T) {
	c := startCluster(t)
	cl := c.client(nil)
	for _, m := range []time.Duration{-time.Second, 5 * time.Second, 6 * time.Second} {
		_, err := cl.Lock(bg(t), "margin", client.LockOptions{TTL: 5 * time.Second, SafetyMargin: m})
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "SafetyMargin") {
			t.Errorf("SafetyMargin %v with a 5 s TTL: %v, want invalid_argument naming it", m, err)
		}
	}
	// The shard's default TTL (30 s) is below this margin: the grant is
	// released and the call refused.
	_, err := cl.Lock(bg(t), "margin", client.LockOptions{SafetyMargin: time.Minute})
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("SafetyMargin 1m with the default TTL: %v, want invalid_argument", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.describe("margin").GetHeld() {
		if time.Now().After(deadline) {
			t.Fatal("the grant refused for its margin is still held")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
