package router

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/warden-dev/warden/auth"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// AuthMaxStale bounds the age of the auth view a node decides by. With
// authentication on, watchAuth reads the auth state every authRefresh,
// each read bounded by authReadTimeout: a read sent to a placement leader
// that just died gives up, and the next one reaches the new leader (an
// election takes about 200 ms), long before the view is too old. (The
// map's own reads wait up to 5 s and were the only ones at first: a
// leader's SIGKILL under load left a node refusing for seconds.)
const (
	AuthMaxStale    = 1500 * time.Millisecond
	authRefresh     = 250 * time.Millisecond
	authReadTimeout = 750 * time.Millisecond
)

// authView is a compiled auth state and when the read that returned it
// began.
type authView struct {
	policy *auth.Policy
	readAt time.Time
}

// NewAuthState returns an auth view holding st as read at readAt; with
// required, a nil st (no auth state committed yet) refuses every call,
// as a node given an auth bootstrap does (Config.AuthRequired). A
// Router keeps its own, refreshed with the map (Router.Auth).
func NewAuthState(st *placementv1.AuthState, readAt time.Time, required bool) *AuthState {
	a := &AuthState{required: required}
	a.set(st, readAt)
	return a
}

// AuthState holds the newest auth view a node has read.
type AuthState struct {
	p atomic.Pointer[authView]
	// required: refuse calls while the auth state is unset
	// (Config.AuthRequired).
	required bool
	// mu guards watches: the calls (waiting Acquires) that a newer auth
	// state checks again (watchCall).
	mu      sync.Mutex
	watches map[*AuthWatch]struct{}
}

// AuthWatch is one watched call: check is what it would be answered by
// a policy (nil if it may go on), cancel ends it with that answer.
type AuthWatch struct {
	check  func(*auth.Policy) error
	cancel context.CancelCauseFunc
}

// set records st, read by a read that began at readAt, unless a newer
// revision is known already.
func (a *AuthState) set(st *placementv1.AuthState, readAt time.Time) {
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
func (a *AuthState) recheck(pol *auth.Policy) {
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
func (a *AuthState) Policy() (*auth.Policy, error) {
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
