package router

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/warden-dev/warden/auth"
	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/shard"
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

// ReplayPrincipal is the principal an Acquire's dedup record keeps, so
// that only it may replay the request (shard.VersionPrincipal): ctx's
// authenticated principal with authentication on, else none (everyone
// may do everything then, replays included).
func (r *Router) ReplayPrincipal(ctx context.Context) string {
	if pol, err := r.auth.Policy(); err == nil && pol.Enabled() {
		return PrincipalOf(ctx)
	}
	return ""
}

// WatchCall returns a context of ctx, the call of a client (or a
// forwarded one) that needs perm on resource, that ends when a newer
// auth state no longer authenticates the call's credentials (its cause
// then an Unauthenticated error) or no longer allows its principal perm
// on resource (PermissionDenied): so a revoked token's or an unbound
// principal's waiting Acquire ends within the time a revocation takes
// (AuthMaxStale). The caller calls stop when the call ends. A forwarded
// call's credentials are checked again by the node that authenticated
// it, whose own watch ends the forwarded call.
func (r *Router) WatchCall(ctx context.Context, perm auth.Permission, resource string) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	principal := PrincipalOf(ctx)
	cred, _ := ctx.Value(CredentialKey{}).(*http.Request)
	w := &AuthWatch{cancel: cancel, check: func(pol *auth.Policy) error {
		if cred != nil {
			p, err := AuthenticateWith(pol, cred)
			if err != nil {
				return err
			}
			if p != principal {
				return connect.NewError(connect.CodeUnauthenticated, errors.New("the call's credentials now name another principal"))
			}
		}
		return AuthorizeWith(pol, principal, perm, "", resource)
	}}
	a := r.Auth()
	a.mu.Lock()
	if a.watches == nil {
		a.watches = map[*AuthWatch]struct{}{}
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

// AuthenticateWith is authenticate by policy pol.
func AuthenticateWith(pol *auth.Policy, req *http.Request) (string, error) {
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

// AuthorizeWith is authorize by policy pol, for principal.
func AuthorizeWith(pol *auth.Policy, principal string, perm, alt auth.Permission, resource string) error {
	if pol.Allows(principal, perm, resource) || alt != "" && pol.Allows(principal, alt, resource) {
		return nil
	}
	what := fmt.Sprintf("%s on %s", perm, LogQuote(resource))
	if perm == auth.Admin {
		what = string(auth.Admin)
	}
	return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("principal %s lacks %s", LogQuote(principal), what))
}

// MaxLogField bounds, in bytes, a caller's text (a resource, key,
// holder or principal) where an audit line or an error message repeats
// it: the longest a valid resource or holder may be.
const MaxLogField = shard.MaxResourceBytes

// LogQuote is s, as a caller sent it, for an error message: quoted, cut
// to MaxLogField bytes and escaped (shard.LogText).
func LogQuote(s string) string { return `"` + shard.LogText(s, MaxLogField) + `"` }
