package rpc

import (
	"context"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/keyspace"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/shard"
)

// Routing (issue 42). A client call about one key (a lock's resource, a
// quota key's pool) is served by the node that hosts the leader of the
// key's shard: one interceptor, routing, looks the call's procedure up in
// routes, and forwards the call (forward) when that node is another one,
// or lets the handler serve it here. Handlers of those procedures serve
// only here. Batch and RenewBatch, which split by shard, forward each
// shard's part through forward themselves.
//
// It is the innermost interceptor of the client services, after the
// authorizer: the node that authenticated the caller authorizes the call
// before it goes anywhere. The observer, outside both, must still learn
// that another node answered (that node counted and audited the call),
// and a denial, which the authorizer answers between the two, must stay
// counted and audited here; so the routing interceptor reports it in the
// call's state that the observer puts in the context (servedElsewhere).
// Nothing else writes that state.

// route is how the routing interceptor serves one procedure's call req:
// forwarded, or by local (the handler) here. It says where the call was
// served.
type route interface {
	serve(ctx context.Context, n *node, req connect.AnyRequest, local connect.UnaryFunc) (connect.AnyResponse, served, error)
	messages() (req, resp any)
}

// keyRoute is the route of a procedure with request Req and response
// Resp.
type keyRoute[Req, Resp any] struct {
	// key is the routing key of a request: its resource, or its quota
	// key's pool.
	key func(*Req) string
	// call is the same procedure on another node.
	call func(*peer) peerCall[Req, Resp]
	// checks refuse a request before it is routed, in order: what this
	// node must answer itself (a bad quota key, an RPC a replica's older
	// binary does not know yet).
	checks []func(*node, *Req) error
	// hook, if set, serves the call in place of plain (Acquire, Release,
	// Query).
	hook func(ctx context.Context, n *node, req *connect.Request[Req], send sender[Req, Resp], local localCall[Req, Resp]) (*connect.Response[Resp], served, error)
}

// messages returns a new request and response message of rt's procedure
// (the tests check the table's names against them).
func (rt *keyRoute[Req, Resp]) messages() (req, resp any) { return new(Req), new(Resp) }

// localCall is a procedure's handler.
type localCall[Req, Resp any] = func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)

// sender forwards req (forward) to the node that leads its key, through
// the route's call wrapped by wrap, if set.
type sender[Req, Resp any] func(ctx context.Context, req *connect.Request[Req], wrap func(peerCall[Req, Resp]) peerCall[Req, Resp]) (*connect.Response[Resp], served, error)

// routeOf is the route of a procedure whose routing key is key's and
// which another node serves as call on its client of type C (client
// picks it from a peer): the table below is type-checked by it.
func routeOf[C, Req, Resp any](key func(*Req) string, client func(*peer) C,
	call func(C, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) *keyRoute[Req, Resp] {
	return &keyRoute[Req, Resp]{key: key, call: func(p *peer) peerCall[Req, Resp] {
		c := client(p)
		return func(ctx context.Context, req *connect.Request[Req]) (*connect.Response[Resp], error) {
			return call(c, ctx, req)
		}
	}}
}

// quotaRoute is routeOf for a quota call about key's key: it is checked
// (shard.CheckQuotaKey) and routed by its pool.
func quotaRoute[Req, Resp any](key func(*Req) string, call func(wardenv1connect.QuotaServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) *keyRoute[Req, Resp] {
	rt := routeOf(func(m *Req) string { return keyspace.Pool(key(m)) }, quotaClient, call)
	return rt.checked(func(_ *node, m *Req) error { return shard.CheckQuotaKey("key", key(m)) })
}

// checked returns rt with check run before rt's own checks.
func (rt *keyRoute[Req, Resp]) checked(check func(*node, *Req) error) *keyRoute[Req, Resp] {
	rt.checks = append([]func(*node, *Req) error{check}, rt.checks...)
	return rt
}

// hooked returns rt served by hook.
func (rt *keyRoute[Req, Resp]) hooked(hook func(context.Context, *node, *connect.Request[Req], sender[Req, Resp], localCall[Req, Resp]) (*connect.Response[Resp], served, error)) *keyRoute[Req, Resp] {
	rt.hook = hook
	return rt
}

func lockClient(p *peer) wardenv1connect.LockServiceClient   { return p.Locks }
func quotaClient(p *peer) wardenv1connect.QuotaServiceClient { return p.Quota }
func adminClient(p *peer) wardenv1connect.AdminServiceClient { return p.Admin }

// The routes of the procedures about one key whose handler Batch and
// RenewBatch call too.
var (
	acquireRoute = routeOf((*wardenv1.AcquireRequest).GetResource, lockClient, wardenv1connect.LockServiceClient.Acquire).checked(checkAcquire).hooked(serveAcquire)
	renewRoute   = routeOf((*wardenv1.RenewRequest).GetResource, lockClient, wardenv1connect.LockServiceClient.Renew).checked(checkRenew)
	releaseRoute = routeOf((*wardenv1.ReleaseRequest).GetResource, lockClient, wardenv1connect.LockServiceClient.Release).checked(checkRelease)
)

// The checks of a lock call that need nothing of the shard: a call that
// fails one is refused where it came in, never forwarded (the security
// review found invalid input carried to the leader's node first).
func checkAcquire(_ *node, m *wardenv1.AcquireRequest) error { return validateAcquire(m) }

func checkRenew(_ *node, m *wardenv1.RenewRequest) error {
	_, err := leaseRef(m.GetResource(), m.GetLeaseId())
	return err
}

func checkRelease(_ *node, m *wardenv1.ReleaseRequest) error {
	_, err := leaseRef(m.GetResource(), m.GetLeaseId())
	return err
}

func checkDescribe(_ *node, m *wardenv1.DescribeRequest) error {
	return validateResource(m.GetResource())
}

// routes are the routed procedures, by name.
var routes = map[string]route{
	wardenv1connect.LockServiceAcquireProcedure:  acquireRoute,
	wardenv1connect.LockServiceRenewProcedure:    renewRoute,
	wardenv1connect.LockServiceReleaseProcedure:  releaseRoute,
	wardenv1connect.LockServiceDescribeProcedure: routeOf((*wardenv1.DescribeRequest).GetResource, lockClient, wardenv1connect.LockServiceClient.Describe).checked(checkDescribe),

	wardenv1connect.AdminServiceRevokeLeaseProcedure: routeOf((*wardenv1.RevokeLeaseRequest).GetResource, adminClient, wardenv1connect.AdminServiceClient.RevokeLease).checked(checkRevoke),

	wardenv1connect.QuotaServiceSetLimitProcedure:         quotaRoute((*wardenv1.SetLimitRequest).GetKey, wardenv1connect.QuotaServiceClient.SetLimit),
	wardenv1connect.QuotaServiceReserveProcedure:          quotaRoute((*wardenv1.ReserveRequest).GetKey, wardenv1connect.QuotaServiceClient.Reserve),
	wardenv1connect.QuotaServiceCommitProcedure:           quotaRoute((*wardenv1.CommitRequest).GetKey, wardenv1connect.QuotaServiceClient.Commit),
	wardenv1connect.QuotaServiceReleaseProcedure:          quotaRoute((*wardenv1.QuotaServiceReleaseRequest).GetKey, wardenv1connect.QuotaServiceClient.Release),
	wardenv1connect.QuotaServiceQueryProcedure:            quotaRoute((*wardenv1.QueryRequest).GetKey, wardenv1connect.QuotaServiceClient.Query).checked(checkQuery).hooked(serveQuery),
	wardenv1connect.QuotaServiceListReservationsProcedure: quotaRoute((*wardenv1.ListReservationsRequest).GetKey, wardenv1connect.QuotaServiceClient.ListReservations),
	wardenv1connect.QuotaServiceListLedgerProcedure:       quotaRoute((*wardenv1.ListLedgerRequest).GetKey, wardenv1connect.QuotaServiceClient.ListLedger),
	wardenv1connect.QuotaServiceReportUsageProcedure:      quotaRoute((*wardenv1.ReportUsageRequest).GetKey, wardenv1connect.QuotaServiceClient.ReportUsage).checked(checkReportUsage),
	wardenv1connect.QuotaServiceUnfreezeProcedure:         quotaRoute((*wardenv1.UnfreezeRequest).GetPool, wardenv1connect.QuotaServiceClient.Unfreeze).checked(checkUnfreeze),
}

// run serves req: refused by a check, else by hook, else plain.
func (rt *keyRoute[Req, Resp]) run(ctx context.Context, n *node, req *connect.Request[Req], local localCall[Req, Resp]) (*connect.Response[Resp], served, error) {
	for _, check := range rt.checks {
		if err := check(n, req.Msg); err != nil {
			return nil, servedHere, err
		}
	}
	send := func(ctx context.Context, req *connect.Request[Req], wrap func(peerCall[Req, Resp]) peerCall[Req, Resp]) (*connect.Response[Resp], served, error) {
		call := rt.call
		if wrap != nil {
			call = func(p *peer) peerCall[Req, Resp] { return wrap(rt.call(p)) }
		}
		return forward(ctx, n, req, rt.key(req.Msg), call)
	}
	if rt.hook != nil {
		return rt.hook(ctx, n, req, send, local)
	}
	return plain(ctx, req, send, local)
}

// plain is the routing rule: the call is forwarded when its key's shard
// is led on another node, else served here.
func plain[Req, Resp any](ctx context.Context, req *connect.Request[Req], send sender[Req, Resp], local localCall[Req, Resp]) (*connect.Response[Resp], served, error) {
	if resp, where, err := send(ctx, req, nil); where != servedHere {
		return resp, where, err
	}
	resp, err := local(ctx, req)
	return resp, servedHere, err
}

func (rt *keyRoute[Req, Resp]) serve(ctx context.Context, n *node, req connect.AnyRequest, local connect.UnaryFunc) (connect.AnyResponse, served, error) {
	resp, where, err := rt.run(ctx, n, req.(*connect.Request[Req]), func(ctx context.Context, req *connect.Request[Req]) (*connect.Response[Resp], error) {
		resp, err := local(ctx, req)
		if err != nil {
			return nil, err
		}
		return resp.(*connect.Response[Resp]), nil
	})
	if err != nil {
		return nil, where, err
	}
	return resp, where, nil
}

// routing is the interceptor that routes the client calls about one key
// (routes).
type routing struct{ r *node }

var _ connect.Interceptor = routing{}

func (rt routing) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		route := routes[req.Spec().Procedure]
		if route == nil {
			return next(ctx, req)
		}
		resp, where, err := route.serve(ctx, rt.r, req, next)
		if where == servedThere {
			servedElsewhere(ctx)
		}
		return resp, err
	}
}

func (routing) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler: the one streaming RPC, Backup, is served here.
func (routing) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
