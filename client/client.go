// Package client is Warden's Go SDK: locks whose leases renew themselves,
// with fencing tokens for the resources they protect (package
// client/fence), and quota reservations. See the example of Client.Lock.
//
// What a user must know:
//
//   - A Lease renews itself in the background every TTL/3 (±10 % jitter).
//     The renewals of a Client's leases that fall due together share one
//     RenewBatch call (see Renewer).
//     Its local deadline is the send time of the last successful renewal
//     (or of the first Acquire attempt) plus the TTL, on this process's
//     monotonic clock. When renewals fail, it keeps trying until that
//     deadline minus a safety margin, then closes Done. The server cannot
//     grant the lock to anyone else before the lease's expiry plus the
//     shard's max clock skew, so Done always closes first —
//     provided this process is not itself paused; for that, pass Token to
//     the protected resource and check it there (package client/fence).
//   - Lock calls that do not wait and Unlock calls made at about the
//     same time by a Client's goroutines share Batch calls (see Batcher).
//     A Lock that gave up (its ctx ended) may still be granted by the
//     server. When the request id was the SDK's own, nobody can use that
//     lease: the call that carried it goes on while any of its callers
//     waits and then up to 2 s more to learn the answer, and the SDK
//     releases such a lease at once rather than leave the resource held
//     until the TTL runs out (warden_orphaned_leases_total counts them).
//     With a LockOptions.RequestID of yours, it is left for your retry.
//   - Every request that may be retried carries the same id: an Acquire
//     retried after an unavailable answer or a lost response returns the
//     lease the first attempt got, never a second one.
//   - Unlock releases the lease (retrying while the service is
//     unavailable); a lease that already ended is not an error.
//   - Locks are not re-entrant: locking a resource you hold fails with
//     ErrHeld (or waits for yourself until Wait passes).
//   - A waiting Lock keeps its place in the queue across retries only if
//     the retry reaches the server before the abandoned attempt's cancel:
//     when a connection breaks, the server cancels that attempt (so that
//     no grant goes to nobody), unless a later attempt of the same request
//     id has already arrived. A leader change does not break a waiting
//     Lock: the server goes on waiting through it.
package client

import (
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/proto/rpctypes"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// Errors returned by the SDK. Use errors.Is; a *HeldError carries more.
var (
	// ErrHeld: the lock is held by someone else and the caller asked not
	// to wait (LockOptions.Wait is 0). The error is a *HeldError.
	ErrHeld = errors.New("warden: lock is held")
	// ErrWaitTimeout: the lock was not granted within LockOptions.Wait.
	ErrWaitTimeout = errors.New("warden: wait timed out without a grant")
	// ErrLeaseLost: the server says the lease is no longer current
	// (expired, released or replaced). Work under it must stop.
	ErrLeaseLost = errors.New("warden: lease lost")
	// ErrLeaseUncertain: renewals failed until the local deadline; the
	// lease may have expired. Work under it must stop.
	ErrLeaseUncertain = errors.New("warden: lease renewal uncertain")
	// ErrUnlocked: the lease was released by Unlock (or Client.Close).
	ErrUnlocked = errors.New("warden: lease released")
	// ErrClosed: Lock was called on a Client after Close.
	ErrClosed = errors.New("warden: client closed")
)

// HeldError says who holds a lock the caller did not wait for.
type HeldError struct {
	Resource     string
	FencingToken uint64    // the holder's token
	ExpiresAt    time.Time // the holder's lease expiry
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("warden: %s is held (fencing token %d, until %s)", e.Resource, e.FencingToken, e.ExpiresAt.Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// Config configures a Client. Only Endpoints is required.
type Config struct {
	// Endpoints are base URLs of Warden nodes ("http://10.0.0.1:7070").
	// Requests go to one and move to the next when it is unavailable.
	Endpoints []string
	// HTTPClient carries the requests (default: a client with HTTP/2
	// and keep-alive: over TLS, negotiated by ALPN, for https endpoints,
	// cleartext for http ones).
	HTTPClient connect.HTTPClient
	// TLS configures the default client's TLS (the CA that verifies the
	// nodes, a client certificate); nil uses the system's roots. It is
	// ignored when HTTPClient is set.
	TLS *tls.Config
	// RetryBase and RetryMax bound the exponential backoff, with jitter,
	// between retries of an unavailable service (default 50 ms and 2 s).
	RetryBase, RetryMax time.Duration
	// Token, if set, is the bearer token every call carries
	// ("Authorization: Bearer …"), on a cluster with authentication on.
	// Send it over https only: the cluster refuses credentials in clear.
	Token string
	// Credentials, if set, returns the bearer token for each call (a
	// source that rotates or refreshes it); it wins over Token. An error
	// fails the call.
	Credentials func(ctx context.Context) (string, error)
}

// WithCredentials is a Connect client option that sends, with every
// call, the bearer token source returns ("Authorization: Bearer …"; none
// when it returns ""). An error of source fails the call. Client uses it
// for Config.Token and Config.Credentials; it is exported for callers
// that make their own Connect clients (the admin API, a load generator).
// Streaming calls (AdminService.Backup) carry it too.
func WithCredentials(source func(ctx context.Context) (string, error)) connect.ClientOption {
	return connect.WithInterceptors(credentials{source})
}

// credentials is WithCredentials' interceptor.
type credentials struct {
	source func(ctx context.Context) (string, error)
}

func (c credentials) set(ctx context.Context, h http.Header) error {
	token, err := c.source(ctx)
	if err != nil {
		return fmt.Errorf("warden: credentials: %w", err)
	}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	return nil
}

func (c credentials) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if err := c.set(ctx, req.Header()); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (c credentials) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if err := c.set(ctx, conn.RequestHeader()); err != nil {
			return failedConn{conn, err}
		}
		return conn
	}
}

func (credentials) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// failedConn is a streaming call that fails with err before it sends.
type failedConn struct {
	connect.StreamingClientConn
	err error
}

func (f failedConn) Send(any) error    { return f.err }
func (f failedConn) Receive(any) error { return f.err }

// WithToken is WithCredentials of a fixed token.
func WithToken(token string) connect.ClientOption {
	return WithCredentials(func(context.Context) (string, error) { return token, nil })
}

// bearer is the credentials option of cfg.
func bearer(cfg Config) connect.ClientOption {
	if cfg.Credentials != nil {
		return WithCredentials(cfg.Credentials)
	}
	return WithToken(cfg.Token)
}

// Client talks to a Warden cluster. It is safe for concurrent use.
type Client struct {
	cfg    Config
	locks  []wardenv1connect.LockServiceClient
	quotas []wardenv1connect.QuotaServiceClient
	// renewers batch the renewals of this client's leases, one per
	// endpoint.
	renewers []*Renewer
	// batchers batch this client's Acquire and Release calls, one per
	// endpoint.
	batchers []*Batcher
	next     atomic.Uint32 // index of the endpoint to try first
	// hosts are the endpoints' "host:port", to match the leader a
	// recovery detail names (NotLeader, RangeMoved) to an endpoint.
	hosts []string
	// transport is the HTTP transport New made (nil when the caller gave
	// Config.HTTPClient): Close closes its idle connections.
	transport *http.Transport

	mu struct {
		sync.Mutex
		closed bool
		leases map[*Lease]struct{} // the server may hold them: not lost, not released
	}
}

// New returns a client for the given node URLs.
func New(endpoints ...string) (*Client, error) {
	return NewWithConfig(Config{Endpoints: endpoints})
}

// NewWithConfig returns a client configured by cfg.
func NewWithConfig(cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("warden: no endpoints")
	}
	var own *http.Transport
	if cfg.HTTPClient == nil {
		// A connection to a node that went silent (a partition drops its
		// packets; nothing closes it) is pinged after 5 s without a frame
		// and closed when the ping gets no answer in 5 s, so later calls
		// and the failover to another endpoint go over a new connection
		// instead of queueing on the dead one until TCP gives up; a dial
		// gives up after 5 s.
		own = &http.Transport{Protocols: new(http.Protocols), MaxIdleConnsPerHost: 64, TLSClientConfig: cfg.TLS,
			DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			HTTP2:       &http.HTTP2Config{SendPingTimeout: 5 * time.Second, PingTimeout: 5 * time.Second}}
		own.Protocols.SetHTTP1(true)
		own.Protocols.SetHTTP2(true)
		own.Protocols.SetUnencryptedHTTP2(true)
		cfg.HTTPClient = &http.Client{Transport: own}
	}
	if cfg.RetryBase == 0 {
		cfg.RetryBase = 50 * time.Millisecond
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = 2 * time.Second
	}
	c := &Client{cfg: cfg, transport: own}
	c.mu.leases = map[*Lease]struct{}{}
	for _, e := range cfg.Endpoints {
		u, err := url.Parse(e)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("warden: endpoint %q is not a base URL (\"http://host:port\")", e)
		}
		c.hosts = append(c.hosts, u.Host)
		c.locks = append(c.locks, wardenv1connect.NewLockServiceClient(cfg.HTTPClient, e, bearer(cfg)))
		c.renewers = append(c.renewers, NewRenewer(c.locks[len(c.locks)-1], DefaultLinger))
		c.batchers = append(c.batchers, NewBatcher(c.locks[len(c.locks)-1], DefaultBatchCalls))
		c.quotas = append(c.quotas, wardenv1connect.NewQuotaServiceClient(cfg.HTTPClient, e, bearer(cfg)))
	}
	return c, nil
}

// Close releases every lease of this client that the server may still
// hold: those held, those whose renewals became uncertain, and those
// whose release failed before (as Unlock does: each Done closes with
// ErrUnlocked, and releases retry while the service is unavailable, until
// ctx ends), then closes the idle connections of the HTTP transport New
// made. Lock fails with ErrClosed afterwards; other calls still work. It
// returns the releases' errors, joined; a lease whose release failed
// still ends at its TTL, and a later Close tries again. A Lock call in
// flight when Close begins may still be granted: it then releases that
// lease itself and answers ErrClosed.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	c.mu.closed = true
	held := make([]*Lease, 0, len(c.mu.leases))
	for l := range c.mu.leases {
		held = append(held, l)
	}
	c.mu.Unlock()
	errs := make([]error, len(held))
	var wg sync.WaitGroup
	for i, l := range held {
		wg.Go(func() {
			if err := l.Unlock(ctx); err != nil {
				errs[i] = fmt.Errorf("warden: releasing %s: %w", l.resource, err)
			}
		})
	}
	wg.Wait()
	if c.transport != nil {
		c.transport.CloseIdleConnections()
	}
	return errors.Join(errs...)
}

// hold records l as held, unless the client is closed.
func (c *Client) hold(l *Lease) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed {
		return false
	}
	c.mu.leases[l] = struct{}{}
	return true
}

// closed reports whether Close has been called.
func (c *Client) closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.closed
}

// forget drops l from the held leases (its Done has closed).
func (c *Client) forget(l *Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.mu.leases, l)
}

// retry runs f with the index of the current endpoint, retrying with
// backoff while the error is Retryable until it gets another answer or
// ctx ends. A retry goes to the endpoint that the answer names as the
// shard's leader (a NotLeader or RangeMoved detail), at once the first
// time, else to the next endpoint. f must be safe to repeat: it carries
// the same request or lease id every time.
func (c *Client) retry(ctx context.Context, f func(context.Context, int) error) error {
	backoff := c.cfg.RetryBase
	redirected := false
	for {
		i := c.next.Load() % uint32(len(c.locks))
		err := f(ctx, int(i))
		if !Retryable(err) {
			return err
		}
		if j, ok := c.leaderEndpoint(err); ok && j != i {
			c.next.CompareAndSwap(i, j)
			if !redirected {
				// The answer said where to go: no reason to wait. Once
				// only, so two nodes naming each other still back off.
				redirected = true
				continue
			}
		} else {
			c.next.CompareAndSwap(i, i+1)
		}
		// Full jitter: a random wait up to the current backoff.
		wait := time.Duration(rand.Int64N(int64(backoff)) + 1)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last answer: %v)", ctx.Err(), err)
		case <-time.After(wait):
		}
		backoff = min(2*backoff, c.cfg.RetryMax)
	}
}

// leaderEndpoint returns the index of the endpoint that err's recovery
// detail names as the leader of the call's shard, if it is one of c's.
func (c *Client) leaderEndpoint(err error) (uint32, bool) {
	addr := LeaderAddress(err)
	if addr == "" {
		return 0, false
	}
	for i, h := range c.hosts {
		if h == addr {
			return uint32(i), true
		}
	}
	return 0, false
}

// LeaderAddress returns the client address ("host:port") of the shard's
// leader that an Unavailable answer names in its recovery detail
// (warden.v1.NotLeader or RangeMoved), or "" when err names none: a
// client that has that node among its endpoints sends its retry there.
// Client does so itself; this is for callers with their own transport.
// It is rpctypes.LeaderAddress, which the server shares.
func LeaderAddress(err error) string { return rpctypes.LeaderAddress(err) }

// Retryable reports whether err leaves a call's outcome unknown in a way
// that a retry with the same request, reservation or lease id settles:
// the server answered Unavailable, or the connection broke before the
// answer was read (the node died or restarted mid-call, which Connect
// reports as Unknown, not from the wire). The caller's own deadline or
// cancel is not retryable: it decides what the caller is told. It is
// rpctypes.Retryable, which the server shares.
func Retryable(err error) bool { return rpctypes.Retryable(err) }

// newRequestID draws a random request id (96 bits, hex).
func newRequestID() string {
	b := make([]byte, 12)
	crand.Read(b) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b)
}
