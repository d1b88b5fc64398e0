package router

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/auth"
	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// Authentication and authorization (docs/security.md). The HTTP layer
// (guard) authenticates every client call before its body is read: the
// principal is a verified client certificate's (auth.PrincipalOf), or a
// bearer token's, or, on a call another node forwarded over the
// peer-authenticated link, the original caller's (principalHeader). The
// authorizer interceptor, inside the observer so that denials are
// counted and audited, then checks the call's permission on its resource
// or key before anything is proposed; Batch and RenewBatch check each op
// and deny it alone.
//
// Every node decides by the auth state of the placement group, which it
// reads with the map (linearizably, every MapInterval). With
// authentication on, a node whose last good read began more than
// authMaxStale ago answers Unavailable instead of deciding by a view
// that may miss a revocation: so a revoked token or binding stops
// working on every node within authMaxStale plus one read.

// principalHeader carries the principal of a forwarded call's original
// caller; guard honours it only from another node.
const principalHeader = "Warden-Principal"

// authMaxStale bounds the age of the auth view a node decides by. With
// authentication on, watchAuth reads the auth state every authRefresh,
// each read bounded by authReadTimeout: a read sent to a placement leader
// that just died gives up, and the next one reaches the new leader (an
// election takes about 200 ms), long before the view is too old. (The
// map's own reads wait up to 5 s and were the only ones at first: a
// leader's SIGKILL under load left a node refusing for seconds.)
const (
	authMaxStale    = 1500 * time.Millisecond
	authRefresh     = 250 * time.Millisecond
	authReadTimeout = 750 * time.Millisecond
)

// watchAuth keeps the auth view fresh while authentication is on (or
// required), until Stop.
func (r *Router) watchAuth() {
	tick := time.NewTicker(authRefresh)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		if v := r.auth.p.Load(); !r.auth.required && (v == nil || !v.policy.Enabled()) {
			continue // the map's reads bring a change that turns it on
		}
		ctx, cancel := context.WithTimeout(context.Background(), authReadTimeout)
		begun := time.Now()
		st, err := r.meta.Read(ctx)
		cancel()
		if err == nil {
			r.auth.set(st.GetAuth(), begun)
		}
	}
}

// authView is a compiled auth state and when the read that returned it
// began.
type authView struct {
	policy *auth.Policy
	readAt time.Time
}

// authState holds the newest auth view a node has read.
type authState struct {
	p atomic.Pointer[authView]
	// required: refuse calls while the auth state is unset
	// (Config.AuthRequired).
	required bool
	// mu guards watches: the calls (waiting Acquires) that a newer auth
	// state checks again (watchCall).
	mu      sync.Mutex
	watches map[*authWatch]struct{}
}

// authWatch is one watched call: check is what it would be answered by
// a policy (nil if it may go on), cancel ends it with that answer.
type authWatch struct {
	check  func(*auth.Policy) error
	cancel context.CancelCauseFunc
}

// set records st, read by a read that began at readAt, unless a newer
// revision is known already.
func (a *authState) set(st *placementv1.AuthState, readAt time.Time) {
	next := &authView{policy: auth.Compile(st), readAt: readAt}
	for {
		cur := a.p.Load()
		if cur != nil {
			if cur.policy.Revision() > next.policy.Revision() {
				return
			}
			// A revision at least as new is at least as fresh as the read
			// that found the older one.
			if cur.readAt.After(next.readAt) {
				next.readAt = cur.readAt
			}
		}
		if a.p.CompareAndSwap(cur, next) {
			if cur == nil || next.policy.Revision() > cur.policy.Revision() {
				a.recheck(next.policy)
			}
			return
		}
	}
}

// recheck ends every watched call that pol no longer lets go on.
func (a *authState) recheck(pol *auth.Policy) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for w := range a.watches {
		if err := w.check(pol); err != nil {
			w.cancel(err)
		}
	}
}

// watchCall returns a context of ctx, the call of a client (or a
// forwarded one) that needs perm on resource, that ends when a newer
// auth state no longer authenticates the call's credentials (its cause
// then an Unauthenticated error) or no longer allows its principal perm
// on resource (PermissionDenied): so a revoked token's or an unbound
// principal's waiting Acquire ends within the time a revocation takes
// (authMaxStale). The caller calls stop when the call ends. A forwarded
// call's credentials are checked again by the node that authenticated
// it, whose own watch ends the forwarded call.
func (r *Router) watchCall(ctx context.Context, perm auth.Permission, resource string) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	principal := principalOf(ctx)
	cred, _ := ctx.Value(credentialKey{}).(*http.Request)
	w := &authWatch{cancel: cancel, check: func(pol *auth.Policy) error {
		if cred != nil {
			p, err := authenticateWith(pol, cred)
			if err != nil {
				return err
			}
			if p != principal {
				return connect.NewError(connect.CodeUnauthenticated, errors.New("the call's credentials now name another principal"))
			}
		}
		return authorizeWith(pol, principal, perm, "", resource)
	}}
	a := &r.auth
	a.mu.Lock()
	if a.watches == nil {
		a.watches = map[*authWatch]struct{}{}
	}
	a.watches[w] = struct{}{}
	a.mu.Unlock()
	// A change read between the call's checks and now.
	if v := a.p.Load(); v != nil {
		if err := w.check(v.policy); err != nil {
			cancel(err)
		}
	}
	return ctx, func() {
		a.mu.Lock()
		delete(a.watches, w)
		a.mu.Unlock()
		cancel(nil)
	}
}

// policy is the view to decide by: its policy, or an Unavailable error
// when authentication is on and the view is too old.
func (a *authState) policy() (*auth.Policy, error) {
	var pol *auth.Policy // nil-safe: authentication off
	v := a.p.Load()
	if v != nil {
		pol = v.policy
	}
	if a.required && pol.Revision() == 0 {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("authentication is being set up (the auth bootstrap has not committed yet); retry"))
	}
	if pol.Enabled() && time.Since(v.readAt) > authMaxStale {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("this node has not read the cluster's credentials recently; retry, or call another node"))
	}
	return pol, nil
}

type principalKey struct{}

// credentialKey holds, in a client call's context, the request whose
// credentials (a token, a certificate, or none) guard authenticated, so
// that a newer auth state can check them again (watchCall).
type credentialKey struct{}

// principalOf is the authenticated principal of the call ctx serves (""
// when none was given).
func principalOf(ctx context.Context) string {
	p, _ := ctx.Value(principalKey{}).(string)
	return p
}

// ClientPath reports whether an HTTP request path names a method of the
// client services (warden.v1): those authentication covers, and those
// browser pages of other origins may call (server's CORS layer); not the
// probes, metrics, reflection or the dashboard's files.
func ClientPath(path string) bool {
	return strings.HasPrefix(path, "/warden.v1.")
}

// authenticate returns the principal of a client's request req (not
// another node's), and an error to answer it with, unread, when it does
// not authenticate: with authentication on, a call without credentials,
// over cleartext, or with a bad token. A token, the call's own
// credential, wins over the connection's certificate (a service holding
// a certificate may act with an operator's token).
func (a *authState) authenticate(req *http.Request) (string, error) {
	pol, err := a.policy()
	if err != nil {
		return "", err
	}
	return authenticateWith(pol, req)
}

// authenticateWith is authenticate by policy pol.
func authenticateWith(pol *auth.Policy, req *http.Request) (string, error) {
	if h := req.Header.Get("Authorization"); h != "" {
		if pol.Enabled() && req.TLS == nil {
			// A token sent in clear is as good as published.
			return "", connect.NewError(connect.CodeUnauthenticated, errors.New("authentication is on and needs TLS; call over https"))
		}
		token, ok := strings.CutPrefix(h, "Bearer ")
		if !ok && pol.Enabled() {
			return "", connect.NewError(connect.CodeUnauthenticated, errors.New(`the Authorization header must be "Bearer <token>"`))
		}
		principal, err := pol.Authenticate(strings.TrimSpace(token))
		if err != nil && pol.Enabled() {
			return "", connect.NewError(connect.CodeUnauthenticated, err)
		}
		return principal, nil
	}
	if req.TLS != nil && len(req.TLS.VerifiedChains) > 0 {
		if principal := auth.PrincipalOf(req.TLS.VerifiedChains[0][0]); principal != "" {
			return principal, nil
		}
	}
	if pol.Enabled() {
		return "", connect.NewError(connect.CodeUnauthenticated, errors.New("authentication is on: present a client certificate or a bearer token"))
	}
	return "", nil
}

// Refusal returns the error guard answers req with, unread, when req is
// a client's call of a client service (or of reflection) whose
// credentials do not authenticate; else nil. It is for a layer in front
// of NewHandler's that reads the body before guard sees the call
// (server's gRPC-Web-text translation), so that it reads none of a
// refused call.
func (r *Router) Refusal(req *http.Request) error {
	if fromNode(&r.cfg, req) || !authenticated(req.URL.Path) {
		return nil
	}
	_, err := r.auth.authenticate(req)
	return err
}

// BootstrapAuth proposes st as the cluster's first auth state
// (AuthCmd.bootstrap). It returns nil once some node's bootstrap has
// committed, this one's or another's.
func (r *Router) BootstrapAuth(ctx context.Context, st *placementv1.AuthState) error {
	_, err := r.meta.Propose(ctx, &placementv1.Command{Command: &placementv1.Command_Auth{Auth: &placementv1.AuthCmd{Op: &placementv1.AuthCmd_Bootstrap{Bootstrap: st}}}})
	var refused *placement.RefusedError
	if err != nil && !(errors.As(err, &refused) && refused.Reason == placement.ErrAuthBootstrapped.Error()) {
		return err
	}
	return r.RefreshMap(ctx)
}

// replayPrincipal is the principal an Acquire's dedup record keeps, so
// that only it may replay the request (shard.VersionPrincipal): ctx's
// authenticated principal with authentication on, else none (everyone
// may do everything then, replays included).
func (r *Router) replayPrincipal(ctx context.Context) string {
	if pol, err := r.auth.policy(); err == nil && pol.Enabled() {
		return principalOf(ctx)
	}
	return ""
}

// authorize returns nil if the call ctx serves may use perm on resource
// (alt, if set, is a permission that allows it too), else a
// PermissionDenied error naming the permission and the resource.
func (r *Router) authorize(ctx context.Context, perm, alt auth.Permission, resource string) error {
	pol, err := r.auth.policy()
	if err != nil {
		return err
	}
	return authorizeWith(pol, principalOf(ctx), perm, alt, resource)
}

// authorizeWith is authorize by policy pol, for principal.
func authorizeWith(pol *auth.Policy, principal string, perm, alt auth.Permission, resource string) error {
	if pol.Allows(principal, perm, resource) || alt != "" && pol.Allows(principal, alt, resource) {
		return nil
	}
	what := fmt.Sprintf("%s on %s", perm, logQuote(resource))
	if perm == auth.Admin {
		what = string(auth.Admin)
	}
	return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("principal %s lacks %s", logQuote(principal), what))
}

// requirement is the permission a client call needs, on what (a
// resource or quota key); alt, if set, allows it too. Batch and
// RenewBatch need none as a whole: each op is checked. A message no case
// names needs admin: a new RPC is closed until it is listed here.
func requirement(msg any) (perm, alt auth.Permission, resource string, whole bool) {
	type keyed interface{ GetKey() string }
	switch m := msg.(type) {
	case *wardenv1.AcquireRequest:
		return auth.Lock, "", m.GetResource(), true
	case *wardenv1.RenewRequest:
		return auth.Lock, "", m.GetResource(), true
	case *wardenv1.ReleaseRequest:
		return auth.Lock, "", m.GetResource(), true
	case *wardenv1.DescribeRequest:
		return auth.Lock, auth.Read, m.GetResource(), true
	case *wardenv1.BatchRequest, *wardenv1.RenewBatchRequest:
		return "", "", "", false
	case *wardenv1.ReserveRequest, *wardenv1.CommitRequest, *wardenv1.QuotaServiceReleaseRequest:
		return auth.QuotaUse, "", m.(keyed).GetKey(), true
	case *wardenv1.QueryRequest:
		return auth.QuotaUse, auth.Read, m.GetKey(), true
	case *wardenv1.ListReservationsRequest, *wardenv1.ListLedgerRequest:
		return auth.Read, auth.QuotaAdmin, m.(keyed).GetKey(), true
	case *wardenv1.SetLimitRequest, *wardenv1.ReportUsageRequest:
		return auth.QuotaAdmin, "", m.(keyed).GetKey(), true
	case *wardenv1.UnfreezeRequest:
		return auth.QuotaAdmin, "", m.GetPool(), true
	case *wardenv1.ListNodesRequest, *wardenv1.ListShardsRequest, *wardenv1.HotResourcesRequest:
		return auth.Read, auth.Admin, "", true
	}
	return auth.Admin, "", "", true
}

// authorizer is the interceptor that checks each client call's
// permission (requirement) before its handler runs.
type authorizer struct{ r *Router }

var _ connect.Interceptor = authorizer{}

func (a authorizer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if perm, alt, resource, whole := requirement(req.Any()); whole {
			if err := a.r.authorize(ctx, perm, alt, resource); err != nil {
				return nil, err
			}
		}
		return next(ctx, req)
	}
}

func (authorizer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler: a streaming RPC (AdminService.Backup, whose
// stream holds every lease id) needs the admin permission.
func (a authorizer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := a.r.authorize(ctx, auth.Admin, "", ""); err != nil {
			return err
		}
		return next(ctx, conn)
	}
}
