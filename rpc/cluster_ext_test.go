package rpc_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/lni/dragonboat/v4"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/placement"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/rpc"
	"github.com/warden-dev/warden/server"
)

func TestMain(m *testing.M) {
	placement.RouteRaftLogs(slog.LevelError + 4) // transport errors of stopped nodes are expected here
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	goleak.VerifyTestMain(m)
}

// cluster is a dev cluster in this process behind an HTTP test server.
type cluster struct {
	t     testing.TB
	cfg   server.DevConfig
	opts  []connect.HandlerOption
	dev   *server.Dev
	srv   *httptest.Server
	locks wardenv1connect.LockServiceClient
}

func startCluster(t testing.TB, cfg server.DevConfig, opts ...connect.HandlerOption) *cluster {
	t.Helper()
	cfg.DataDir = t.TempDir()
	if cfg.Router.ScanInterval == 0 {
		cfg.Router.ScanInterval = 50 * time.Millisecond
	}
	c := &cluster{t: t, cfg: cfg, opts: opts}
	c.start()
	t.Cleanup(c.stop)
	return c
}

func (c *cluster) start() {
	c.t.Helper()
	dev, err := server.StartDev(c.cfg)
	if err != nil {
		c.t.Fatalf("start dev cluster: %v", err)
	}
	c.dev = dev
	c.srv = httptest.NewServer(rpc.NewHandler(dev.Router, c.opts...))
	c.locks = wardenv1connect.NewLockServiceClient(c.srv.Client(), c.srv.URL)
}

func (c *cluster) stop() {
	if c.dev == nil {
		return
	}
	c.srv.Close()
	c.dev.Close()
	c.dev = nil
}

// restart stops every node and starts them again on the same data.
func (c *cluster) restart() {
	c.t.Helper()
	c.stop()
	c.start()
}

const shardID = placement.FirstDataShard

// leader returns the index in dev.Nodes of the data shard's leader,
// waiting for an election.
func (c *cluster) leader() int {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for i, n := range c.dev.Nodes {
			id, _, valid, err := n.Node.NodeHost().GetLeaderID(shardID)
			if err == nil && valid && id == n.Node.ID() {
				return i
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatal("no leader elected")
	return -1
}

// settled waits until every node knows the data shard's same leader: a
// test whose bounds are shorter than an election starts from there, for a
// node that has not yet heard from a new leader answers unavailable.
func (c *cluster) settled() {
	c.t.Helper()
	waitFor(c.t, func() bool {
		var lead uint64
		for _, n := range c.dev.Nodes {
			id, _, valid, err := n.Node.NodeHost().GetLeaderID(shardID)
			if err != nil || !valid || (lead != 0 && id != lead) {
				return false
			}
			lead = id
		}
		return true
	})
}

func (c *cluster) stopReplica(i int) {
	c.t.Helper()
	n := c.dev.Nodes[i].Node
	if err := n.NodeHost().StopReplica(shardID, n.ID()); err != nil {
		c.t.Fatalf("stop replica %d: %v", n.ID(), err)
	}
}

func (c *cluster) startReplica(i int) {
	c.t.Helper()
	for range 100 { // a stop completes in the background
		err := c.dev.Nodes[i].Node.StartDataShard(c.dev.Router.Map().Shard(shardID), c.dev.Members())
		if !errors.Is(err, dragonboat.ErrShardAlreadyExist) {
			if err != nil {
				c.t.Fatal(err)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatal("the stopped replica never went away")
}

// localLock reads a resource's lock record from replica i without a
// quorum round.
func (c *cluster) localLock(i int, resource string) (*shardv1.LockRecord, error) {
	out, err := c.dev.Nodes[i].Node.NodeHost().StaleRead(shardID, &shardv1.Query{Query: &shardv1.Query_Describe{Describe: &shardv1.DescribeQuery{Resource: resource}}})
	if err != nil {
		return nil, err
	}
	return out.(*shardv1.QueryResult).GetLock(), nil
}

// attempt returns the latest attempt (its lease id) that the leader's
// replica has applied for request id reqID on resource, or nil.
func (c *cluster) attempt(resource, reqID string) []byte {
	c.t.Helper()
	out, err := c.dev.Nodes[c.leader()].Node.NodeHost().StaleRead(shardID, &shardv1.Query{Query: &shardv1.Query_Dedup{Dedup: &shardv1.DedupQuery{Resource: resource, RequestId: reqID}}})
	if err != nil {
		return nil
	}
	return out.(*shardv1.QueryResult).GetDedup().GetAttemptId()
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return c
}

func (c *cluster) acquire(resource, requestID string, ttl time.Duration) (*wardenv1.AcquireResponse, error) {
	return c.acquireWait(ctx(c.t), resource, requestID, ttl, 0)
}

// acquireWait is Acquire with a wait_timeout.
func (c *cluster) acquireWait(ctx context.Context, resource, requestID string, ttl, wait time.Duration) (*wardenv1.AcquireResponse, error) {
	req := &wardenv1.AcquireRequest{Resource: resource, RequestId: requestID}
	if ttl != 0 {
		req.LeaseTtl = durationpb.New(ttl)
	}
	if wait != 0 {
		req.WaitTimeout = durationpb.New(wait)
	}
	resp, err := c.locks.Acquire(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (c *cluster) mustAcquire(resource, requestID string, ttl time.Duration) *wardenv1.AcquireResponse {
	c.t.Helper()
	resp, err := c.acquire(resource, requestID, ttl)
	if err != nil {
		c.t.Fatalf("acquire %s %s: %v", resource, requestID, err)
	}
	return resp
}

func (c *cluster) renew(resource, leaseID string) (*wardenv1.RenewResponse, error) {
	resp, err := c.locks.Renew(ctx(c.t), connect.NewRequest(&wardenv1.RenewRequest{Resource: resource, LeaseId: leaseID}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (c *cluster) release(resource, leaseID string) (bool, error) {
	resp, err := c.locks.Release(ctx(c.t), connect.NewRequest(&wardenv1.ReleaseRequest{Resource: resource, LeaseId: leaseID}))
	if err != nil {
		return false, err
	}
	return resp.Msg.GetReleased(), nil
}

func (c *cluster) describe(resource string) *wardenv1.DescribeResponse {
	c.t.Helper()
	resp, err := c.locks.Describe(ctx(c.t), connect.NewRequest(&wardenv1.DescribeRequest{Resource: resource}))
	if err != nil {
		c.t.Fatalf("describe %s: %v", resource, err)
	}
	return resp.Msg
}

// acquireWhenFree polls a fail-fast Acquire until it is granted, and
// returns the grant and the time it was answered.
func (c *cluster) acquireWhenFree(resource, requestID string, ttl, within time.Duration) (*wardenv1.AcquireResponse, time.Time) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		resp, err := c.acquire(resource, requestID, ttl)
		if err == nil {
			return resp, time.Now()
		}
		if code := connect.CodeOf(err); code != connect.CodeAborted && code != connect.CodeUnavailable {
			c.t.Fatalf("acquire %s: %v", resource, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("%s was not granted within %v", resource, within)
	return nil, time.Time{}
}

func wantCode(t *testing.T, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("got %v, want %v", err, code)
	}
}

// dropResponses is a server interceptor that lets the first n calls
// matching drop run to completion and then loses their responses, as a
// network would.
func dropResponses(n int32, drop func(connect.AnyRequest) bool) connect.HandlerOption {
	var left atomic.Int32
	left.Store(n)
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			resp, err := next(ctx, req)
			if drop(req) && left.Add(-1) >= 0 {
				return nil, connect.NewError(connect.CodeUnavailable, errors.New("test: response lost"))
			}
			return resp, err
		}
	}))
}
