package rpc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/auth"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/shard"
)

// LockServer implements wardenv1connect.LockServiceHandler on a Router.
type LockServer struct {
	r *node
}

var _ wardenv1connect.LockServiceHandler = (*LockServer)(nil)

// newLockServer returns the LockService handler of r.
func newLockServer(r *node) *LockServer { return &LockServer{r: r} }

// Acquire implements LockService.Acquire here; the routing interceptor
// sends it where it is served (serveAcquire).
func (s *LockServer) Acquire(ctx context.Context, req *connect.Request[wardenv1.AcquireRequest]) (*connect.Response[wardenv1.AcquireResponse], error) {
	return s.acquire(ctx, req.Msg)
}

// serveAcquire is Acquire's route (route.go).
//
// A waiting Acquire is served where the shard's leader was when it came,
// and goes on waiting there through leader changes; when that node stops
// hosting the shard (router.ErrWaitElsewhere), or a forwarded call's
// node stops answering, it is sent on (with the time it has left:
// waitLeft) to a node that hosts the shard.
//
// A waiting Acquire ends, and leaves the queue as a caller that gives up
// does, when a newer auth state no longer authenticates its credentials
// (Unauthenticated) or allows its principal the lock (PermissionDenied):
// see watchCall.
func serveAcquire(ctx context.Context, n *node, req *connect.Request[wardenv1.AcquireRequest], send sender[wardenv1.AcquireRequest, wardenv1.AcquireResponse],
	local localCall[wardenv1.AcquireRequest, wardenv1.AcquireResponse]) (_ *connect.Response[wardenv1.AcquireResponse], _ served, err error) {
	if req.Msg.GetWaitTimeout().AsDuration() > 0 {
		var stop func()
		ctx, stop = n.watchCall(ctx, auth.Lock, req.Msg.GetResource())
		defer stop()
		defer func() {
			// The auth state ended the wait: answer why, not "canceled".
			if cause := context.Cause(ctx); err != nil && cause != nil && cause != ctx.Err() {
				err = cause
			}
		}()
	}
	start := time.Now()
	for {
		resp, where, err := send(ctx, req, func(call peerCall[wardenv1.AcquireRequest, wardenv1.AcquireResponse]) peerCall[wardenv1.AcquireRequest, wardenv1.AcquireResponse] {
			return func(ctx context.Context, fr *connect.Request[wardenv1.AcquireRequest]) (*connect.Response[wardenv1.AcquireResponse], error) {
				fr.Msg = waitLeft(fr.Msg, start)
				return call(ctx, fr)
			}
		})
		if where != servedHere {
			return resp, where, err
		}
		here := *req // the same call, with the time it has left
		here.Msg = waitLeft(req.Msg, start)
		resp, err = local(ctx, &here)
		if errors.Is(err, router.ErrWaitElsewhere) && hopsOf(req.Header()) < router.MaxHops && ctx.Err() == nil {
			continue // forward finds the node that hosts the shard now
		}
		if errors.Is(err, router.ErrWaitElsewhere) {
			err = fmt.Errorf("%w: %w", router.ErrNoLeader, err)
		}
		return resp, servedHere, err
	}
}

// waitLeft returns m with its wait_timeout less the time since start
// (never below zero), for an Acquire that goes on elsewhere with the
// same request id: a retry waits for the time its caller has left.
func waitLeft(m *wardenv1.AcquireRequest, start time.Time) *wardenv1.AcquireRequest {
	if m.GetWaitTimeout().AsDuration() <= 0 {
		return m // nothing to count down (validation refuses a negative one)
	}
	out := proto.CloneOf(m)
	out.WaitTimeout = durationpb.New(max(0, m.GetWaitTimeout().AsDuration()-time.Since(start)))
	return out
}

func (s *LockServer) acquire(ctx context.Context, m *wardenv1.AcquireRequest) (*connect.Response[wardenv1.AcquireResponse], error) {
	cmd, err := s.acquireCmd(ctx, m)
	if err != nil {
		return nil, err
	}
	wait := m.GetWaitTimeout().AsDuration()
	env := &shardv1.Envelope{Command: &shardv1.Envelope_Acquire{Acquire: cmd}}
	var sub *router.Subscription
	if wait > 0 {
		// Subscribe before proposing, so a hand-off applied at once is seen.
		sub = s.r.Waits().Subscribe(m.GetResource(), m.GetRequestId())
		defer s.r.Waits().Unsubscribe(sub)
	}
	start := time.Now()
	res, err := s.r.Propose(ctx, m.GetResource(), env)
	if wait > 0 && unavailable(err) {
		// The enqueue's outcome is unknown, or no leader took it: propose
		// it again, with the same request and lease ids, through whichever
		// node leads now. A committed first try is found by the dedup
		// record: the retry answers the same place in the queue.
		for lost := time.Now(); unavailable(err) && ctx.Err() == nil && time.Since(lost) < router.WaitRideThrough; {
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
			res, err = s.r.Propose(ctx, m.GetResource(), env)
		}
	}
	if err != nil {
		if wait > 0 && (unavailable(err) || ctx.Err() != nil) {
			// The enqueue may have committed with nobody left to wait for
			// it: take this attempt's place back.
			s.r.CancelWait(m.GetResource(), m.GetRequestId(), cmd.GetLeaseId())
		}
		return nil, err
	}
	l := res.GetLease()
	if res.GetCode() == shardv1.Code_CODE_QUEUED && sub == nil {
		return nil, s.giveUpQueued(m, cmd.GetLeaseId())
	}
	if res.GetCode() == shardv1.Code_CODE_QUEUED {
		// A retry waits for the time it has left, not for the place's
		// deadline, which an earlier attempt set. (Counted from before the
		// first proposal: env may have been stamped on another node.)
		deadline := min(res.GetWaitDeadlineUnixNano(), start.Add(wait).UnixNano())
		l, err = s.r.AwaitGrant(ctx, sub, m.GetResource(), m.GetRequestId(), cmd.GetLeaseId(), res.GetWaiterSeq(), deadline, res.GetWaitDeadlineUnixNano())
		if err != nil {
			return nil, err
		}
		metrics.waitDuration.Observe(time.Since(start).Seconds())
	}
	return acquireResponse(l), nil
}

// giveUpQueued answers m, a retry without wait_timeout of a request id
// that is queued, whose attempt (lease id) the shard answered QUEUED: it
// has no time left to wait. It takes the request's place back (this
// attempt is now its latest), so that no grant goes to nobody, and
// answers as a wait that ran out.
func (s *LockServer) giveUpQueued(m *wardenv1.AcquireRequest, attempt []byte) error {
	return s.r.EndWait(m.GetResource(), m.GetRequestId(), attempt)
}

// acquireCmd validates m and returns its shard command, with a fresh
// lease id, and counts the resource's acquire for the hot-key report.
func (s *LockServer) acquireCmd(ctx context.Context, m *wardenv1.AcquireRequest) (*shardv1.AcquireCmd, error) {
	if err := validateAcquire(m); err != nil {
		return nil, err
	}
	principal, err := s.r.replayPrincipal(ctx)
	if err != nil {
		return nil, err
	}
	s.r.Acquires().Add(m.GetResource())
	// The lease id is a bearer secret: 128 bits from the OS's CSPRNG,
	// drawn here and carried in the command so every replica stores it.
	leaseID := make([]byte, 16)
	if _, err := rand.Read(leaseID); err != nil {
		return nil, err
	}
	return &shardv1.AcquireCmd{
		Resource:         m.GetResource(),
		RequestId:        m.GetRequestId(),
		LeaseTtlNanos:    int64(m.GetLeaseTtl().AsDuration()),
		Holder:           m.GetHolder(),
		Tenant:           m.GetTenant(),
		LeaseId:          leaseID,
		WaitTimeoutNanos: int64(m.GetWaitTimeout().AsDuration()),
		Principal:        principal,
	}, nil
}

// acquireResponse is Acquire's answer for the granted lease l.
func acquireResponse(l *shardv1.LeaseInfo) *connect.Response[wardenv1.AcquireResponse] {
	return connect.NewResponse(&wardenv1.AcquireResponse{
		LeaseId:      hex.EncodeToString(l.GetLeaseId()),
		FencingToken: l.GetFencingToken(),
		ExpiresAt:    timestamp(l.GetExpiresAtUnixNano()),
		LeaseTtl:     durationpb.New(time.Duration(l.GetLeaseTtlNanos())),
	})
}

// Renew implements LockService.Renew here; the routing interceptor
// sends it where it is served.
func (s *LockServer) Renew(ctx context.Context, req *connect.Request[wardenv1.RenewRequest]) (*connect.Response[wardenv1.RenewResponse], error) {
	return s.renew(ctx, req.Msg)
}

func (s *LockServer) renew(ctx context.Context, m *wardenv1.RenewRequest) (*connect.Response[wardenv1.RenewResponse], error) {
	id, err := leaseRef(m.GetResource(), m.GetLeaseId())
	if err != nil {
		return nil, err
	}
	res, err := s.r.Propose(ctx, m.GetResource(), &shardv1.Envelope{Command: &shardv1.Envelope_Renew{Renew: &shardv1.RenewCmd{
		Resource: m.GetResource(), LeaseId: id}}})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&wardenv1.RenewResponse{ExpiresAt: timestamp(res.GetLease().GetExpiresAtUnixNano())}), nil
}

// Release implements LockService.Release here; the routing interceptor
// sends it where it is served. A retry of an unanswered attempt that
// finds the lease ended answers already_released (DESIGN.md §1 rule 3).
func (s *LockServer) Release(ctx context.Context, req *connect.Request[wardenv1.ReleaseRequest]) (*connect.Response[wardenv1.ReleaseResponse], error) {
	return s.release(ctx, req.Msg)
}

func (s *LockServer) release(ctx context.Context, m *wardenv1.ReleaseRequest) (*connect.Response[wardenv1.ReleaseResponse], error) {
	cmd, err := releaseCmd(m)
	if err != nil {
		return nil, err
	}
	res, err := s.r.Propose(ctx, m.GetResource(), &shardv1.Envelope{Command: &shardv1.Envelope_Release{Release: cmd}})
	if err != nil {
		return nil, err
	}
	return releaseResponse(res), nil
}

// releaseResponse is Release's answer for the shard's result res.
func releaseResponse(res *shardv1.Result) *connect.Response[wardenv1.ReleaseResponse] {
	return connect.NewResponse(&wardenv1.ReleaseResponse{Released: res.GetReleased(), AlreadyReleased: !res.GetReleased() && res.GetReplayed()})
}

// releaseCmd validates m and returns its shard command.
func releaseCmd(m *wardenv1.ReleaseRequest) (*shardv1.ReleaseCmd, error) {
	id, err := leaseRef(m.GetResource(), m.GetLeaseId())
	if err != nil {
		return nil, err
	}
	return &shardv1.ReleaseCmd{Resource: m.GetResource(), LeaseId: id}, nil
}

// Describe implements LockService.Describe here, with a linearizable
// read; the routing interceptor sends it where it is served.
func (s *LockServer) Describe(ctx context.Context, req *connect.Request[wardenv1.DescribeRequest]) (*connect.Response[wardenv1.DescribeResponse], error) {
	return s.describe(ctx, req.Msg)
}

func (s *LockServer) describe(ctx context.Context, m *wardenv1.DescribeRequest) (*connect.Response[wardenv1.DescribeResponse], error) {
	if err := validateResource(m.GetResource()); err != nil {
		return nil, err
	}
	q, err := s.r.Read(ctx, m.GetResource(), &shardv1.Query{Query: &shardv1.Query_Describe{Describe: &shardv1.DescribeQuery{Resource: m.GetResource()}}})
	if err != nil {
		return nil, err
	}
	l := q.GetLock()
	out := &wardenv1.DescribeResponse{FencingToken: l.GetFencingToken(), Waiters: l.GetWaiters()}
	// Held until the lock could be granted to someone else, by any leader.
	if shard.DescribeHolds(q) {
		out.Held = true
		out.Holder = l.GetHolder()
		out.ExpiresAt = timestamp(l.GetExpiresAtUnixNano())
	}
	return connect.NewResponse(out), nil
}
