// Package etcd adapts an etcd v3 cluster to the load harness as a
// harness.Target, in one of two modes that users of etcd actually run:
//
//   - ModeLease: one lease per lock. Acquire grants a lease and puts the
//     lock key under it in a transaction guarded by CreateRevision(key)==0;
//     the fencing token is the key's create (= mod) revision. Renew is a
//     lease keep-alive, Release a lease revoke (which deletes the key).
//   - ModeMutex: etcd's own recipe, concurrency.Mutex, with one
//     concurrency.Session per lock built on a lease the target grants
//     itself. Waiters queue on their own keys under the lock prefix; the
//     token is the holder key's create revision.
//
// Neither mode keeps leases alive in the background: the harness schedules
// renewals itself, and a lease that is not renewed expires on the server.
package etcd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/warden-dev/warden/loadtest/harness"
)

// Mode selects how locks are built on etcd.
type Mode string

const (
	// ModeLease is a per-lock lease plus a guarded put (see the package doc).
	ModeLease Mode = "lease"
	// ModeMutex is concurrency.Mutex on a per-lock session.
	ModeMutex Mode = "mutex"
)

// Config configures a Target.
type Config struct {
	// Endpoints are the members' client URLs ("http://127.0.0.1:12379").
	// Required.
	Endpoints []string
	// Mode is ModeLease (the default when empty) or ModeMutex.
	Mode Mode
	// Name is the target's report name; default "etcd" for ModeLease and
	// "etcd-mutex" for ModeMutex.
	Name string
	// Conns is the number of client connections, each balancing over all
	// Endpoints; operations take them round-robin. Default 4.
	Conns int
	// Prefix is prepended to every key; default "/warden-load/".
	Prefix string
	// DialTimeout bounds New's wait for the first connection; default 5 s.
	DialTimeout time.Duration
	// Script is the path of peers/etcd.sh, used by Fault for "kill",
	// "kill-leader" and "restart". Empty disables those kinds.
	Script string
	// ScriptEnv is added to the environment the script runs with
	// ("KEY=VALUE": LOADTEST_PEER_DIR, ETCD_CLIENT_BASE, ...).
	ScriptEnv []string
	// Logger is the etcd client's logger; default a no-op logger.
	Logger *zap.Logger
}

// Target is a harness.Target and harness.Faulter backed by etcd. It is safe
// for concurrent use.
type Target struct {
	cfg     Config
	clients []*clientv3.Client
	next    atomic.Uint64
	bg      sync.WaitGroup
}

// handle is the Lease.Handle of an etcd lease.
type handle struct {
	id  clientv3.LeaseID
	key string
	// mu is set in ModeMutex.
	mu *concurrency.Mutex
}

var (
	_ harness.Target  = (*Target)(nil)
	_ harness.Faulter = (*Target)(nil)
)

// cleanupTimeout bounds the background revokes that undo a failed acquire.
const cleanupTimeout = 10 * time.Second

// New connects cfg.Conns clients to cfg.Endpoints and checks that the
// cluster answers (a linearizable Get) before ctx ends. It fails on an
// unknown Mode, no endpoints, or an unreachable cluster.
func New(ctx context.Context, cfg Config) (*Target, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("etcd: no endpoints")
	}
	switch cfg.Mode {
	case "":
		cfg.Mode = ModeLease
	case ModeLease, ModeMutex:
	default:
		return nil, fmt.Errorf("etcd: unknown mode %q (want %q or %q)", cfg.Mode, ModeLease, ModeMutex)
	}
	if cfg.Name == "" {
		cfg.Name = "etcd"
		if cfg.Mode == ModeMutex {
			cfg.Name = "etcd-mutex"
		}
	}
	if cfg.Conns <= 0 {
		cfg.Conns = 4
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/warden-load/"
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	t := &Target{cfg: cfg}
	for i := 0; i < cfg.Conns; i++ {
		c, err := clientv3.New(clientv3.Config{
			Endpoints:   cfg.Endpoints,
			DialTimeout: cfg.DialTimeout,
			Logger:      cfg.Logger,
			Context:     context.Background(),
		})
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("etcd: connect: %w", err)
		}
		t.clients = append(t.clients, c)
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if _, err := t.clients[0].Get(pctx, cfg.Prefix+"ping"); err != nil {
		t.Close()
		return nil, fmt.Errorf("etcd: cluster does not answer: %w", classify(err))
	}
	return t, nil
}

// Name returns the configured report name.
func (t *Target) Name() string { return t.cfg.Name }

func (t *Target) client() *clientv3.Client {
	return t.clients[t.next.Add(1)%uint64(len(t.clients))]
}

// ttlSeconds rounds a TTL up to whole seconds, at least 1: etcd leases have
// one-second resolution. (The server also raises TTLs below its minimum,
// 1.5 election timeouts rounded up, 2 s by default; Lease.TTL reports what
// it granted.)
func ttlSeconds(ttl time.Duration) int64 {
	s := int64(math.Ceil(ttl.Seconds()))
	if s < 1 {
		s = 1
	}
	return s
}

func (t *Target) lockKey(resource string) string {
	if t.cfg.Mode == ModeMutex {
		return t.cfg.Prefix + "mutex/" + resource
	}
	return t.cfg.Prefix + "lease/" + resource
}

// Acquire grants a lease of ttl (rounded up to seconds) and takes the lock
// on resource under it. With wait 0 a held lock gives ErrHeld (the lease is
// revoked first); with wait > 0 it queues until the holder goes or wait
// ends (ErrHeld). The Lease's Token is the lock key's create revision, its
// TTL the granted lease TTL. Other errors carry a Code (see classify).
func (t *Target) Acquire(ctx context.Context, resource string, ttl, wait time.Duration) (harness.Lease, error) {
	c := t.client()
	g, err := c.Grant(ctx, ttlSeconds(ttl))
	if err != nil {
		return harness.Lease{}, classify(err)
	}
	granted := time.Duration(g.TTL) * time.Second
	var l harness.Lease
	if t.cfg.Mode == ModeMutex {
		l, err = t.acquireMutex(ctx, c, g.ID, granted, resource, wait)
	} else {
		l, err = t.acquireLease(ctx, c, g.ID, granted, resource, wait)
	}
	if err != nil {
		// Revoking the lease also deletes any key put under it, which
		// covers a put that committed but whose answer was lost. On
		// ErrHeld it is part of the measured cost of a failed try;
		// otherwise ctx may be done, so it runs in the background.
		if errors.Is(err, harness.ErrHeld) && ctx.Err() == nil {
			rctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
			_, rerr := c.Revoke(rctx, g.ID)
			cancel()
			if rerr != nil && !isLeaseNotFound(rerr) {
				return harness.Lease{}, classify(rerr)
			}
		} else {
			t.revokeLater(c, g.ID)
		}
		return harness.Lease{}, err
	}
	l.Resource = resource
	l.TTL = granted
	return l, nil
}

// keepAliveWhileWaiting keeps lease id alive with a keep-alive every ttl/3
// (no Raft entry) while an acquire queues, so that a wait longer than the
// TTL does not lose the waiter's lease; a granted lock is then renewed by
// the harness alone. The returned func stops it and waits for it.
func keepAliveWhileWaiting(ctx context.Context, c *clientv3.Client, id clientv3.LeaseID, ttl time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(max(ttl/3, 100*time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_, _ = c.KeepAliveOnce(ctx, id)
			}
		}
	}()
	return func() { cancel(); <-done }
}

func (t *Target) revokeLater(c *clientv3.Client, id clientv3.LeaseID) {
	t.bg.Add(1)
	go func() {
		defer t.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_, _ = c.Revoke(ctx, id)
	}()
}

// acquireLease is ModeLease's acquire on a granted lease id (of granted
// TTL ttl). While it waits it watches the key for its deletion, then tries
// the txn again.
func (t *Target) acquireLease(ctx context.Context, c *clientv3.Client, id clientv3.LeaseID, ttl time.Duration, resource string, wait time.Duration) (harness.Lease, error) {
	key := t.lockKey(resource)
	wctx := ctx
	if wait > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	for attempt := 0; ; attempt++ {
		if attempt == 1 {
			defer keepAliveWhileWaiting(ctx, c, id, ttl)()
		}
		resp, err := c.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, "", clientv3.WithLease(id))).
			Else(clientv3.OpGet(key, clientv3.WithKeysOnly())).
			Commit()
		if err != nil {
			return harness.Lease{}, classify(err)
		}
		if resp.Succeeded {
			return harness.Lease{
				Token:  uint64(resp.Header.Revision),
				Handle: &handle{id: id, key: key},
			}, nil
		}
		if wait <= 0 {
			return harness.Lease{}, harness.ErrHeld
		}
		if err := waitDelete(wctx, c, key, resp.Header.Revision); err != nil {
			if ctx.Err() == nil && wctx.Err() != nil {
				return harness.Lease{}, harness.ErrHeld
			}
			return harness.Lease{}, classify(err)
		}
	}
}

// waitDelete waits for key to be deleted after revision rev, or for ctx.
// A watch that ends for another reason (compaction, cancellation by the
// server) returns nil so that the caller tries again.
func waitDelete(ctx context.Context, c *clientv3.Client, key string, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := c.Watch(wctx, key, clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	for wr := range wch {
		if err := wr.Err(); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return nil
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return nil
			}
		}
	}
	return ctx.Err()
}

// acquireMutex is ModeMutex's acquire on a granted lease id.
func (t *Target) acquireMutex(ctx context.Context, c *clientv3.Client, id clientv3.LeaseID, ttl time.Duration, resource string, wait time.Duration) (harness.Lease, error) {
	// NewSession always starts a KeepAlive for its lease; Orphan stops it
	// right away so the harness's own schedule is the only renewal. (At
	// most one keep-alive may go out in between; keep-alives are not Raft
	// writes.) The session is only a carrier for the lease id.
	s, err := concurrency.NewSession(c, concurrency.WithLease(id), concurrency.WithContext(context.Background()))
	if err != nil {
		return harness.Lease{}, classify(err)
	}
	s.Orphan()
	m := concurrency.NewMutex(s, t.lockKey(resource))
	if wait <= 0 {
		if err := m.TryLock(ctx); err != nil {
			if errors.Is(err, concurrency.ErrLocked) {
				return harness.Lease{}, harness.ErrHeld
			}
			return harness.Lease{}, classify(err)
		}
	} else {
		wctx, cancel := context.WithTimeout(ctx, wait)
		stop := keepAliveWhileWaiting(ctx, c, id, ttl)
		err := m.Lock(wctx)
		stop()
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				return harness.Lease{}, harness.ErrHeld
			}
			return harness.Lease{}, classify(err)
		}
	}
	return harness.Lease{
		Token:  uint64(ownerRevision(m)),
		Handle: &handle{id: id, key: m.Key(), mu: m},
	}, nil
}

// ownerRevision is the create revision of the mutex's own key, the
// revision Mutex.IsOwner compares against. (After a wait, m.Header() is
// the header of a later Get, not of the put.)
func ownerRevision(m *concurrency.Mutex) int64 {
	cmp := m.IsOwner()
	if cr, ok := cmp.TargetUnion.(*pb.Compare_CreateRevision); ok {
		return cr.CreateRevision
	}
	return m.Header().Revision
}

// Renew sends one lease keep-alive (handled by the leader, no Raft entry).
// ErrLost when the lease has expired or was revoked.
func (t *Target) Renew(ctx context.Context, l harness.Lease) error {
	h, err := harness.HandleOf[*handle]("etcd", l)
	if err != nil {
		return err
	}
	resp, err := t.client().KeepAliveOnce(ctx, h.id)
	if err != nil {
		if isLeaseNotFound(err) {
			return harness.ErrLost
		}
		return classify(err)
	}
	if resp.TTL <= 0 {
		return harness.ErrLost
	}
	return nil
}

// Release revokes the lease, which deletes the lock key with it; in
// ModeMutex it first deletes the mutex key (Mutex.Unlock), as the recipe
// does. ErrLost when the lease was already gone.
func (t *Target) Release(ctx context.Context, l harness.Lease) error {
	h, err := harness.HandleOf[*handle]("etcd", l)
	if err != nil {
		return err
	}
	c := t.client()
	if h.mu != nil {
		if err := h.mu.Unlock(ctx); err != nil {
			return classify(err)
		}
	}
	if _, err := c.Revoke(ctx, h.id); err != nil {
		if isLeaseNotFound(err) {
			return harness.ErrLost
		}
		return classify(err)
	}
	return nil
}

// Costs counts Raft log entries per successful operation: a lease grant,
// a txn and a revoke are one entry each; a keep-alive is none (etcd 3.4
// renews on the leader without a log entry, lease checkpoints being off by
// default).
func (t *Target) Costs() harness.Costs {
	if t.cfg.Mode == ModeMutex {
		return harness.Costs{
			Acquire: 2, Renew: 0, Release: 2,
			Note: "etcd mutex: acquire = LeaseGrant + Txn(put own key; read owner); " +
				"release = Unlock (delete) + LeaseRevoke; renew = LeaseKeepAlive, no Raft entry. " +
				"A failed try costs grant+txn+delete+revoke = 4; a waiter that gets the lock " +
				"costs no extra writes. Session keep-alive is stopped at once (Orphan); the " +
				"harness renews. An expired lease costs the leader one revoke entry.",
		}
	}
	return harness.Costs{
		Acquire: 2, Renew: 0, Release: 1,
		Note: "etcd lease: acquire = LeaseGrant + Txn(if create_revision==0 put with lease); " +
			"release = LeaseRevoke (deletes the key); renew = LeaseKeepAlive, no Raft entry. " +
			"A failed try costs grant+txn+revoke = 3; a waiter re-runs the txn after each delete " +
			"it sees (one more entry per retry). An expired lease costs the leader one revoke entry.",
	}
}

// Close waits for background revokes and closes the clients.
func (t *Target) Close() error {
	t.bg.Wait()
	var errs []error
	for _, c := range t.clients {
		if err := c.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Fault injects a fault (see harness.Faulter):
//
//   - "kill", "kill-leader", "restart": run the script's killfollower,
//     killleader and start (start brings back whatever is not running
//     and waits until every member is healthy).
//   - "snapshot": etcd cannot be told to take a Raft snapshot (it does so
//     every --snapshot-count entries); this compacts the MVCC key history
//     up to the current revision on the whole cluster (Compact with
//     WithCompactPhysical, a Raft entry every member applies), which is
//     etcd's own log/history compaction.
//   - "transfer-leader": Maintenance.MoveLeader from the leader to another
//     started member.
func (t *Target) Fault(ctx context.Context, kind string) error {
	switch kind {
	case "kill":
		return t.script(ctx, "killfollower")
	case "kill-leader":
		return t.script(ctx, "killleader")
	case "restart":
		return t.script(ctx, "start")
	case "snapshot":
		return t.compact(ctx)
	case "transfer-leader":
		return t.moveLeader(ctx)
	default:
		return fmt.Errorf("etcd: unknown fault kind %q", kind)
	}
}

// script runs the peer script (cfg.Script) with args and cfg.ScriptEnv.
func (t *Target) script(ctx context.Context, args ...string) error {
	if t.cfg.Script == "" {
		return errors.New("etcd: no peer script configured for faults")
	}
	if err := harness.RunScript(ctx, t.cfg.Script, t.cfg.ScriptEnv, args...); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	return nil
}

func (t *Target) compact(ctx context.Context) error {
	c := t.client()
	resp, err := c.Get(ctx, t.cfg.Prefix+"compact-probe")
	if err != nil {
		return classify(err)
	}
	if _, err := c.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) {
			return nil
		}
		return classify(err)
	}
	return nil
}

func (t *Target) moveLeader(ctx context.Context) error {
	c := t.client()
	var leaderEP string
	var leaderID uint64
	var others []uint64
	for _, ep := range t.cfg.Endpoints {
		st, err := c.Status(ctx, ep)
		if err != nil {
			continue // a killed member
		}
		if st.Header.MemberId == st.Leader {
			leaderEP, leaderID = ep, st.Leader
		} else {
			others = append(others, st.Header.MemberId)
		}
	}
	if leaderEP == "" || len(others) == 0 {
		return harness.CodedError{Kind: "unavailable", Err: errors.New("etcd: transfer-leader: no leader or no other member reachable")}
	}
	lc, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{leaderEP},
		DialTimeout: t.cfg.DialTimeout,
		Logger:      t.cfg.Logger,
	})
	if err != nil {
		return classify(err)
	}
	defer lc.Close()
	to := others[int(t.next.Add(1))%len(others)]
	if _, err := lc.MoveLeader(ctx, to); err != nil {
		return fmt.Errorf("etcd: move leader %x to %x: %w", leaderID, to, classify(err))
	}
	return nil
}

func isLeaseNotFound(err error) bool {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return true
	}
	return grpcCode(err) == codes.NotFound && strings.Contains(err.Error(), "lease not found")
}

// grpcCode is the gRPC code of an etcd client error, codes.Unknown when it
// has none.
func grpcCode(err error) codes.Code {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code()
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	return codes.Unknown
}

// classify gives err a report code: "deadline_exceeded" for a context or
// gRPC deadline, "canceled", "unavailable" for gRPC Unavailable (no leader,
// leader changed, request timed out, member down) and for no reachable
// endpoint, otherwise the gRPC code's name in snake case
// ("resource_exhausted"), or "other".
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
	case errors.Is(err, clientv3.ErrNoAvailableEndpoints):
		return harness.CodedError{Kind: "unavailable", Err: err}
	}
	code := grpcCode(err)
	switch code {
	case codes.Unknown:
		return harness.CodedError{Kind: "other", Err: err}
	case codes.Unavailable:
		return harness.CodedError{Kind: "unavailable", Err: err}
	default:
		return harness.CodedError{Kind: snake(code.String()), Err: err}
	}
}

// snake turns "DeadlineExceeded" into "deadline_exceeded".
func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}
