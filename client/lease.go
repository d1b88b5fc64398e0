package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// The SDK's metrics; nothing serves them unless the caller registers them
// (RegisterMetrics).
var renewFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "warden_renew_failures_total",
	Help: "Lease renewals the Go SDK could not complete, by reason (unavailable: will retry; lost: the server refused; uncertain: gave up at the local deadline).",
}, []string{"reason"})

var orphanedLeases = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "warden_orphaned_leases_total",
	Help: "Leases the server granted to a Lock call of the Go SDK after the call had given up, by what the SDK did (released; failed: still held until its TTL runs out).",
}, []string{"outcome"})

// RegisterMetrics adds the SDK's metrics to reg (prometheus.DefaultRegisterer
// to serve them with the process's others): warden_renew_failures_total by
// reason and warden_orphaned_leases_total by outcome. The SDK counts
// whether or not they are registered; importing the package registers
// nothing.
func RegisterMetrics(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{renewFailures, orphanedLeases} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// LockOptions tune Lock. The zero value asks for the shard's default TTL
// and fails at once when the lock is held.
type LockOptions struct {
	// TTL is the lease TTL (default 30 s; the shard bounds it, 1 s – 10 min
	// by default).
	TTL time.Duration
	// Wait is how long to wait in the lock's queue when it is held; 0
	// fails at once with a *HeldError.
	Wait time.Duration
	// Holder is free text shown by Describe and in the audit log.
	Holder string
	// Tenant counts this request's waiting against a tenant's bound.
	Tenant string
	// RequestID makes the acquisition idempotent (default: a random id).
	// Set it only to retry with it after Lock gave up: a lease granted to
	// an id of yours after Lock returned is not released by the SDK. A
	// Lock with it renews the lease at once (the grant it gets back may
	// be older than the call, so its deadline is measured afresh).
	RequestID string
	// SafetyMargin is how long before the local deadline Done closes when
	// renewals fail (default TTL/10, at least 100 ms). It must be at least
	// 0 and below the TTL (invalid_argument otherwise, before or, when the
	// shard picked the TTL, right after the grant, which is then released).
	SafetyMargin time.Duration
}

// Lease is a held lock. Its methods are safe for concurrent use.
type Lease struct {
	c        *Client
	resource string
	leaseID  string
	token    uint64
	ttl      time.Duration
	margin   time.Duration

	done chan struct{}
	stop chan struct{} // closed by Unlock to end the renew loop
	wg   sync.WaitGroup

	mu struct {
		sync.Mutex
		expiresAt time.Time // the server's, from the last answer
		deadline  time.Time // local: monotonic send time of the last success + TTL
		err       error     // why Done closed
		released  bool      // a release succeeded: Unlock has nothing left to do
	}
}

// Resource returns the locked resource's name.
func (l *Lease) Resource() string { return l.resource }

// Token returns the lease's fencing token. Pass it to the protected
// resource with every write; it stays the same for the lease's life.
func (l *Lease) Token() uint64 { return l.token }

// ExpiresAt returns the server's expiry of the lease as of the last
// successful renewal, on the server's clock.
func (l *Lease) ExpiresAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.expiresAt
}

// Done is closed when the lease is lost, its renewal became uncertain, or
// it was unlocked. The holder must stop work under the lease at once.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err says why Done closed: ErrLeaseLost, ErrLeaseUncertain or
// ErrUnlocked; nil while the lease is held.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.err
}

// Lock acquires resource and starts renewing the lease in the background.
// Retries of an unavailable service carry the same request id, with
// exponential backoff, until ctx ends; a wait continues with the time it
// has left. Errors: a *HeldError (ErrHeld) when held and opts.Wait is 0,
// ErrWaitTimeout, ErrClosed after Close, a Connect error for bad input,
// or ctx's error.
func (c *Client) Lock(ctx context.Context, resource string, opts LockOptions) (*Lease, error) {
	if c.closed() {
		return nil, ErrClosed
	}
	if opts.SafetyMargin < 0 || (opts.TTL > 0 && opts.SafetyMargin >= opts.TTL) {
		return nil, badMargin(opts.SafetyMargin, opts.TTL)
	}
	// A caller's request id may be a retry of a request granted earlier
	// than this call's first send: the grant's own clock started before
	// firstSend, so firstSend + TTL would be too late a deadline.
	replay := opts.RequestID != ""
	var orphaned func(*wardenv1.AcquireResponse)
	if opts.RequestID == "" {
		opts.RequestID = newRequestID()
		// Nobody else can retry this request id, so a lease granted to it
		// after this call gave up is held by no one: release it.
		orphaned = func(a *wardenv1.AcquireResponse) { go c.releaseOrphan(resource, a) }
	}
	// Every attempt's grant of a request id of this call's own happens
	// after the first attempt was sent, so its send time + TTL is a safe
	// local deadline.
	firstSend := time.Now()
	var resp *wardenv1.AcquireResponse
	err := c.retry(ctx, func(ctx context.Context, i int) error {
		req := &wardenv1.AcquireRequest{Resource: resource, RequestId: opts.RequestID, Holder: opts.Holder, Tenant: opts.Tenant}
		if opts.TTL != 0 {
			req.LeaseTtl = durationpb.New(opts.TTL)
		}
		if opts.Wait > 0 {
			left := opts.Wait - time.Since(firstSend)
			if left <= 0 {
				return ErrWaitTimeout
			}
			req.WaitTimeout = durationpb.New(left)
		}
		r, err := c.batchers[i].acquire(ctx, req, orphaned)
		if err != nil {
			return err
		}
		resp = r
		return nil
	})
	switch {
	case err == nil:
	case connect.CodeOf(err) == connect.CodeAborted:
		return nil, heldError(resource, err)
	case connect.CodeOf(err) == connect.CodeDeadlineExceeded && ctx.Err() == nil:
		return nil, fmt.Errorf("%w: %s: %v", ErrWaitTimeout, resource, err)
	default:
		return nil, fmt.Errorf("warden: acquire %s: %w", resource, err)
	}
	l := &Lease{
		c: c, resource: resource, leaseID: resp.GetLeaseId(), token: resp.GetFencingToken(),
		ttl:  resp.GetLeaseTtl().AsDuration(),
		done: make(chan struct{}), stop: make(chan struct{}),
	}
	l.margin = opts.SafetyMargin
	if l.margin == 0 {
		l.margin = max(l.ttl/10, 100*time.Millisecond)
	}
	l.mu.expiresAt = resp.GetExpiresAt().AsTime()
	l.mu.deadline = firstSend.Add(l.ttl)
	if l.margin >= l.ttl { // the shard's default TTL was shorter than the margin
		err := badMargin(l.margin, l.ttl)
		l.close(err)
		if orphaned != nil {
			orphaned(resp)
		}
		return nil, err
	}
	if replay || time.Since(firstSend) > l.ttl/3 {
		// A replayed grant, or a long wait that used up much of the
		// conservative deadline: renew now to measure a fresh one from
		// the renewal's send time. The caller has not seen the lease yet,
		// so no work depends on the old deadline.
		if err := l.renew(ctx, time.Now().Add(l.ttl-l.margin)); err != nil {
			l.close(err)
			if orphaned != nil && !errors.Is(err, ErrLeaseLost) {
				orphaned(resp) // it may still be held
			}
			return nil, fmt.Errorf("warden: renewing %s right after its grant: %w", resource, err)
		}
	}
	// The renew loop is counted before Close can see the lease: Close's
	// Unlock waits for it.
	l.wg.Add(1)
	if !c.hold(l) { // Close ran meanwhile: it cannot have seen this lease
		l.wg.Done()
		_ = l.Unlock(ctx)
		return nil, ErrClosed
	}
	go l.keepAlive()
	return l, nil
}

// badMargin is the error of a SafetyMargin outside [0, TTL): a negative
// one would keep Done open past the local deadline, while the server may
// already grant the lock to another holder; one of the TTL or more would
// close Done at once.
func badMargin(margin, ttl time.Duration) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("warden: LockOptions.SafetyMargin %v must be at least 0 and below the lease TTL (%v)", margin, ttl))
}

// releaseOrphan releases lease a of resource, which the server granted to
// a Lock call after it had given up, retrying while the service is
// unavailable until the lease would have expired anyway. etcd's
// concurrency.Mutex deletes its key when Lock fails for the same reason;
// Curator's protected mode finds and deletes its node.
func (c *Client) releaseOrphan(resource string, a *wardenv1.AcquireResponse) {
	// The lease's TTL, on this process's clock, from about when it began.
	ttl := a.GetLeaseTtl().AsDuration()
	if ttl <= 0 {
		ttl = 30 * time.Second // the server's default; every server sends it
	}
	ctx, cancel := context.WithTimeout(context.Background(), ttl)
	defer cancel()
	err := c.retry(ctx, func(ctx context.Context, i int) error {
		_, err := c.batchers[i].Release(ctx, &wardenv1.ReleaseRequest{Resource: resource, LeaseId: a.GetLeaseId()})
		return err
	})
	if err != nil {
		orphanedLeases.WithLabelValues("failed").Inc()
		return
	}
	orphanedLeases.WithLabelValues("released").Inc()
}

func heldError(resource string, err error) error {
	he := &HeldError{Resource: resource}
	var ce *connect.Error
	if errors.As(err, &ce) {
		for _, d := range ce.Details() {
			if v, derr := d.Value(); derr == nil {
				if h, ok := v.(*wardenv1.LockHeld); ok {
					he.FencingToken, he.ExpiresAt = h.GetFencingToken(), h.GetExpiresAt().AsTime()
				}
			}
		}
	}
	return he
}

// renew sends one renewal, retrying while unavailable until cutoff, and
// moves the local deadline on success.
func (l *Lease) renew(ctx context.Context, cutoff time.Time) error {
	ctx, cancel := context.WithDeadline(ctx, cutoff)
	defer cancel()
	var sent, expiresAt time.Time
	err := l.c.retry(ctx, func(ctx context.Context, i int) error {
		var err error
		sent, expiresAt, err = l.c.renewers[i].Renew(ctx, l.resource, l.leaseID)
		if Retryable(err) {
			renewFailures.WithLabelValues("unavailable").Inc()
		}
		return err
	})
	switch {
	case err == nil:
		l.mu.Lock()
		l.mu.deadline = sent.Add(l.ttl)
		l.mu.expiresAt = expiresAt
		l.mu.Unlock()
		return nil
	case connect.CodeOf(err) == connect.CodeFailedPrecondition:
		renewFailures.WithLabelValues("lost").Inc()
		return fmt.Errorf("%w: %v", ErrLeaseLost, err)
	}
	renewFailures.WithLabelValues("uncertain").Inc()
	return fmt.Errorf("%w: %v", ErrLeaseUncertain, err)
}

// cutoff is when Done must close unless a renewal succeeds first.
func (l *Lease) cutoff() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.deadline.Add(-l.margin)
}

// keepAlive renews every TTL/3 with ±10 % jitter until Unlock or loss.
func (l *Lease) keepAlive() {
	defer l.wg.Done()
	for {
		period := l.ttl / 3
		jitter := time.Duration(rand.Int64N(int64(period)/5+1)) - period/10
		select {
		case <-l.stop:
			return
		case <-time.After(period + jitter):
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() { // Unlock interrupts a renewal in flight
			select {
			case <-l.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		err := l.renew(ctx, l.cutoff())
		cancel()
		select {
		case <-l.stop:
			return
		default:
		}
		if err != nil {
			l.close(err)
			return
		}
	}
}

// close closes Done once, recording why.
func (l *Lease) close(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.err != nil {
		return
	}
	l.mu.err = err
	close(l.done)
	if errors.Is(err, ErrLeaseLost) {
		// The server holds it no more: nothing for Close to release. An
		// uncertain lease may still be held; Unlock forgets a lease once
		// its release succeeded.
		l.c.forget(l)
	}
}

// Unlock stops renewing and releases the lease, retrying while the
// service is unavailable, until ctx ends. Done closes with ErrUnlocked (if
// it was not closed before). A lease the server no longer holds is not an
// error: there is nothing to release. When the release fails (ctx ended
// first), a later Unlock, or Client.Close, tries it again; once one
// succeeded, Unlock returns nil at once.
func (l *Lease) Unlock(ctx context.Context) error {
	l.mu.Lock()
	if l.mu.released {
		l.mu.Unlock()
		return nil
	}
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.mu.Unlock()
	l.wg.Wait()
	l.close(ErrUnlocked)
	err := l.c.retry(ctx, func(ctx context.Context, i int) error {
		_, err := l.c.batchers[i].Release(ctx, &wardenv1.ReleaseRequest{Resource: l.resource, LeaseId: l.leaseID})
		return err
	})
	if err != nil {
		return err // a later Unlock (or Close) tries again
	}
	l.mu.Lock()
	l.mu.released = true
	l.mu.Unlock()
	l.c.forget(l)
	return nil
}

// LockAll locks every resource, in sorted order and each once, under ctx
// (one overall timeout). On any failure it unlocks what it locked, in
// reverse order, and returns the error. A fixed order avoids deadlock
// between callers that lock overlapping sets; it is not atomic: others
// may see some of the locks held before all are.
func (c *Client) LockAll(ctx context.Context, resources []string, opts LockOptions) ([]*Lease, error) {
	sorted := slices.Clone(resources)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	leases := make([]*Lease, 0, len(sorted))
	for _, r := range sorted {
		o := opts
		o.RequestID = "" // one id per resource
		l, err := c.Lock(ctx, r, o)
		if err != nil {
			for i := len(leases) - 1; i >= 0; i-- {
				uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = leases[i].Unlock(uctx)
				cancel()
			}
			return nil, err
		}
		leases = append(leases, l)
	}
	return leases, nil
}
