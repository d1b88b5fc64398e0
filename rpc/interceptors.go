package rpc

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/shard"
)

// The cross-cutting work of every client RPC (LockService, QuotaService,
// AdminService) runs in one Connect interceptor, keyed by the procedure,
// not in the handlers: it times the call, counts its outcome, writes the
// audit line of a state-changing lock call, and maps the handler's error
// to the Connect error the client gets (classify). Handlers return their
// errors as they are. Authorization is the next interceptor in the chain
// (authorizer, authn.go), so a denial is counted and audited too, and
// routing the innermost (routing, route.go); authentication comes
// before, in the HTTP layer (guard).
//
// Two kinds of call are recorded by the handlers instead, through the
// same record: a Batch's ops and a RenewBatch's renewals, each counted
// and audited as its own call would be. A call that another node served
// (forwarded by the routing interceptor, route.go) is recorded there, not
// here: the routing interceptor says so in the call's state.

// callState is what the routing interceptor, the innermost, tells the
// observer about one call: the authorizer sits between them (a denial is
// recorded here), so the observer cannot tell from its place in the chain
// alone whether the call went to another node.
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

// servedElsewhere records, in ctx's call state, that another node served
// the call (routing.WrapUnary).
func servedElsewhere(ctx context.Context) {
	if st, ok := ctx.Value(callStateKey{}).(*callState); ok {
		st.forwarded.Store(true)
	}
}

// observer is the interceptor of the client services.
type observer struct{ r *node }

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
			method := methodOf(req.Spec().Procedure)
			var e *auditEntry
			if o.r.Config().Audit != nil { // its request text is JSON encoding: not for nothing
				e = auditOf(method, req.Spec().IdempotencyLevel, req.Any(), out)
			}
			record(ctx, o.r, req.Peer(), method, start, e, err)
		}
		return resp, toConnect(err)
	}
}

func (observer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler records the client services' one streaming RPC,
// AdminService.Backup, as a whole: its duration and outcome, and an
// audit line (it takes no request worth recording).
func (o observer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		start := time.Now()
		err := next(ctx, conn)
		method := methodOf(conn.Spec().Procedure)
		var e *auditEntry
		if o.r.Config().Audit != nil {
			e = &auditEntry{method: method}
		}
		record(ctx, o.r, conn.Peer(), method, start, e, err)
		return toConnect(err)
	}
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

// auditOf is the audit entry of a call of method with request message
// req and response message resp (nil when it failed), or nil for a call
// that is not audited as a whole: a read (idem says it has no side
// effects), or a Batch or RenewBatch, whose ops are audited one by one.
// A quota, admin or auth change is audited with its request, which holds
// no secret (a token is in CreateToken's response, which only its id
// leaves).
func auditOf(method string, idem connect.IdempotencyLevel, req, resp any) *auditEntry {
	switch m := req.(type) {
	case *wardenv1.AcquireRequest:
		r, _ := resp.(*wardenv1.AcquireResponse)
		return acquireEntry(m, r)
	case *wardenv1.RenewRequest:
		return renewEntry("Renew", m)
	case *wardenv1.ReleaseRequest:
		r, _ := resp.(*wardenv1.ReleaseResponse)
		return releaseEntry(m, r)
	case *wardenv1.BatchRequest, *wardenv1.RenewBatchRequest:
		return nil
	case *wardenv1.RevokeLeaseRequest:
		e := &auditEntry{method: method, resource: m.GetResource(), request: requestText(m)}
		if r, ok := resp.(*wardenv1.RevokeLeaseResponse); ok && r != nil {
			revoked := r.GetRevoked()
			e.released = &revoked // whether a lease ended, as for Release
		}
		return e
	}
	if idem == connect.IdempotencyNoSideEffects {
		return nil
	}
	e := &auditEntry{method: method}
	if k, ok := req.(interface{ GetKey() string }); ok {
		e.resource = k.GetKey()
	}
	if m, ok := req.(proto.Message); ok {
		e.request = requestText(m)
	}
	if r, ok := resp.(*wardenv1.CreateTokenResponse); ok {
		e.tokenID = r.GetId()
	}
	return e
}

// maxAuditRequest bounds the request text of one audit record, in bytes.
const maxAuditRequest = 1024

// requestText is m as compact JSON for the audit log, cut at
// maxAuditRequest bytes and escaped (shard.LogText).
func requestText(m proto.Message) string {
	b, err := protojson.Marshal(m)
	if err != nil {
		return ""
	}
	return shard.LogText(string(b), maxAuditRequest)
}

// record counts a call (or a batch's part) of method begun at start (its
// latency is not observed when start is zero) that ended with err, and
// writes its audit entry e, if any, as from peer.
func record(ctx context.Context, r *node, peer connect.Peer, method string, start time.Time, e *auditEntry, err error) {
	if !start.IsZero() {
		metrics.rpcDuration.WithLabelValues(method, outcome(err)).Observe(time.Since(start).Seconds())
	}
	metrics.rpcOutcomes.WithLabelValues(method, outcome(err)).Inc()
	if e != nil {
		audit(ctx, r, peer, *e, err)
	}
}
