package router

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/shard"
)

// With authentication on (or required), watchAuth reads the auth state
// every AuthRefresh, each read bounded by authReadTimeout: a read sent to
// a placement leader that just died gives up, and the next one reaches
// the new leader (an election takes about 200 ms), well within the age
// past which the API layer refuses to decide by its view (1.5 s,
// rpc.AuthMaxStale). (The map's own reads wait up to 5 s and were the
// only ones at first: a leader's SIGKILL under load left a node refusing
// for seconds.)
const (
	AuthRefresh     = 250 * time.Millisecond
	authReadTimeout = 750 * time.Millisecond
)

// authFeed hands every auth state the router reads (with the map, and
// from watchAuth) to the API layer, which authenticates and authorizes
// by it (OnAuth).
type authFeed struct {
	mu     sync.Mutex
	st     *placementv1.AuthState // the newest revision read
	readAt time.Time              // when the read that returned st began
	sinks  []func(*placementv1.AuthState, time.Time)
}

// publish records st, read by a read that began at readAt, and hands it
// to every sink.
func (f *authFeed) publish(st *placementv1.AuthState, readAt time.Time) {
	f.mu.Lock()
	if f.st == nil || st.GetRevision() >= f.st.GetRevision() {
		f.st, f.readAt = st, readAt
	}
	sinks := f.sinks
	f.mu.Unlock()
	for _, sink := range sinks {
		sink(st, readAt)
	}
}

// enabled reports whether the newest auth state read turns
// authentication on.
func (f *authFeed) enabled() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st.GetEnabled()
}

// OnAuth calls sink with the newest auth state the router has read and
// when the read began, and then with every one it reads: after each map
// refresh, and every AuthRefresh while authentication is on or required.
// Calls may overlap, and an older revision may come after a newer one:
// the sink keeps the newest.
func (r *Router) OnAuth(sink func(st *placementv1.AuthState, readAt time.Time)) {
	f := &r.auth
	f.mu.Lock()
	f.sinks = append(f.sinks[:len(f.sinks):len(f.sinks)], sink)
	st, readAt := f.st, f.readAt
	f.mu.Unlock()
	sink(st, readAt)
}

// watchAuth keeps the auth state fresh while authentication is on (or
// required), until Stop.
func (r *Router) watchAuth() {
	tick := time.NewTicker(AuthRefresh)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		if !r.cfg.AuthRequired && !r.auth.enabled() {
			continue // the map's reads bring a change that turns it on
		}
		ctx, cancel := context.WithTimeout(context.Background(), authReadTimeout)
		begun := time.Now()
		st, err := r.meta.Read(ctx)
		cancel()
		if err == nil {
			r.auth.publish(st.GetAuth(), begun)
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

// MaxLogField bounds, in bytes, a caller's text (a resource, key,
// holder or principal) where an audit line or an error message repeats
// it: the longest a valid resource or holder may be.
const MaxLogField = shard.MaxResourceBytes

// LogQuote is s, as a caller sent it, for an error message: quoted, cut
// to MaxLogField bytes and escaped (shard.LogText).
func LogQuote(s string) string { return `"` + shard.LogText(s, MaxLogField) + `"` }
