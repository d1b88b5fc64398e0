package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/placement"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// LocalNode is a node running in this process with its Leadership (which
// must be the NodeHost's RaftEventListener).
type LocalNode struct {
	Node       *placement.Node
	Leadership *Leadership
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
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Router routes requests to shard leaders among the local nodes and runs
// their leader timers. Its methods are safe for concurrent use.
type Router struct {
	cfg   Config
	nodes []LocalNode
	pmap  *placement.Map
	waits *WaitRegistry
	// acquires estimates the Acquire rate of the busiest resources.
	acquires *rateTracker
	stop     chan struct{}
	wg       sync.WaitGroup
}

// New returns a Router over the local nodes, whose replicas report their
// hand-offs to waits. Call Start to run the leader timers and Stop before
// closing the nodes.
func New(nodes []LocalNode, m *placement.Map, waits *WaitRegistry, cfg Config) *Router {
	cfg.setDefaults()
	return &Router{cfg: cfg, nodes: nodes, pmap: m, waits: waits, acquires: newRateTracker(1024, 10*time.Second), stop: make(chan struct{})}
}

// Start runs the leader timers of every local node.
func (r *Router) Start() {
	for i := range r.nodes {
		r.wg.Add(1)
		go r.runTimers(&r.nodes[i])
	}
}

// Stop ends the timers and waits for them.
func (r *Router) Stop() {
	close(r.stop)
	r.wg.Wait()
}

// leader finds the local node that leads shardID in its current term,
// waiting up to LeaderWait for an election. It returns ErrNoLeader when
// no local node leads.
func (r *Router) leader(ctx context.Context, shardID uint64) (*LocalNode, leaderTerm, error) {
	deadline := time.Now().Add(r.cfg.LeaderWait)
	for {
		for i := range r.nodes {
			n := &r.nodes[i]
			t, ok := n.Leadership.term(shardID)
			if !ok {
				continue
			}
			id, term, valid, err := n.Node.NH.GetLeaderID(shardID)
			if err == nil && valid && id == n.Node.ID() && term == t.term {
				return n, t, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, leaderTerm{}, fmt.Errorf("%w %d", ErrNoLeader, shardID)
		}
		select {
		case <-ctx.Done():
			return nil, leaderTerm{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// route finds the shard that owns key and the local node leading it.
func (r *Router) route(ctx context.Context, key string) (uint64, *LocalNode, leaderTerm, error) {
	shardID, err := r.pmap.ShardFor(key)
	if err != nil {
		return 0, nil, leaderTerm{}, err
	}
	n, t, err := r.leader(ctx, shardID)
	return shardID, n, t, err
}

// propose sends a command for key to its shard's leader and returns the
// shard's result; a result that refused the command is a *resultError.
func (r *Router) propose(ctx context.Context, key string, env *shardv1.Envelope) (*shardv1.Result, error) {
	var res *shardv1.Result
	err := r.retryDropped(ctx, func() error {
		shardID, n, t, err := r.route(ctx, key)
		if err != nil {
			return err
		}
		res, err = r.proposeOn(ctx, n, t, shardID, env)
		return err
	})
	if err != nil {
		return nil, err
	}
	if c := res.GetCode(); c != shardv1.Code_CODE_OK && c != shardv1.Code_CODE_QUEUED {
		return res, &resultError{res}
	}
	return res, nil
}

// proposeOn stamps env with the term's clock and proposes it on node n.
func (r *Router) proposeOn(ctx context.Context, n *LocalNode, t leaderTerm, shardID uint64, env *shardv1.Envelope) (*shardv1.Result, error) {
	env.Version = shard.CommandVersion
	env.ShardId = shardID
	env.Generation = r.pmap.Generation
	env.NowUnixNano = t.now()
	cmd, err := shard.EncodeCommand(env)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ProposeTimeout)
	defer cancel()
	start := time.Now()
	out, err := n.Node.NH.SyncPropose(ctx, n.Node.NH.GetNoOPSession(shardID), cmd)
	if err != nil {
		return nil, proposeError(err)
	}
	metrics.proposal.Observe(time.Since(start).Seconds())
	res := &shardv1.Result{}
	if err := proto.Unmarshal(out.Data, res); err != nil {
		return nil, fmt.Errorf("router: shard %d result: %w", shardID, err)
	}
	return res, nil
}

// read runs a linearizable read of key's shard on its leader, stamped
// with the leader's clock.
func (r *Router) read(ctx context.Context, key string, q *shardv1.Query) (*shardv1.QueryResult, error) {
	shardID, err := r.pmap.ShardFor(key)
	if err != nil {
		return nil, err
	}
	return r.readShard(ctx, shardID, q)
}

// readShard runs a linearizable read of a shard on its leader, stamped
// with the leader's clock.
func (r *Router) readShard(ctx context.Context, shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	var out any
	err := r.retryDropped(ctx, func() error {
		n, t, err := r.leader(ctx, shardID)
		if err != nil {
			return err
		}
		q.NowUnixNano = t.now()
		rctx, cancel := context.WithTimeout(ctx, r.cfg.ProposeTimeout)
		defer cancel()
		out, err = n.Node.NH.SyncRead(rctx, shardID, q)
		if err != nil {
			return proposeError(err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out.(*shardv1.QueryResult), nil
}

// shardIDs lists the data shards of the placement map, each once.
func (r *Router) shardIDs() []uint64 {
	var ids []uint64
	for _, rg := range r.pmap.Ranges {
		if !slices.Contains(ids, rg.GetShardId()) {
			ids = append(ids, rg.GetShardId())
		}
	}
	return ids
}

// retryDropped runs f again, for up to LeaderWait, while Dragonboat drops
// its request before proposing it (a shard still starting, a busy node).
func (r *Router) retryDropped(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(r.cfg.LeaderWait)
	for {
		err := f()
		if err != nil && ctx.Err() != nil {
			// The caller's own deadline or cancel decides what it is told.
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		}
		if !errors.Is(err, errDropped) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
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
			if err := r.leaderTick(n, t); err != nil {
				r.cfg.Logger.Warn("leader timer", "node", n.Node.ID(), "shard", t.shardID, "term", t.term, "err", err)
			}
		}
	}
}

// leaderTick confirms a new term with a linearizable read, or, once
// confirmed, proposes one batch each of expirations, timed-out waiters and
// forgotten dedup entries.
func (r *Router) leaderTick(n *LocalNode, t leaderTerm) error {
	if id, term, valid, err := n.Node.NH.GetLeaderID(t.shardID); err != nil || !valid || id != n.Node.ID() || term != t.term {
		n.Leadership.drop(t.shardID, t.term) // stopped, or deposed without an event yet
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ProposeTimeout)
	defer cancel()
	if !t.confirmed {
		if _, err := n.Node.NH.SyncRead(ctx, t.shardID, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}}); err != nil {
			return fmt.Errorf("confirming leadership: %w", err)
		}
		if id, term, valid, err := n.Node.NH.GetLeaderID(t.shardID); err != nil || !valid || id != n.Node.ID() || term != t.term {
			return nil // lost it meanwhile; the listener will catch up
		}
		n.Leadership.confirm(t.shardID, t.term)
		return nil
	}
	scan := &shardv1.ScanQuery{Limit: r.cfg.ScanLimit}
	q, err := r.localRead(n, t.shardID, &shardv1.Query{NowUnixNano: t.now(), Query: &shardv1.Query_Expired{Expired: scan}})
	if err != nil {
		return err
	}
	shardLabel := strconv.FormatUint(t.shardID, 10)
	metrics.activeLocks.WithLabelValues(shardLabel).Set(float64(q.GetMeta().GetHeldLocks()))
	metrics.waiters.WithLabelValues(shardLabel).Set(float64(q.GetMeta().GetQueuedWaiters()))
	if items := q.GetExpire().GetItems(); len(items) > 0 {
		res, err := r.proposeOn(ctx, n, t, t.shardID, &shardv1.Envelope{Command: &shardv1.Envelope_Expire{Expire: q.GetExpire()}})
		if err != nil {
			return fmt.Errorf("expire: %w", err)
		}
		metrics.expirations.Add(float64(res.GetCount()))
	}
	q, err = r.localRead(n, t.shardID, &shardv1.Query{NowUnixNano: t.now(), Query: &shardv1.Query_TimedOut{TimedOut: scan}})
	if err != nil {
		return err
	}
	if d := q.GetDrop(); len(d.GetItems()) > 0 {
		if _, err := r.proposeOn(ctx, n, t, t.shardID, &shardv1.Envelope{Command: &shardv1.Envelope_DropWaiters{DropWaiters: d}}); err != nil {
			return fmt.Errorf("drop waiters: %w", err)
		}
	}
	q, err = r.localRead(n, t.shardID, &shardv1.Query{NowUnixNano: t.now(), Query: &shardv1.Query_Forgettable{Forgettable: scan}})
	if err != nil {
		return err
	}
	if f := q.GetForget(); len(f.GetDedup())+len(f.GetIdleLocks()) > 0 {
		if _, err := r.proposeOn(ctx, n, t, t.shardID, &shardv1.Envelope{Command: &shardv1.Envelope_Forget{Forget: f}}); err != nil {
			return fmt.Errorf("forget: %w", err)
		}
	}
	return nil
}

// localRead reads the local replica without a quorum round; the leader
// timers only use it to find candidates, which apply re-checks.
func (r *Router) localRead(n *LocalNode, shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	out, err := n.Node.NH.StaleRead(shardID, q)
	if err != nil {
		return nil, err
	}
	return out.(*shardv1.QueryResult), nil
}

// leads reports whether node n still leads shardID in term t.
func (r *Router) leads(n *LocalNode, shardID uint64, t leaderTerm) bool {
	cur, ok := n.Leadership.term(shardID)
	return ok && cur.term == t.term
}
