// Package zk adapts a ZooKeeper ensemble to the load harness as a
// harness.Target, using the standard ZooKeeper lock recipe (the one on
// the ZooKeeper recipes page and in Curator's InterProcessMutex):
//
//   - Each resource has a parent znode Root/<resource> (a container node,
//     created lazily once and reaped by the server when it is empty).
//   - Acquire creates an ephemeral sequential child "lock-" under it (the
//     client's "protected" form, whose GUID prefix makes the create safe
//     to retry after a lost connection), lists the children, and holds
//     the lock when its node has the lowest sequence number. Otherwise it
//     gives up at once (wait 0: it deletes its node and returns ErrHeld)
//     or watches its predecessor and looks again when that goes.
//   - The fencing token is the lock node's czxid, which grows across the
//     whole ensemble (leader changes included).
//   - A lease is an ephemeral node of a session: it lives as long as the
//     session does. Sessions are pooled (Config.Sessions per distinct
//     TTL, with the TTL as session timeout); the client library's pings
//     are ZooKeeper's renewals, so Renew only checks that the session is
//     still the one that created the node. Release deletes the node.
package zk

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-dev/warden/loadtest/harness"
)

// Config configures a Target.
type Config struct {
	// Servers are the ensemble's client addresses ("127.0.0.1:12181").
	// Required.
	Servers []string
	// Name is the target's report name; default "zk".
	Name string
	// Sessions is the number of sessions opened for each distinct lease
	// TTL asked for; Acquire takes them round-robin. Default 16.
	Sessions int
	// Root is the parent of the per-resource lock nodes; default
	// "/warden-load/locks".
	Root string
	// ConnectTimeout bounds New's wait for its first session; default 10 s.
	ConnectTimeout time.Duration
	// Dialer, when set, opens the sessions' TCP connections (tests use it
	// to cut a session off so that it expires).
	Dialer zk.Dialer
	// Logger receives the client library's log lines; default none.
	Logger zk.Logger
	// Script is the path of peers/zk.sh, used by Fault for "kill",
	// "kill-leader" and "restart". Empty disables those kinds.
	Script string
	// ScriptEnv is added to the environment the script runs with
	// ("KEY=VALUE": LOADTEST_PEER_DIR, ZK_CLIENT_BASE, ...).
	ScriptEnv []string
}

// Target is a harness.Target and harness.Faulter backed by ZooKeeper. It is
// safe for concurrent use.
type Target struct {
	cfg    Config
	acl    []zk.ACL
	closed atomic.Bool

	mu    sync.Mutex
	pools map[time.Duration]*pool

	parents sync.Map // parent path → struct{}: known to exist

	// minSession and maxSession are the ensemble's session timeout bounds
	// (from the "conf" four-letter word), zero when unknown.
	minSession, maxSession time.Duration

	bg sync.WaitGroup
}

type pool struct {
	conns []*zk.Conn
	next  atomic.Uint64
}

// handle is the Lease.Handle of a ZooKeeper lease.
type handle struct {
	conn *zk.Conn
	path string
	// session is the id of the session that owns the node.
	session int64
	// released is set by Release, so that Renew after Release reports
	// ErrLost without a round trip.
	released atomic.Bool
}

var (
	_ harness.Target  = (*Target)(nil)
	_ harness.Faulter = (*Target)(nil)
)

type discardLogger struct{}

func (discardLogger) Printf(string, ...any) {}

// New opens one session to check that the ensemble serves, creates Root
// (persistent nodes) if missing and closes that session; lock sessions are
// opened on first use of each TTL. It reads the ensemble's session timeout
// bounds with the "conf" four-letter word when that is enabled, to report
// the TTLs the servers actually grant.
func New(ctx context.Context, cfg Config) (*Target, error) {
	if len(cfg.Servers) == 0 {
		return nil, errors.New("zk: no servers")
	}
	if cfg.Name == "" {
		cfg.Name = "zk"
	}
	if cfg.Sessions <= 0 {
		cfg.Sessions = 16
	}
	if cfg.Root == "" {
		cfg.Root = "/warden-load/locks"
	}
	cfg.Root = "/" + strings.Trim(cfg.Root, "/")
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = discardLogger{}
	}
	t := &Target{cfg: cfg, acl: zk.WorldACL(zk.PermAll), pools: map[time.Duration]*pool{}}
	t.minSession, t.maxSession = sessionBounds(cfg.Servers)

	cctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	conn, events, err := t.connect(10 * time.Second)
	if err != nil {
		return nil, fmt.Errorf("zk: connect: %w", err)
	}
	defer conn.Close()
	for conn.State() != zk.StateHasSession {
		select {
		case <-events:
		case <-time.After(50 * time.Millisecond):
		case <-cctx.Done():
			return nil, fmt.Errorf("zk: no session: %w", classify(cctx.Err()))
		}
	}
	if err := t.ensurePath(conn, cfg.Root); err != nil {
		return nil, fmt.Errorf("zk: create %s: %w", cfg.Root, classify(err))
	}
	return t, nil
}

// connect opens a session with the given timeout; it is established in
// the background.
func (t *Target) connect(timeout time.Duration) (*zk.Conn, <-chan zk.Event, error) {
	dial := t.cfg.Dialer
	if dial == nil {
		dial = net.DialTimeout
	}
	return zk.Connect(t.cfg.Servers, timeout,
		zk.WithLogger(t.cfg.Logger), zk.WithLogInfo(false), zk.WithDialer(dial))
}

// ensurePath creates p and its ancestors as persistent nodes.
func (t *Target) ensurePath(conn *zk.Conn, p string) error {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	cur := ""
	for _, part := range parts {
		cur += "/" + part
		if _, err := conn.Create(cur, nil, zk.FlagPersistent, t.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// sessionBounds asks the servers' "conf" for min/maxSessionTimeout.
func sessionBounds(servers []string) (lo, hi time.Duration) {
	for _, s := range servers {
		out, err := fourLetter(s, "conf")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), "=")
			if !ok {
				continue
			}
			ms, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				continue
			}
			switch k {
			case "minSessionTimeout":
				lo = time.Duration(ms) * time.Millisecond
			case "maxSessionTimeout":
				hi = time.Duration(ms) * time.Millisecond
			}
		}
		if lo > 0 && hi > 0 {
			return lo, hi
		}
	}
	return 0, 0
}

func fourLetter(addr, cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, cmd); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

// Name returns the configured report name.
func (t *Target) Name() string { return t.cfg.Name }

// sessionTTL is the session timeout the ensemble grants for ttl: ttl
// clamped to [minSessionTimeout, maxSessionTimeout] when those are known.
func (t *Target) sessionTTL(ttl time.Duration) time.Duration {
	if t.minSession > 0 && ttl < t.minSession {
		return t.minSession
	}
	if t.maxSession > 0 && ttl > t.maxSession {
		return t.maxSession
	}
	return ttl
}

// conn picks a session of the pool for ttl, opening the pool first.
func (t *Target) conn(ttl time.Duration) (*zk.Conn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed.Load() {
		return nil, errors.New("zk: target closed")
	}
	p := t.pools[ttl]
	if p == nil {
		p = &pool{}
		for i := 0; i < t.cfg.Sessions; i++ {
			c, _, err := t.connect(ttl)
			if err != nil {
				for _, c := range p.conns {
					c.Close()
				}
				return nil, fmt.Errorf("zk: connect: %w", err)
			}
			p.conns = append(p.conns, c)
		}
		t.pools[ttl] = p
	}
	return p.conns[p.next.Add(1)%uint64(len(p.conns))], nil
}

// lockParent is the parent node of resource's lock nodes.
func (t *Target) lockParent(resource string) string {
	name := url.PathEscape(resource)
	if name == "" || name == "." || name == ".." {
		name = "_" + name
	}
	return t.cfg.Root + "/" + name
}

// ensureParent creates parent as a container node once.
func (t *Target) ensureParent(conn *zk.Conn, parent string) error {
	if _, ok := t.parents.Load(parent); ok {
		return nil
	}
	_, err := conn.CreateContainer(parent, nil, zk.FlagContainer, t.acl)
	if errors.Is(err, zk.ErrNoNode) { // Root was removed
		if err = t.ensurePath(conn, t.cfg.Root); err == nil {
			_, err = conn.CreateContainer(parent, nil, zk.FlagContainer, t.acl)
		}
	}
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return err
	}
	t.parents.Store(parent, struct{}{})
	return nil
}

// Acquire takes the lock on resource with a session whose timeout is ttl
// (see the package doc). With wait 0 a held lock gives ErrHeld after the
// node is deleted again; with wait > 0 it queues until its node is the
// lowest or wait ends (ErrHeld). Lease.TTL is the session timeout the
// ensemble grants. When ctx ends first Acquire returns at once; the node,
// if it was created, is deleted in the background. Other errors carry a
// Code (see classify).
func (t *Target) Acquire(ctx context.Context, resource string, ttl, wait time.Duration) (harness.Lease, error) {
	conn, err := t.conn(ttl)
	if err != nil {
		return harness.Lease{}, err
	}
	type result struct {
		l   harness.Lease
		err error
	}
	const running, delivered, abandoned = 0, 1, 2
	var state atomic.Int32
	ch := make(chan result, 1)
	t.bg.Add(1)
	go func() {
		defer t.bg.Done()
		l, err := t.acquire(ctx, conn, resource, ttl, wait)
		if state.CompareAndSwap(running, delivered) {
			ch <- result{l, err}
			return
		}
		if err == nil { // nobody will hold it
			_ = conn.Delete(l.Handle.(*handle).path, -1)
		}
	}()
	select {
	case r := <-ch:
		return r.l, r.err
	case <-ctx.Done():
		if state.CompareAndSwap(running, abandoned) {
			return harness.Lease{}, classify(ctx.Err())
		}
		r := <-ch
		return r.l, r.err
	}
}

// acquire runs the recipe on one session; it deletes its node on every
// path that does not grant the lock.
func (t *Target) acquire(ctx context.Context, conn *zk.Conn, resource string, ttl, wait time.Duration) (harness.Lease, error) {
	parent := t.lockParent(resource)
	if err := t.ensureParent(conn, parent); err != nil {
		return harness.Lease{}, classify(err)
	}
	path, err := conn.CreateProtectedEphemeralSequential(parent+"/lock-", nil, t.acl)
	if errors.Is(err, zk.ErrNoNode) { // the container was reaped after we cached it
		t.parents.Delete(parent)
		if err = t.ensureParent(conn, parent); err == nil {
			path, err = conn.CreateProtectedEphemeralSequential(parent+"/lock-", nil, t.acl)
		}
	}
	if err != nil {
		return harness.Lease{}, classify(err)
	}
	me := path[len(parent)+1:]
	giveUp := func(err error) (harness.Lease, error) {
		if derr := conn.Delete(path, -1); derr != nil && !errors.Is(derr, zk.ErrNoNode) && errors.Is(err, harness.ErrHeld) {
			return harness.Lease{}, classify(derr)
		}
		return harness.Lease{}, err
	}
	var timeout <-chan time.Time
	if wait > 0 {
		tm := time.NewTimer(wait)
		defer tm.Stop()
		timeout = tm.C
	}
	for {
		children, _, err := conn.Children(parent)
		if err != nil {
			return giveUp(classify(err))
		}
		pred, found := predecessor(children, me)
		if !found {
			// Our ephemeral node is gone: the session expired.
			return giveUp(harness.CodedError{Kind: "session_expired", Err: errors.New("zk: lock node vanished while acquiring")})
		}
		if pred == "" {
			ok, st, err := conn.Exists(path)
			if err != nil {
				return giveUp(classify(err))
			}
			if !ok {
				return harness.Lease{}, harness.CodedError{Kind: "session_expired", Err: errors.New("zk: lock node vanished on grant")}
			}
			return harness.Lease{
				Resource: resource,
				Token:    uint64(st.Czxid),
				TTL:      t.sessionTTL(ttl),
				Handle:   &handle{conn: conn, path: path, session: st.EphemeralOwner},
			}, nil
		}
		if wait <= 0 {
			return giveUp(harness.ErrHeld)
		}
		ok, _, ev, err := conn.ExistsW(parent + "/" + pred)
		if err != nil {
			return giveUp(classify(err))
		}
		if !ok {
			continue
		}
		select {
		case <-ev:
		case <-timeout:
			return giveUp(harness.ErrHeld)
		case <-ctx.Done():
			return giveUp(classify(ctx.Err()))
		}
	}
}

// seq is the sequence number ZooKeeper appended to a lock node's name
// (its last ten digits), -1 when there is none.
func seq(name string) int64 {
	if len(name) < 10 {
		return -1
	}
	n, err := strconv.ParseInt(name[len(name)-10:], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// predecessor returns the child just before me in sequence order ("" when
// me is first) and whether me is among children at all.
func predecessor(children []string, me string) (string, bool) {
	sort.Slice(children, func(i, j int) bool { return seq(children[i]) < seq(children[j]) })
	for i, c := range children {
		if c == me {
			if i == 0 {
				return "", true
			}
			return children[i-1], true
		}
	}
	return "", false
}

// Renew sends nothing: the session's pings keep the node alive. It
// returns ErrLost when the lease's node is gone (Release ran) or the
// session that owns it has expired (the client now has another session
// id, or reports StateExpired), and an "unavailable" error while the
// client is disconnected and cannot tell yet.
func (t *Target) Renew(ctx context.Context, l harness.Lease) error {
	h, err := harness.HandleOf[*handle]("zk", l)
	if err != nil {
		return err
	}
	if h.released.Load() {
		return harness.ErrLost
	}
	if h.conn.SessionID() != h.session {
		return harness.ErrLost
	}
	switch st := h.conn.State(); st {
	case zk.StateHasSession:
		return nil
	case zk.StateExpired:
		return harness.ErrLost
	default:
		return harness.CodedError{Kind: "unavailable", Err: fmt.Errorf("zk: session %#x is %v", h.session, st)}
	}
}

// Release deletes the lease's node; ErrLost when it was gone already
// (the session expired, or an earlier Release).
func (t *Target) Release(ctx context.Context, l harness.Lease) error {
	h, err := harness.HandleOf[*handle]("zk", l)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	t.bg.Add(1)
	go func() {
		defer t.bg.Done()
		errc <- h.conn.Delete(h.path, -1)
	}()
	select {
	case err = <-errc:
	case <-ctx.Done():
		return classify(ctx.Err())
	}
	switch {
	case err == nil:
		h.released.Store(true)
		return nil
	case errors.Is(err, zk.ErrNoNode):
		h.released.Store(true)
		return harness.ErrLost
	default:
		return classify(err)
	}
}

// Costs counts ZooKeeper write transactions (each a quorum commit in the
// leader's log) per successful operation.
func (t *Target) Costs() harness.Costs {
	return harness.Costs{
		Acquire: 1, Renew: 0, Release: 1,
		Note: "zk recipe: acquire = create ephemeral sequential (+ a container parent once per " +
			"resource, again if the server reaped it); a failed try costs create+delete = 2; a " +
			"waiter pays no extra write. Release = delete. Renew = 0: session pings (not logged) " +
			"keep ephemeral nodes alive. Sessions are pooled; opening or expiring one is one write.",
	}
}

// Close closes every session (which deletes their nodes) and waits for
// background work.
func (t *Target) Close() error {
	t.mu.Lock()
	t.closed.Store(true)
	pools := t.pools
	t.pools = map[time.Duration]*pool{}
	t.mu.Unlock()
	// Conn.Close waits up to 1 s for the server to end the session, so
	// close them all at once.
	var wg sync.WaitGroup
	for _, p := range pools {
		for _, c := range p.conns {
			wg.Add(1)
			go func() { defer wg.Done(); c.Close() }()
		}
	}
	wg.Wait()
	t.bg.Wait()
	return nil
}

// Fault injects a fault (see harness.Faulter): "kill", "kill-leader" and
// "restart" run the script's killfollower, killleader and start (start
// brings back whatever is not running and waits until every server
// serves). "snapshot" does nothing and returns nil: ZooKeeper snapshots on
// its own every ~snapCount transactions and 3.8 has no command to force
// one (the admin server's "snapshot" command arrived in 3.9).
// "transfer-leader" is not supported by ZooKeeper and returns an error.
func (t *Target) Fault(ctx context.Context, kind string) error {
	switch kind {
	case "kill":
		return t.script(ctx, "killfollower")
	case "kill-leader":
		return t.script(ctx, "killleader")
	case "restart":
		return t.script(ctx, "start")
	case "snapshot":
		return nil
	case "transfer-leader":
		return errors.New("zk: transfer-leader is not supported by ZooKeeper")
	default:
		return fmt.Errorf("zk: unknown fault kind %q", kind)
	}
}

// script runs the peer script (cfg.Script) with args and cfg.ScriptEnv.
func (t *Target) script(ctx context.Context, args ...string) error {
	if t.cfg.Script == "" {
		return errors.New("zk: no peer script configured for faults")
	}
	if err := harness.RunScript(ctx, t.cfg.Script, t.cfg.ScriptEnv, args...); err != nil {
		return fmt.Errorf("zk: %w", err)
	}
	return nil
}

// classify gives err a report code: "deadline_exceeded" and "canceled"
// for context errors; "unavailable" when the session has no server
// (connection closed, no server reachable, closing); "session_expired";
// "other" for anything else.
func classify(err error) error {
	if err == nil || errors.Is(err, harness.ErrHeld) || errors.Is(err, harness.ErrLost) {
		return err
	}
	var c harness.Coder
	if errors.As(err, &c) {
		return err
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return harness.CodedError{Kind: "deadline_exceeded", Err: err}
	case errors.Is(err, context.Canceled):
		return harness.CodedError{Kind: "canceled", Err: err}
	case errors.Is(err, zk.ErrConnectionClosed), errors.Is(err, zk.ErrNoServer),
		errors.Is(err, zk.ErrClosing):
		return harness.CodedError{Kind: "unavailable", Err: err}
	case errors.Is(err, zk.ErrSessionExpired):
		return harness.CodedError{Kind: "session_expired", Err: err}
	default:
		return harness.CodedError{Kind: "other", Err: err}
	}
}
