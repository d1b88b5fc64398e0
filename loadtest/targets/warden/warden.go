// Package warden is the load harness's adapter for Warden itself: the
// LockService, QuotaService and AdminService over Connect, and fault
// injection on a deploy/local cluster.
package warden

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/client"
	"github.com/warden-dev/warden/keyspace"
	"github.com/warden-dev/warden/loadtest/harness"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// Config configures the target.
type Config struct {
	// Endpoints are the nodes' base URLs; requests are spread over them
	// (a node that does not lead the shard forwards to the one that does).
	Endpoints []string
	// ConnsPerEndpoint is how many HTTP/2 connections each endpoint gets
	// (default 4): one connection carries at most the server's stream
	// limit of concurrent requests.
	ConnsPerEndpoint int
	// SingleRenewals sends each renewal in a Renew call of its own; by
	// default the renewals sent to one endpoint within RenewLinger of each
	// other share RenewBatch calls (client.Renewer), as the Go SDK's do.
	SingleRenewals bool
	// RenewLinger is how long a renewal waits to be batched (default
	// client.DefaultLinger).
	RenewLinger time.Duration
	// SingleCalls sends each acquire and release in a call of its own; by
	// default those that meet at one endpoint share Batch calls
	// (client.Batcher, DefaultBatchCalls in flight), as the Go SDK's do.
	// Acquires that wait are always sent alone.
	SingleCalls bool
	// BatchCalls is how many Batch calls each endpoint's Batcher keeps in
	// flight (default client.DefaultBatchCalls): fewer carry more ops each.
	BatchCalls int
	// ClusterScript is deploy/local/cluster.sh (run with bash), for the
	// kill and restart faults; ClusterEnv its environment
	// (WARDEN_CLUSTER_DIR, ports).
	ClusterScript string
	ClusterEnv    []string
	// TLS, if set, is the client TLS config of https endpoints (a secure
	// cluster: cluster.sh start --secure); without it the target speaks
	// cleartext HTTP/2.
	TLS *tls.Config
	// Token, if set, is the bearer token every call carries.
	Token string
}

// Target drives a Warden cluster. Like a smart client, it sends each
// request to the node that leads the key's shard, by a placement map it
// refreshes every second (ListShards, ListNodes); a stale map costs one
// forward by the node it reached. An unavailable answer that names the
// shard's leader (a NotLeader or RangeMoved detail) reroutes the key's
// range there at once. The refresh stays: a node forwards a call that a
// stale route sent it, so a stale route is rarely answered unavailable.
type Target struct {
	cfg    Config
	conns  []conn // ConnsPerEndpoint connections to each endpoint in turn
	admins []wardenv1connect.AdminServiceClient
	// killed are the nodes (1-based) that kill faults took since the last
	// restart; faults write it and the route refresh reads it.
	killedMu sync.Mutex
	killed   []int
	routes   atomic.Pointer[[]route]
	stop     chan struct{}
}

// route sends the keys whose hash lies in [start, end) (end 0: 2^64) to
// endpoint.
type route struct {
	start, end uint64
	endpoint   int
}

type conn struct {
	endpoint int
	lock     wardenv1connect.LockServiceClient
	quota    wardenv1connect.QuotaServiceClient
	renewer  *client.Renewer // shared by the endpoint's connections
	batcher  *client.Batcher // likewise
}

// New returns a target for the cluster at cfg.Endpoints.
func New(cfg Config) (*Target, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("warden target: no endpoints")
	}
	if cfg.ConnsPerEndpoint <= 0 {
		cfg.ConnsPerEndpoint = 4
	}
	if cfg.RenewLinger == 0 {
		cfg.RenewLinger = client.DefaultLinger
	}
	t := &Target{cfg: cfg, stop: make(chan struct{})}
	for i, e := range cfg.Endpoints {
		var renewer *client.Renewer
		var batcher *client.Batcher
		auth := client.WithToken(cfg.Token)
		for range cfg.ConnsPerEndpoint {
			tr := &http.Transport{Protocols: new(http.Protocols), MaxIdleConnsPerHost: 16, TLSClientConfig: cfg.TLS}
			if cfg.TLS != nil {
				tr.Protocols.SetHTTP2(true)
			} else {
				tr.Protocols.SetUnencryptedHTTP2(true)
			}
			hc := &http.Client{Transport: tr}
			lock := wardenv1connect.NewLockServiceClient(hc, e, auth)
			if renewer == nil {
				renewer = client.NewRenewer(lock, cfg.RenewLinger)
				batcher = client.NewBatcher(lock, cmp.Or(cfg.BatchCalls, client.DefaultBatchCalls))
			}
			t.conns = append(t.conns, conn{
				endpoint: i,
				lock:     lock,
				quota:    wardenv1connect.NewQuotaServiceClient(hc, e, auth),
				renewer:  renewer,
				batcher:  batcher,
			})
		}
		admin := http.DefaultClient
		if cfg.TLS != nil {
			admin = &http.Client{Transport: &http.Transport{TLSClientConfig: cfg.TLS, ForceAttemptHTTP2: true}}
		}
		// Backup streams are mostly random lease ids: accepting gzip would
		// cost the serving node CPU for little (warden admin backup does
		// not either).
		t.admins = append(t.admins, wardenv1connect.NewAdminServiceClient(admin, e, auth, connect.WithAcceptCompression("gzip", nil, nil)))
	}
	go t.refreshRoutes()
	return t, nil
}

// refreshRoutes reloads the routes every second until Close.
func (t *Target) refreshRoutes() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if rs, err := t.loadRoutes(ctx); err == nil {
			t.routes.Store(&rs)
		}
		cancel()
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
	}
}

func (t *Target) loadRoutes(ctx context.Context) ([]route, error) {
	nodes, err := adminCall(ctx, t, func(a wardenv1connect.AdminServiceClient) (*connect.Response[wardenv1.ListNodesResponse], error) {
		return a.ListNodes(ctx, connect.NewRequest(&wardenv1.ListNodesRequest{}))
	})
	if err != nil {
		return nil, err
	}
	endpointOf := map[uint64]int{}
	for _, n := range nodes.GetNodes() {
		if i, ok := t.endpointAt(n.GetListenAddr()); ok {
			endpointOf[n.GetId()] = i
		}
	}
	shards, err := t.shards(ctx)
	if err != nil {
		return nil, err
	}
	var rs []route
	for _, s := range shards {
		if e, ok := endpointOf[s.GetLeaderNodeId()]; ok {
			rs = append(rs, route{s.GetRangeStart(), s.GetRangeEnd(), e})
		}
	}
	return rs, nil
}

// endpointAt returns the index of the endpoint at addr ("host:port").
func (t *Target) endpointAt(addr string) (int, bool) {
	if addr == "" {
		return 0, false
	}
	for i, e := range t.cfg.Endpoints {
		if strings.TrimPrefix(strings.TrimPrefix(e, "http://"), "https://") == addr {
			return i, true
		}
	}
	return 0, false
}

// reroute sends key's range to endpoint e until the next refresh, as an
// answer about key said that e leads it.
func (t *Target) reroute(key string, e int) {
	rs := t.routes.Load()
	if rs == nil {
		return
	}
	h := keyspace.Hash(key)
	next := slices.Clone(*rs)
	for i := range next {
		if keyspace.Contains(next[i].start, next[i].end, h) {
			next[i].endpoint = e
		}
	}
	t.routes.CompareAndSwap(rs, &next)
}

// first picks the connection for a request on key: one to the node that
// leads key's shard, or any when the map does not say.
func (t *Target) first(key string) conn {
	if rs := t.routes.Load(); rs != nil {
		h := keyspace.Hash(key)
		for _, r := range *rs {
			if keyspace.Contains(r.start, r.end, h) {
				per := t.cfg.ConnsPerEndpoint
				return t.conns[r.endpoint*per+rand.IntN(per)]
			}
		}
	}
	return t.conns[rand.IntN(len(t.conns))]
}

// Name implements harness.Target.
func (t *Target) Name() string { return "warden" }

// Costs implements harness.Target: every operation is one replicated
// command (Dragonboat may batch several into one Raft entry and fsync).
func (t *Target) Costs() harness.Costs {
	return harness.Costs{Acquire: 1, Renew: 1, Release: 1, Quota: 1,
		Note: "every acquire, renewal and release is a command committed by a Raft quorum and fsynced, with per-lock leases and fencing tokens; the renewals sent to one node within the renew linger (50 ms) share one RenewBatch call and one Raft entry per shard, and the acquires and releases that meet at one node share Batch calls and one Raft entry per shard; each is applied on every replica"}
}

// Close implements harness.Target.
func (t *Target) Close() error {
	close(t.stop)
	return nil
}

// codeErr reports a Connect error under its code's name ("unavailable").
func codeErr(err error) error {
	kind := strings.ReplaceAll(connect.CodeOf(err).String(), " ", "_")
	if errors.Is(err, context.DeadlineExceeded) {
		kind = "deadline_exceeded"
	}
	return harness.CodedError{Kind: kind, Err: err}
}

// call runs f on the connection for key, moving with backoff while the
// answer is unavailable, until ctx ends: to the endpoint the answer names
// as the shard's leader (whom key's route then names too), else to
// another. f must be safe to repeat.
func (t *Target) call(ctx context.Context, key string, f func(conn) error) error {
	c := t.first(key)
	backoff := 20 * time.Millisecond
	for {
		err := f(c)
		if connect.CodeOf(err) != connect.CodeUnavailable {
			return err
		}
		next := t.conns[rand.IntN(len(t.conns))]
		if e, ok := t.endpointAt(client.LeaderAddress(err)); ok && e != c.endpoint {
			t.reroute(key, e)
			next = t.conns[e*t.cfg.ConnsPerEndpoint+rand.IntN(t.cfg.ConnsPerEndpoint)]
		} else if len(t.cfg.Endpoints) > 1 {
			for next.endpoint == c.endpoint {
				next = t.conns[rand.IntN(len(t.conns))]
			}
		}
		c = next
		// Full jitter under an exponential bound, as the SDK does: an
		// overloaded cluster answers unavailable, and retrying at once
		// would add to its load.
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last answer: %v)", ctx.Err(), err)
		case <-time.After(time.Duration(rand.Int64N(int64(backoff)) + 1)):
		}
		backoff = min(2*backoff, time.Second)
	}
}

func requestID() string {
	b := make([]byte, 12)
	crand.Read(b) // never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// lease is the harness.Lease handle.
// lease is a grant's handle: its id, and whether this target has had
// a Release of it answered (a later one that finds it released is a
// repeat, ErrLost).
type lease struct {
	id       string
	released atomic.Bool
}

// Acquire implements harness.Target. Retries keep the request id, so an
// acquire whose answer was lost returns the same lease.
func (t *Target) Acquire(ctx context.Context, resource string, ttl, wait time.Duration) (harness.Lease, error) {
	req := &wardenv1.AcquireRequest{Resource: resource, RequestId: requestID(), LeaseTtl: durationpb.New(ttl), Holder: "loadtest"}
	first := time.Now()
	var resp *wardenv1.AcquireResponse
	err := t.call(ctx, resource, func(c conn) error {
		if wait > 0 {
			left := wait - time.Since(first)
			if left <= 0 {
				return harness.ErrHeld
			}
			req.WaitTimeout = durationpb.New(left)
		}
		if t.cfg.SingleCalls {
			r, err := c.lock.Acquire(ctx, connect.NewRequest(req))
			if err == nil {
				resp = r.Msg
			}
			return err
		}
		var err error
		resp, err = c.batcher.Acquire(ctx, req)
		return err
	})
	switch {
	case err == nil:
		return harness.Lease{Resource: resource, Token: resp.GetFencingToken(), TTL: resp.GetLeaseTtl().AsDuration(), Handle: &lease{id: resp.GetLeaseId()}}, nil
	case errors.Is(err, harness.ErrHeld), connect.CodeOf(err) == connect.CodeAborted:
		return harness.Lease{}, harness.ErrHeld
	case wait > 0 && connect.CodeOf(err) == connect.CodeDeadlineExceeded && ctx.Err() == nil:
		return harness.Lease{}, harness.ErrHeld // the wait ran out
	}
	return harness.Lease{}, codeErr(err)
}

// Renew implements harness.Target.
func (t *Target) Renew(ctx context.Context, l harness.Lease) error {
	err := t.call(ctx, l.Resource, func(c conn) error {
		if !t.cfg.SingleRenewals {
			_, _, err := c.renewer.Renew(ctx, l.Resource, l.Handle.(*lease).id)
			return err
		}
		_, err := c.lock.Renew(ctx, connect.NewRequest(&wardenv1.RenewRequest{Resource: l.Resource, LeaseId: l.Handle.(*lease).id}))
		return err
	})
	switch {
	case err == nil:
		return nil
	case connect.CodeOf(err) == connect.CodeFailedPrecondition:
		return harness.ErrLost
	}
	return codeErr(err)
}

// Release implements harness.Target: released=false is ErrLost, unless
// an earlier attempt's outcome is unknown (it may have released the lease
// itself, so the retry finds nothing to release) or the answer is
// already_released for a lease this target had not released before: a
// Release of its id ended it, an attempt the server retried after an
// answer it never saw (DESIGN.md §1 rule 3).
func (t *Target) Release(ctx context.Context, l harness.Lease) error {
	h := l.Handle.(*lease)
	var released, already bool
	attempts := 0
	err := t.call(ctx, l.Resource, func(c conn) error {
		attempts++
		req := &wardenv1.ReleaseRequest{Resource: l.Resource, LeaseId: h.id}
		var r *wardenv1.ReleaseResponse
		var err error
		if t.cfg.SingleCalls {
			var resp *connect.Response[wardenv1.ReleaseResponse]
			if resp, err = c.lock.Release(ctx, connect.NewRequest(req)); err == nil {
				r = resp.Msg
			}
		} else {
			r, err = c.batcher.Release(ctx, req)
		}
		released, already = r.GetReleased(), r.GetAlreadyReleased()
		return err
	})
	switch {
	case err != nil:
		return codeErr(err)
	case already && h.released.Load(), !released && !already && attempts == 1:
		return harness.ErrLost
	}
	h.released.Store(true)
	return nil
}
