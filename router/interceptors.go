package router

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// The cross-cutting work of every client RPC (LockService, QuotaService,
// AdminService) runs in one Connect interceptor, keyed by the procedure,
// not in the handlers: it times the call, counts its outcome, writes the
// audit line of a state-changing lock call, and maps the handler's error
// to the Connect error the client gets (classify). Handlers return their
// errors as they are. Authentication comes next in the same chain.
//
// Two kinds of call are recorded by the handlers instead, through the
// same record: a Batch's ops and a RenewBatch's renewals, each counted
// and audited as its own call would be. A call that another node served
// (forward) is recorded there, not here.

// callState is what the handlers tell the interceptor about one call (or
// about one part of a batch, which gets a state of its own).
type callState struct {
	// forwarded: another node served the call and recorded it.
	forwarded atomic.Bool
}

type callStateKey struct{}

// withCallState returns ctx with a fresh callState, and the state.
func withCallState(ctx context.Context) (context.Context, *callState) {
	st := &callState{}
	return context.WithValue(ctx, callStateKey{}, st), st
}

// markForwarded records, in ctx's call state, that another node serves
// the call.
func markForwarded(ctx context.Context) {
	if st, ok := ctx.Value(callStateKey{}).(*callState); ok {
		st.forwarded.Store(true)
	}
}

// observer is the interceptor of the client services.
type observer struct{ r *Router }

var _ connect.Interceptor = observer{}

func (o observer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, st := withCallState(ctx)
		start := time.Now()
		resp, err := next(ctx, req)
		if !st.forwarded.Load() {
			var out any
			if err == nil {
				out = resp.Any()
			}
			o.r.record(ctx, req.Peer(), methodOf(req.Spec().Procedure), start, auditOf(req.Any(), out), err)
		}
		return resp, toConnect(err)
	}
}

// The client services have no streaming RPCs.
func (observer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (observer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// methodOf is a procedure's name in metrics and the audit log: its
// method's, but for QuotaService.Release, which would otherwise share
// LockService.Release's.
func methodOf(procedure string) string {
	if procedure == wardenv1connect.QuotaServiceReleaseProcedure {
		return "ReleaseReservation"
	}
	return procedure[strings.LastIndexByte(procedure, '/')+1:]
}

// auditOf is the audit entry of a call with request message req and
// response message resp (nil when it failed), or nil for a call that is
// not audited as a whole.
func auditOf(req, resp any) *auditEntry {
	switch m := req.(type) {
	case *wardenv1.AcquireRequest:
		r, _ := resp.(*wardenv1.AcquireResponse)
		return acquireEntry(m, r)
	case *wardenv1.RenewRequest:
		return renewEntry("Renew", m)
	case *wardenv1.ReleaseRequest:
		r, _ := resp.(*wardenv1.ReleaseResponse)
		return releaseEntry(m, r)
	}
	return nil
}

// record counts a call (or a batch's part) of method begun at start (its
// latency is not observed when start is zero) that ended with err, and
// writes its audit entry e, if any, as from peer.
func (r *Router) record(ctx context.Context, peer connect.Peer, method string, start time.Time, e *auditEntry, err error) {
	if !start.IsZero() {
		metrics.rpcDuration.WithLabelValues(method).Observe(time.Since(start).Seconds())
	}
	metrics.rpcOutcomes.WithLabelValues(method, outcome(err)).Inc()
	if e != nil {
		r.audit(ctx, peer, *e, err)
	}
}
