package rpc

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
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/router"
)

// AuthMaxStale bounds the age of the auth view a node decides by: past
// it, with authentication on, calls are refused Unavailable. The routing
// core reads the auth state well within it (router.AuthRefresh).
const AuthMaxStale = 1500 * time.Millisecond

// authView is a compiled auth state and when the read that returned it
// began.
type authView struct {
	policy *auth.Policy
	readAt time.Time
}

// newAuthState returns an auth view holding st as read at readAt; with
// required, a nil st (no auth state committed yet) refuses every call,
// as a node given an auth bootstrap does (router.Config.AuthRequired).
// A node keeps its own, fed by the routing core (router.Router.OnAuth).
func newAuthState(st *placementv1.AuthState, readAt time.Time, required bool) *authState {
	a := &authState{required: required}
	a.set(st, readAt)
	return a
}

// authState holds the newest auth view a node has read.
type authState struct {
	p atomic.Pointer[authView]
	// required: refuse calls while the auth state is unset
	// (router.Config.AuthRequired).
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

// Policy is the view to decide by: its policy, or an Unavailable error
// when authentication is on and the view is too old.
func (a *authState) Policy() (*auth.Policy, error) {
	var pol *auth.Policy // nil-safe: authentication off
	v := a.p.Load()
	if v != nil {
		pol = v.policy
	}
	if a.required && pol.Revision() == 0 {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("authentication is being set up (the auth bootstrap has not committed yet); retry"))
	}
	if pol.Enabled() && time.Since(v.readAt) > AuthMaxStale {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("this node has not read the cluster's credentials recently; retry, or call another node"))
	}
	return pol, nil
}

// credentialKey holds, in a client call's context, the request whose
// credentials (a token, a certificate, or none) guard authenticated, so
// that a newer auth state can check them again (watchCall).
type credentialKey struct{}

// replayPrincipal is the principal an Acquire's dedup record keeps, so
// that only it may replay the request (shard.VersionPrincipal): ctx's
// authenticated principal with authentication on, else none (everyone
// may do everything then, replays included). It fails, as authorization
// does, when the node's auth view is too old to decide by: recording
// none then would let any principal replay the request and be handed
// its lease (the attack review did it with a view 3 s old).
func (n *node) replayPrincipal(ctx context.Context) (string, error) {
	pol, err := n.auth.Policy()
	if err != nil || !pol.Enabled() {
		return "", err
	}
	return router.PrincipalOf(ctx), nil
}

// watchCall returns a context of ctx, the call of a client (or a
// forwarded one) that needs perm on resource, that ends when a newer
// auth state no longer authenticates the call's credentials (its cause
// then an Unauthenticated error) or no longer allows its principal perm
// on resource (PermissionDenied): so a revoked token's or an unbound
// principal's waiting Acquire ends within the time a revocation takes
// (AuthMaxStale). The caller calls stop when the call ends. A forwarded
// call's credentials are checked again by the node that authenticated
// it, whose own watch ends the forwarded call.
func (n *node) watchCall(ctx context.Context, perm auth.Permission, resource string) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	principal := router.PrincipalOf(ctx)
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
	a := n.auth
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

// authorizeWith is authorize by policy pol, for principal.
func authorizeWith(pol *auth.Policy, principal string, perm, alt auth.Permission, resource string) error {
	if pol.Allows(principal, perm, resource) || alt != "" && pol.Allows(principal, alt, resource) {
		return nil
	}
	what := fmt.Sprintf("%s on %s", perm, router.LogQuote(resource))
	if perm == auth.Admin {
		what = string(auth.Admin)
	}
	return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("principal %s lacks %s", router.LogQuote(principal), what))
}
