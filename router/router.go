package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/keyspace"
	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// LocalNode is a node running in this process with its Leadership (which
// must be the NodeHost's RaftEventListener).
type LocalNode struct {
	Node       *placement.Node
	Leadership *Leadership
	// ID and Raft are the node's id and the router's seam to its Raft
	// host, set by New from Node (tests set them to a fake or to
	// routertest's modelled group, and leave Node nil).
	ID   uint64
	Raft RaftHost
	// History holds the lock events the node's replicas applied: the
	// source of the watches it serves (nil: none kept).
	History *History
}

// leaderOf is the node's view of shardID's leader (replica id, term,
// whether known), from the newer of the Raft host's answer and the
// leader reports Leadership has heard: Dragonboat queues a LeaderUpdated
// event as soon as Raft learns of a leader, but updates what GetLeaderID
// reads only when its engine next processes the replica, so either may
// be ahead of the other for a moment. err, from the host, means the node
// hosts no running replica of the shard.
func (n *LocalNode) leaderOf(shardID uint64) (id, term uint64, valid bool, err error) {
	id, term, valid, err = n.Raft.LeaderOf(shardID)
	if err != nil {
		return 0, 0, false, err
	}
	if h, ok := n.Leadership.heard(shardID); ok && (h.term > term || h.term == term && !valid && h.leader != 0) {
		return h.leader, h.term, h.leader != 0, nil
	}
	return id, term, valid, nil
}

// Config tunes a Router. Zero values take the defaults.
type Config struct {
	// ProposeTimeout bounds one proposal or linearizable read (default 5 s).
	// The caller's deadline, when shorter, wins.
	ProposeTimeout time.Duration
	// LeaderWait bounds how long a request waits for an election before it
	// answers Unavailable (default 2 s).
	LeaderWait time.Duration
	// ScanInterval is the period of the leader's expiry and dedup timers
	// (default 250 ms). It adds to the time a crashed holder's lock stays
	// unavailable (DESIGN.md §1 rule 6).
	ScanInterval time.Duration
	// ScanLimit bounds the items of one Expire or Forget command (default 256).
	ScanLimit uint32
	Logger    *slog.Logger
	// Audit, if set, receives one record per Acquire, Renew and Release
	// (see audit.go); wardend writes it as JSON lines to --audit-log.
	Audit *slog.Logger
	// MetricsAuth: with authentication on, /metrics answers only a
	// caller allowed read on every key (wardend --metrics-auth). Without
	// it, any other caller gets the metrics without the series that name
	// quota pools (metricsHandler).
	MetricsAuth bool
	// MaxClockSkew is the clock offset bound the shards' config assumes
	// (default 500 ms, the shards' default). A node whose clock is more
	// than half of it away from the majority's stops proposing
	// time-driven commands and hands its leaderships away.
	MaxClockSkew time.Duration
	// ClockInterval is the period of the clock offset measurement
	// (default 1 s).
	ClockInterval time.Duration
	// ClusterSecret authenticates the nodes to each other on a cluster
	// without TLS (wardend --insecure): every call to the node-to-node
	// API (NodeService), which can change shards directly, must carry it,
	// and this node sends it with every call it makes to another node.
	// Every node must have the same one. PeerTLS, if set, authenticates
	// them by their peer certificates instead. With neither (a dev
	// cluster, whose nodes share one process) the node API is not served.
	ClusterSecret string
	PeerTLS       bool
	// ClientTLS: the client API is served over TLS, which authentication
	// needs (AuthService.SetEnabled refuses to turn it on without).
	ClientTLS bool
	// AuthRequired: until the cluster's auth state is set (revision 0),
	// client calls are refused Unavailable, not served unauthenticated
	// (a node given an auth bootstrap, which is yet to commit).
	AuthRequired bool
	// MoveWait bounds how long a request keeps retrying, transparently,
	// while its key's range is fenced by a move or its map is stale
	// (default 5 s; the caller's deadline, when shorter, wins).
	MoveWait time.Duration
	// MaxProposing bounds the node's proposals in flight (default 2,048,
	// Dragonboat's queue of a shard). Past it, requests wait, newest
	// first, and one whose deadline passes while waiting is never
	// proposed. Without the bound, dropped proposals were retried every
	// 10 ms and starved the work that completes them (the goodput figures
	// are in docs/perf/README.md, "Figures behind the code"); shedding a
	// long overload well is future work.
	MaxProposing int
	// Remote asks other nodes' admin API what only their replicas know
	// (Remote); the composition root passes the API layer's
	// (rpc.NewRemote). Without it, such questions go unanswered.
	Remote Remote
	// Knobs are for tests; a production node leaves them zero.
	Knobs TestingKnobs
}

// TestingKnobs gathers what tests (and wardend's hidden --debug-* flags,
// which the fault suite uses) change in a router, out of Config's
// production fields, as CockroachDB's StoreTestingKnobs do. The zero
// value is production behaviour.
type TestingKnobs struct {
	// ClockOffset is added to this node's wall clock, for its leader
	// clocks and its reads (wardend --debug-clock-offset): clock skew
	// tests.
	ClockOffset time.Duration
	// RevisionHeadroom is how close to shard.MaxRevision a shard's
	// revision may come before its leader gives it a new epoch (zero:
	// shard.RevisionHeadroom, 2^32 grants). Tests lower it to reach the
	// rollover in a few grants.
	RevisionHeadroom uint64
	// OnSnapshotBusy, if set, is called each time an admin snapshot
	// meets a replica taking another snapshot and waits for it.
	OnSnapshotBusy func()
	// OneClock counts every term's leader clock as confirmed without
	// clock readings, as for a shard whose replicas all run in this
	// process: routertest's routers, each with its own node of one
	// modelled group, share one clock.
	OneClock bool
}

func (c *Config) setDefaults() {
	if c.ProposeTimeout == 0 {
		c.ProposeTimeout = 5 * time.Second
	}
	if c.LeaderWait == 0 {
		c.LeaderWait = 2 * time.Second
	}
	if c.ScanInterval == 0 {
		c.ScanInterval = 250 * time.Millisecond
	}
	if c.ScanLimit == 0 {
		c.ScanLimit = 256
	}
	if c.MaxClockSkew == 0 {
		c.MaxClockSkew = 500 * time.Millisecond
	}
	if c.ClockInterval == 0 {
		c.ClockInterval = time.Second
	}
	if c.MoveWait == 0 {
		c.MoveWait = 5 * time.Second
	}
	if c.Knobs.RevisionHeadroom == 0 {
		c.Knobs.RevisionHeadroom = shard.RevisionHeadroom
	}
	if c.MaxProposing == 0 {
		c.MaxProposing = 2048
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Router routes requests to shard leaders, proposing on local nodes and
// forwarding to the node that hosts the leader otherwise, and runs the
// leader timers of the local nodes. Its methods are safe for concurrent
// use.
type Router struct {
	cfg   Config
	nodes []LocalNode
	maps  atomic.Pointer[placement.Map]
	meta  placement.MetaClient
	peers *Peers
	ops   *placement.Operators
	clock clockWatch
	waits *WaitRegistry
	// acquires estimates the Acquire rate of the busiest resources.
	acquires *RateTracker
	// proposing admits at most cfg.MaxProposing proposals at once; the
	// rest wait (newest first) without spinning.
	proposing *admission
	// auth is the newest auth view the node read with the map.
	auth authFeed
	// ready caches the last readiness answer (health.go).
	ready readiness
	stop  chan struct{}
	wg    sync.WaitGroup
}

// New returns a Router over the local nodes, whose replicas report their
// hand-offs to waits, routing by map m, refreshing it from meta, and
// reaching the other nodes through p (made with the cluster secret of
// cfg). Everything the router holds is set here, never patched in
// afterwards. Call Start to run the leader timers and Stop before
// closing the nodes.
func New(nodes []LocalNode, meta placement.MetaClient, m *placement.Map, waits *WaitRegistry, cfg Config, p *Peers) *Router {
	cfg.setDefaults()
	nodes = slices.Clone(nodes)
	for i := range nodes {
		if n := nodes[i].Node; n != nil {
			nodes[i].ID, nodes[i].Raft = n.ID(), HostOf(n)
		}
	}
	r := &Router{cfg: cfg, nodes: nodes, meta: meta, peers: p, waits: waits, clock: clockWatch{kick: make(chan struct{}, 1)}, acquires: newRateTracker(1024, 10*time.Second), proposing: newAdmission(cfg.MaxProposing), stop: make(chan struct{})}
	r.maps.Store(m)
	r.auth.publish(m.State().GetAuth(), time.Now())
	r.ops = &placement.Operators{Meta: meta, Shards: r.Shards(), Alloc: placement.NewAllocator(meta),
		Logger: cfg.Logger, Live: r.Live, Leads: r.LeadsPlacement, Cluster: jobCluster{r},
		OnFenced: func(d time.Duration) { metrics.splitFence.Observe(d.Seconds()) }}
	return r
}

// Map returns the placement map the router routes by.
func (r *Router) Map() *placement.Map { return r.maps.Load() }

// SetMap replaces the router's map with m unless m is older.
func (r *Router) SetMap(m *placement.Map) {
	for {
		cur := r.maps.Load()
		if m.Generation() < cur.Generation() || r.maps.CompareAndSwap(cur, m) {
			return
		}
	}
}

// RefreshMap reads the committed placement map and routes by it.
func (r *Router) RefreshMap(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ProposeTimeout)
	defer cancel()
	begun := time.Now()
	st, err := r.meta.Read(ctx)
	if err != nil {
		return err
	}
	r.SetMap(placement.NewMap(st))
	r.auth.publish(st.GetAuth(), begun)
	return nil
}

// IsLocal reports whether node id runs in this process.
func (r *Router) IsLocal(id uint64) bool {
	for i := range r.nodes {
		if r.nodes[i].ID == id {
			return true
		}
	}
	return false
}

// MetaLeader returns the node that leads the placement group, as the
// local replicas know it, or nil.
func (r *Router) MetaLeader() *placementv1.Node {
	for i := range r.nodes {
		id, _, valid, err := r.nodes[i].leaderOf(placement.MetaShardID)
		if err == nil && valid && id != 0 {
			return r.Map().Node(id) // meta replica id = node id
		}
	}
	return nil
}

// LeadsPlacement reports whether a local node leads the placement group,
// where the operators in progress (splits, moves) are driven.
func (r *Router) LeadsPlacement() bool {
	l := r.MetaLeader()
	return l != nil && r.IsLocal(l.GetId())
}

// DriveOperators runs the operators in progress in the map to their end
// (placement.Operators.Drive); call it on the placement leader only.
func (r *Router) DriveOperators(ctx context.Context) error { return r.ops.Drive(ctx) }

// Logger returns the logger the router writes to (Config.Logger).
func (r *Router) Logger() *slog.Logger { return r.cfg.Logger }

// Start runs the leader timers of every local node and the clock offset
// measurement.
func (r *Router) Start() {
	for i := range r.nodes {
		r.wg.Add(1)
		go r.runTimers(&r.nodes[i])
	}
	r.wg.Go(r.watchClock)
	r.wg.Go(r.watchAuth)
	replicas.add(r)
}

// Stop ends the timers and waits for them.
func (r *Router) Stop() {
	replicas.remove(r)
	close(r.stop)
	r.wg.Wait()
}

// RemoteLeader says that a shard's leader (or, for a node that hosts no
// replica of the shard, a replica that knows it) runs on another node.
type RemoteLeader struct {
	ShardID uint64
	Node    *placementv1.Node
	// Term is the leader's Raft term when node is known to lead, 0 when
	// node is only a replica to ask.
	Term uint64
}

func (e *RemoteLeader) Error() string {
	return fmt.Sprintf("router: shard %d is led from node %d (%s)", e.ShardID, e.Node.GetId(), e.Node.GetListenAddr())
}

// NoLeaderError says that no replica the router knows of has a leader
// for shardID; errors.Is(err, ErrNoLeader) holds.
type NoLeaderError struct{ ShardID uint64 }

func (e *NoLeaderError) Error() string   { return fmt.Sprintf("%v %d", ErrNoLeader, e.ShardID) }
func (e *NoLeaderError) Is(t error) bool { return t == ErrNoLeader }

// leader finds the local node that leads shardID in its current term,
// waiting up to LeaderWait for an election. It returns a *remoteLeader
// when the leader is known to run elsewhere (or, after half the wait, a
// remote replica's node when no local replica knows the leader), and
// ErrNoLeader when no leader appears.
func (r *Router) leader(ctx context.Context, shardID uint64) (*LocalNode, leaderTerm, error) {
	start := time.Now()
	deadline := start.Add(r.cfg.LeaderWait)
	// The nodes' report channels, taken before each look but the first,
	// so that a report made after a look wakes the wait that follows it.
	// Most lookups find the leader at the first look and take none.
	var changes []<-chan struct{}
	for {
		for i := range changes {
			changes[i] = r.nodes[i].Leadership.changes()
		}
		hosted := false
		for i := range r.nodes {
			n := &r.nodes[i]
			id, term, valid, err := n.leaderOf(shardID)
			if err != nil {
				continue
			}
			hosted = true
			if !valid || id == 0 {
				continue
			}
			// Replica ids are per shard: a node's replica of a shard made by
			// a split or a move has its own id, not the node's.
			t, ok := n.Leadership.term(shardID)
			if ok && id == t.replicaID && term == t.term {
				return n, t, nil
			}
			if m := r.Map(); (!ok || id != t.replicaID) && shardID != placement.MetaShardID {
				if node := m.ReplicaNode(shardID, id); node != nil && !r.IsLocal(node.GetId()) {
					return nil, leaderTerm{}, &RemoteLeader{ShardID: shardID, Node: node, Term: term}
				}
			}
		}
		if shardID != placement.MetaShardID && (!hosted || time.Since(start) >= r.cfg.LeaderWait/2) {
			// No replica here, or none here has learned the leader in half
			// the leader wait (an election takes 0.2–0.4 s at the default
			// RTT: a replica a move has just added, still catching up, or
			// one whose map does not yet list the leader's replica): ask a
			// node that hosts one (any: each retry may try another).
			m := r.Map()
			reps := m.Shard(shardID).GetReplicas()
			off := rand.IntN(len(reps) + 1) // where to start (+1: IntN(0) panics)
			for k := range reps {
				rep := reps[(k+off)%len(reps)]
				// Not one that missed its last clock reading: a stopped
				// node would not answer.
				if node := m.Node(rep.GetNodeId()); node != nil && !r.IsLocal(node.GetId()) && r.Live(node.GetId()) {
					return nil, leaderTerm{}, &RemoteLeader{ShardID: shardID, Node: node}
				}
			}
		}
		now := time.Now()
		if now.After(deadline) {
			return nil, leaderTerm{}, &NoLeaderError{shardID}
		}
		if changes == nil {
			changes = make([]<-chan struct{}, len(r.nodes))
			continue // look again, the channels taken, before waiting
		}
		wait := min(deadline.Sub(now), leaderBackstop)
		if half := start.Add(r.cfg.LeaderWait / 2); half.After(now) {
			wait = min(wait, half.Sub(now))
		}
		if err := awaitAny(ctx, changes, wait); err != nil {
			return nil, leaderTerm{}, err
		}
	}
}

// leaderBackstop bounds a leader lookup's wait for a leader report: a
// replica that stops, or starts knowing nothing, reports none.
const leaderBackstop = 100 * time.Millisecond

// awaitAny waits until one of chans is closed, d passes, or ctx ends
// (its error).
func awaitAny(ctx context.Context, chans []<-chan struct{}, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	if len(chans) == 1 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-chans[0]:
		case <-timer.C:
		}
		return nil
	}
	woken := make(chan struct{})
	done := make(chan struct{})
	defer close(done)
	var once sync.Once
	for _, ch := range chans {
		go func() {
			select {
			case <-ch:
				once.Do(func() { close(woken) })
			case <-done:
			}
		}()
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-woken:
	case <-timer.C:
	}
	return nil
}

// Propose sends a command for key to its shard's leader and returns the
// shard's result; a result that refused the command is a *resultError.
// The leader is normally local (the RPC was routed here); when leadership
// has moved since, the command is proposed through the leader's node over
// NodeService. While the key's range is moving or the map is stale, it
// refreshes the map and retries for up to MoveWait.
func (r *Router) Propose(ctx context.Context, key string, env *shardv1.Envelope) (*shardv1.Result, error) {
	return r.retryMoved(ctx, key, func() (*shardv1.Result, error) {
		m := r.Map()
		rg, err := m.ShardFor(key)
		if err != nil {
			return nil, err
		}
		env.Generation = m.Generation()
		return r.Shards().Propose(ctx, rg.GetShardId(), env)
	})
}

// retryMoved runs f, which routes key by the current map, until its
// result is neither "wrong shard" nor "range moving", refreshing the map
// between tries, for up to MoveWait. A result that refused the command
// is returned with a *resultError, which says where the map puts key
// when the range had not settled.
func (r *Router) retryMoved(ctx context.Context, key string, f func() (*shardv1.Result, error)) (*shardv1.Result, error) {
	deadline := time.Now().Add(r.cfg.MoveWait)
	for {
		res, err := f()
		if err != nil {
			return nil, err
		}
		c := res.GetCode()
		if c == shardv1.Code_CODE_OK || c == shardv1.Code_CODE_QUEUED {
			return res, nil
		}
		if !MovedOn(c) {
			return res, &ResultError{Res: res}
		}
		if time.Now().After(deadline) {
			return res, &ResultError{Res: res, Moved: r.rangeMoved(key)}
		}
		metrics.moveRetries.Inc()
		select {
		case <-ctx.Done():
			// The caller's own deadline or cancel decides what it is told.
			return res, fmt.Errorf("%w: the shard answered %v: %s", ctx.Err(), c, res.GetReason())
		case <-time.After(20 * time.Millisecond):
		}
		if err := r.RefreshMap(ctx); err != nil {
			r.cfg.Logger.Debug("refreshing the placement map", "err", err)
		}
	}
}

// rangeMoved says where the current map puts key's range and where that
// shard is led from, as far as this node knows (nil: the map has no range
// for key).
func (r *Router) rangeMoved(key string) *RangeMoved {
	m := r.Map()
	rg, err := m.ShardFor(key)
	if err != nil {
		return nil
	}
	d := &RangeMoved{ShardID: rg.GetShardId(), Start: rg.GetStart(), End: rg.GetEnd(), Generation: m.Generation()}
	if id := r.LeaderNode(rg.GetShardId()); id != 0 {
		d.LeaderNodeID, d.LeaderAddress = id, m.Node(id).GetListenAddr()
	}
	return d
}

// MovedOn reports whether a shard refused a command with code c because
// the key's range left it or is moving: worth routing again by a fresher
// map.
func MovedOn(c shardv1.Code) bool {
	return c == shardv1.Code_CODE_WRONG_SHARD || c == shardv1.Code_CODE_UNAVAILABLE
}

// proposeOn stamps env with the term's clock and proposes it on node n;
// the caller has set env's generation.
func (r *Router) proposeOn(ctx context.Context, n *LocalNode, t leaderTerm, shardID uint64, env *shardv1.Envelope) (*shardv1.Result, error) {
	if err := r.proposing.acquire(ctx); err != nil {
		return nil, err
	}
	defer r.proposing.release()
	if err := r.awaitClock(ctx, n, t); err != nil {
		return nil, err
	}
	shared := r.sharedVersion(shardID)
	if shared < shard.VersionPrincipal {
		// Until every replica checks who replays a request, none does:
		// the old rule for all (an Acquire's principal is all that needs
		// the new version).
		env = shard.StripPrincipals(env)
	}
	need := shard.VersionOf(env)
	if need > shared {
		// A replica of an older binary would stop on it (and again on
		// every replay): not before every replica's node reports it.
		return nil, fmt.Errorf("%w: the command needs envelope version %d and not every replica of shard %d applies it yet (a rolling upgrade is under way)", ErrNoLeader, need, shardID)
	}
	env.Version = max(need, shared)
	env.ShardId = shardID
	env.NowUnixNano = t.now()
	cmd, err := shard.EncodeCommand(env)
	if err != nil {
		return nil, err
	}
	if t.over() {
		// It ended while the request waited for a slot or the clock: not
		// proposed, so the caller may look for the next leader.
		return nil, fmt.Errorf("%w (%w): shard %d's term %d here ended before the proposal was made", ErrNoLeader, ErrDropped, shardID, t.term)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ProposeTimeout)
	defer cancel()
	ctx, release := t.bound(ctx)
	defer release()
	start := time.Now()
	out, err := n.Raft.Propose(ctx, shardID, cmd)
	if err != nil {
		if errors.Is(context.Cause(ctx), errTermEnded) {
			// It may still commit under the next leader: the client
			// retries with the same id, as after a timeout, but now.
			err = fmt.Errorf("%w: %w (shard %d, term %d)", ErrOutcomeUnknown, errTermEnded, shardID, t.term)
		}
		metrics.proposalsFailed.WithLabelValues(proposalOutcome(err)).Inc()
		return nil, err
	}
	metrics.proposal.Observe(time.Since(start).Seconds())
	res := &shardv1.Result{}
	if err := proto.Unmarshal(out, res); err != nil {
		return nil, fmt.Errorf("router: shard %d result: %w", shardID, err)
	}
	return res, nil
}

// Read runs a linearizable read of key's shard on its leader, stamped
// with the leader's clock. A shard that no longer serves key (a stale
// map) makes it refresh the map and retry, as propose does.
func (r *Router) Read(ctx context.Context, key string, q *shardv1.Query) (*shardv1.QueryResult, error) {
	var out *shardv1.QueryResult
	_, err := r.retryMoved(ctx, key, func() (*shardv1.Result, error) {
		rg, err := r.Map().ShardFor(key)
		if err != nil {
			return nil, err
		}
		out, err = r.ReadShard(ctx, rg.GetShardId(), q)
		if err != nil {
			return nil, err
		}
		// A fenced record is frozen, so reading it during a move is exact.
		if meta := out.GetMeta(); meta.GetInactive() || !shard.InRange(meta.GetRange(), keyspace.Hash(key)) {
			return &shardv1.Result{Code: shardv1.Code_CODE_WRONG_SHARD, Reason: "the shard no longer owns the resource"}, nil
		}
		return &shardv1.Result{Code: shardv1.Code_CODE_OK}, nil
	})
	return out, err
}

// ReadShard runs a linearizable read of a shard on its leader, stamped
// with the leader's clock.
func (r *Router) ReadShard(ctx context.Context, shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	var out *shardv1.QueryResult
	err := r.retryDropped(ctx, func() error {
		n, t, err := r.leader(ctx, shardID)
		if err != nil {
			return err
		}
		q.NowUnixNano = t.now()
		rctx, cancel := context.WithTimeout(ctx, r.cfg.ProposeTimeout)
		defer cancel()
		rctx, release := t.bound(rctx)
		defer release()
		out, err = n.Raft.Read(rctx, shardID, q)
		if err != nil && errors.Is(context.Cause(rctx), errTermEnded) {
			// A read changes nothing: ask the next leader.
			return fmt.Errorf("%w (%w): %w (shard %d, term %d)", ErrNoLeader, ErrDropped, errTermEnded, shardID, t.term)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// retryDropped runs f again, for up to LeaderWait, while Dragonboat drops
// its request before proposing it (a shard still starting, a busy node).
func (r *Router) retryDropped(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(r.cfg.LeaderWait)
	for {
		err := f()
		if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			// The caller's own deadline or cancel decides what it is told.
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		}
		if !errors.Is(err, ErrDropped) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// runTimers drives the leader timers of one node until Stop.
func (r *Router) runTimers(n *LocalNode) {
	defer r.wg.Done()
	tick := time.NewTicker(r.cfg.ScanInterval)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		for _, t := range n.Leadership.led() {
			if t.shardID == placement.MetaShardID {
				continue
			}
			// A disk below its reserve was logged once by its node.
			if err := r.leaderTick(n, t); err != nil && !errors.As(err, new(*placement.DiskLowError)) {
				r.cfg.Logger.Warn("leader timer", "node", n.ID, "shard", t.shardID, "term", t.term, "err", err)
			}
		}
	}
}

// deposed reports whether NodeHost.GetLeaderID's answer (id, term, valid,
// err) shows that the term t is over: the replica is stopped (err), a later
// term has begun, or another replica leads this one. An answer for an
// earlier term, or for t's term without a leader yet, is a view that has
// not caught up: Dragonboat queues the LeaderUpdated event that recorded t
// as soon as Raft elects, but updates what GetLeaderID reads only when its
// engine next processes the replica's update. Dropping t on such a view
// would lose the term for good, since no second event comes for it, and
// the replica would lead without serving until the next election.
//
// leaderView is the whole decision leaderTick makes of such an answer.
func deposed(t leaderTerm, id, term uint64, valid bool, err error) bool {
	switch {
	case err != nil:
		return true
	case term != t.term:
		return term > t.term
	default:
		return valid && id != t.replicaID
	}
}

// leaderView is what a leader timer makes of GetLeaderID's answer for
// the term t: whether the replica leads in t now (the timers run), and,
// when not, whether t is over (drop it) rather than not yet visible.
func leaderView(t leaderTerm, id, term uint64, valid bool, err error) (leads, drop bool) {
	if err == nil && valid && id == t.replicaID && term == t.term {
		return true, false
	}
	return false, deposed(t, id, term, valid, err)
}

// leaderTick confirms a new term with a linearizable read, or, once
// confirmed, proposes the expirations due, a new epoch when revisions run
// low, and one batch of each of leaderTasks.
func (r *Router) leaderTick(n *LocalNode, t leaderTerm) error {
	id, term, valid, err := n.leaderOf(t.shardID)
	if leads, drop := leaderView(t, id, term, valid, err); !leads {
		if drop {
			n.Leadership.drop(t.shardID, t.term)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ProposeTimeout)
	defer cancel()
	if !t.confirmed {
		if _, err := n.Raft.Read(ctx, t.shardID, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}}); err != nil {
			return fmt.Errorf("confirming leadership: %w", err)
		}
		id, term, valid, err = n.leaderOf(t.shardID)
		if leads, _ := leaderView(t, id, term, valid, err); !leads {
			return nil // lost it meanwhile; the listener will catch up
		}
		n.Leadership.confirm(t.shardID, t.term)
		return nil
	}
	if r.clock.unsafe.Load() {
		return nil // a clock too far off must not decide expiries (DESIGN.md "Time")
	}
	scan := &shardv1.ScanQuery{Limit: r.cfg.ScanLimit}
	// Expiry: batch after batch while they come full, for up to one scan
	// interval, so a mass expiry drains at the rate Raft commits batches
	// (one batch a tick drained 1,024 leases/s at the defaults), and the
	// locks waiters queue for come first in each (records.expired).
	var meta *shardv1.ShardMeta
	for start := time.Now(); ; {
		q, err := r.localRead(n, t.shardID, &shardv1.Query{NowUnixNano: t.now(), Query: &shardv1.Query_Expired{Expired: scan}})
		if err != nil {
			return err
		}
		if meta == nil {
			meta = q.GetMeta()
		}
		shardLabel := strconv.FormatUint(t.shardID, 10)
		metrics.activeLocks.WithLabelValues(shardLabel).Set(float64(q.GetMeta().GetHeldLocks()))
		metrics.waiters.WithLabelValues(shardLabel).Set(float64(q.GetMeta().GetQueuedWaiters()))
		items := q.GetExpire().GetItems()
		if len(items) == 0 {
			break
		}
		res, err := r.proposeOn(ctx, n, t, t.shardID, &shardv1.Envelope{Generation: r.Map().Generation(), Command: &shardv1.Envelope_Expire{Expire: q.GetExpire()}})
		if err != nil {
			return fmt.Errorf("expire: %w", err)
		}
		metrics.expirations.Add(float64(res.GetCount()))
		if len(items) < int(r.cfg.ScanLimit) || time.Since(start) > r.cfg.ScanInterval || !r.leads(n, t.shardID, t) {
			break
		}
	}
	if err := r.renewEpoch(ctx, n, t, meta); err != nil {
		return err
	}
	for _, task := range leaderTasks {
		now := t.now()
		q, err := r.localRead(n, t.shardID, task.query(now, scan))
		if err != nil {
			return err
		}
		env := task.command(now, q)
		if env == nil {
			continue // nothing to do
		}
		env.Generation = r.Map().Generation()
		if _, err := r.proposeOn(ctx, n, t, t.shardID, env); err != nil {
			return fmt.Errorf("%s: %w", task.name, err)
		}
	}
	return nil
}

// leaderTask is one of the passes a leader timer makes after expiry: a
// local read of the candidates as of now, and the command that acts on
// them (nil when there are none), which apply re-checks.
type leaderTask struct {
	name    string
	query   func(now int64, scan *shardv1.ScanQuery) *shardv1.Query
	command func(now int64, q *shardv1.QueryResult) *shardv1.Envelope
}

// leaderTasks are the passes after expiry, in order: waiters past their
// wait, dedup entries and idle locks past the dedup window (and ended
// reservations), the quota reclaimer (reservations past their ttl: their
// capacity is free already; this frees the records), and ledger
// retention (events older than the retention fold into per-key
// checkpoints).
var leaderTasks = []leaderTask{
	{"drop waiters",
		func(now int64, scan *shardv1.ScanQuery) *shardv1.Query {
			return &shardv1.Query{NowUnixNano: now, Query: &shardv1.Query_TimedOut{TimedOut: scan}}
		},
		func(_ int64, q *shardv1.QueryResult) *shardv1.Envelope {
			if d := q.GetDrop(); len(d.GetItems()) > 0 {
				return &shardv1.Envelope{Command: &shardv1.Envelope_DropWaiters{DropWaiters: d}}
			}
			return nil
		}},
	{"forget",
		func(now int64, scan *shardv1.ScanQuery) *shardv1.Query {
			return &shardv1.Query{NowUnixNano: now, Query: &shardv1.Query_Forgettable{Forgettable: scan}}
		},
		func(_ int64, q *shardv1.QueryResult) *shardv1.Envelope {
			if f := q.GetForget(); len(f.GetDedup())+len(f.GetIdleLocks())+len(f.GetReservations()) > 0 {
				return &shardv1.Envelope{Command: &shardv1.Envelope_Forget{Forget: f}}
			}
			return nil
		}},
	{"reclaim",
		func(now int64, scan *shardv1.ScanQuery) *shardv1.Query {
			return &shardv1.Query{NowUnixNano: now, Query: &shardv1.Query_Reclaimable{Reclaimable: scan}}
		},
		func(now int64, q *shardv1.QueryResult) *shardv1.Envelope {
			rc := q.GetReclaim()
			if len(rc.GetItems()) == 0 {
				metrics.reclaimLag.Set(0)
				return nil
			}
			metrics.reclaimLag.Set(time.Duration(now - rc.GetItems()[0].GetExpiresAtUnixNano()).Seconds())
			return &shardv1.Envelope{Command: &shardv1.Envelope_Reclaim{Reclaim: rc}}
		}},
	{"compact ledger",
		func(now int64, scan *shardv1.ScanQuery) *shardv1.Query {
			return &shardv1.Query{NowUnixNano: now, Query: &shardv1.Query_Compactable{Compactable: scan}}
		},
		func(_ int64, q *shardv1.QueryResult) *shardv1.Envelope {
			if c := q.GetCompact(); len(c.GetItems()) > 0 {
				return &shardv1.Envelope{Command: &shardv1.Envelope_CompactLedger{CompactLedger: c}}
			}
			return nil
		}},
}

// renewEpoch gives the shard term t leads a new epoch from the placement
// allocator once its revision (in meta, as the local replica has it) is
// within RevisionHeadroom of MaxRevision, so that grants go on instead of
// being refused for want of revisions. An epoch drawn but not applied
// (the proposal failed) is never used again: the allocator only moves on.
func (r *Router) renewEpoch(ctx context.Context, n *LocalNode, t leaderTerm, meta *shardv1.ShardMeta) error {
	if meta.GetInactive() || meta.GetRevision() < shard.MaxRevision-min(r.cfg.Knobs.RevisionHeadroom, shard.MaxRevision) || r.ops == nil || !r.Applies(t.shardID, shard.VersionNewEpoch) {
		return nil
	}
	epoch, err := r.ops.Alloc.Next(ctx)
	if err != nil {
		return fmt.Errorf("new epoch: %w", err)
	}
	res, err := r.proposeOn(ctx, n, t, t.shardID, &shardv1.Envelope{Generation: r.Map().Generation(), Command: &shardv1.Envelope_NewEpoch{NewEpoch: &shardv1.NewEpochCmd{Epoch: epoch}}})
	if err != nil {
		return fmt.Errorf("new epoch: %w", err)
	}
	if res.GetCode() != shardv1.Code_CODE_OK {
		return fmt.Errorf("new epoch %d: %v: %s", epoch, res.GetCode(), res.GetReason())
	}
	r.cfg.Logger.Info("shard took a new epoch: its revisions were running out", "shard", t.shardID, "epoch", epoch, "revision", meta.GetRevision())
	return nil
}

// localRead reads the local replica without a quorum round; the leader
// timers only use it to find candidates, which apply re-checks.
func (r *Router) localRead(n *LocalNode, shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	return n.Raft.StaleRead(shardID, q)
}

// leads reports whether node n still leads shardID in term t.
func (r *Router) leads(n *LocalNode, shardID uint64, t leaderTerm) bool {
	cur, ok := n.Leadership.term(shardID)
	return ok && cur.term == t.term
}

// StaleRead reads key's pool from a local replica without a quorum round
// (possibly behind: the answer says as of when).
func (r *Router) StaleRead(key string, q *shardv1.Query) (*shardv1.QueryResult, bool) {
	rg, err := r.Map().ShardFor(keyspace.Pool(key))
	if err != nil {
		return nil, false
	}
	for i := range r.nodes {
		if out, err := r.nodes[i].Raft.StaleRead(rg.GetShardId(), q); err == nil {
			return out, true
		}
	}
	return nil, false
}
