package router

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/placement"
	"github.com/warden-dev/warden/proto/rpctypes"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// forwardedHeader marks a request one node forwarded to another, with
// the number of hops so far. A node that hosts no replica of the shard
// forwards to one that does, which may forward once more to the leader;
// after maxHops a node serves the request itself or answers Unavailable.
const (
	forwardedHeader = "Warden-Forwarded"
	maxHops         = 2
)

// forward sends a client RPC about key to the node that hosts the leader
// of key's shard, when that is another node, and returns its answer with
// ok set; with ok unset the RPC is to be served here. While the other
// node answers Unavailable (its leadership moved, a range is moving), or
// its connection breaks before it answers (it went down), or it misses a
// clock reading with the call in flight (it stopped, or is cut off: its
// kernel may still accept the connection, and nothing else would end the
// wait), it looks again and retries, until the answers have been
// Unavailable for LeaderWait (counted from the first of them, so a wait
// that lasted minutes before its node died is retried too); within that
// run each try, and each look for a leader, ends with it. Retrying is
// safe: every RPC is idempotent under its request id or lease id.
func forward[Req, Resp any](ctx context.Context, r *Router, req *connect.Request[Req], key string,
	call func(*peer) func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) (resp *connect.Response[Resp], ok bool, err error) {
	var asked *remoteLeader // the node asked last
	defer func() {
		var ce *connect.Error
		switch {
		case !ok, asked == nil: // served here, or no node to ask: err is this node's
		case err == nil || errors.As(err, &ce) && connect.IsWireError(ce):
			markForwarded(ctx) // a node served it and recorded it
		case ctx.Err() == nil:
			// No node answered for LeaderWait: recorded here, and the
			// client is told to retry without the transport's details
			// (addresses, another server's text), which the log keeps.
			// The detail names the node asked (when it is known to lead): a
			// client that reaches it directly may get through.
			r.cfg.Logger.Warn("a forwarded call got no answer", "key", key, "addr", asked.node.GetListenAddr(), "err", err)
			err = withDetail(connect.NewError(connect.CodeUnavailable, errors.New("the node that leads the key's shard did not answer; retry with the same ids")), asked.notLeader())
		}
	}()
	hops := hopsOf(req.Header())
	if hops >= maxHops {
		return nil, false, nil
	}
	var failing time.Time // when the run of Unavailable answers began
	for {
		// Within a run of failures, every leader lookup ends with the run.
		tctx, cancel := ctx, context.CancelFunc(func() {})
		if !failing.IsZero() {
			tctx, cancel = context.WithDeadline(ctx, failing.Add(r.failingPatience(key)))
		}
		rl, lerr := r.remoteFor(tctx, key)
		if rl == nil {
			cancel()
			switch {
			case ctx.Err() != nil:
			case failing.IsZero() && errors.Is(lerr, ErrNoLeader):
				// No leader here, and no live node to ask, for LeaderWait:
				// no quorum. Serving here would wait for one again.
				return nil, true, lerr
			case !failing.IsZero() && (errors.Is(lerr, ErrNoLeader) || tctx.Err() != nil):
				return resp, true, err // the same, after the asked node failed
			}
			return nil, false, nil
		}
		fr := connect.NewRequest(req.Msg)
		fr.Header().Set(forwardedHeader, strconv.Itoa(hops+1))
		metrics.forwards.Inc()
		asked = rl
		// The call itself has the caller's deadline: a waiting Acquire
		// on a leader that answers waits as long as it asked to (a node
		// that stops answering is given up by callLive).
		resp, err = callLive(ctx, r, rl.node.GetId(), func(ctx context.Context) (*connect.Response[Resp], error) {
			return call(r.peers.get(rl.node.GetListenAddr()))(ctx, fr)
		})
		cancel()
		if !rpctypes.Retryable(err) && !notAnswered(ctx, err) {
			return resp, true, err
		}
		if failing.IsZero() {
			failing = time.Now()
		} else if time.Since(failing) > r.failingPatience(key) {
			return resp, true, err
		}
		select {
		case <-ctx.Done():
			return nil, true, err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// failingPatience is how long a run of failed forwards of key may last:
// LeaderWait, or three of them while a quorum of the key's shard's
// voters answer their clock readings (the leader died or moved, and the
// others will elect one: a waiting Acquire keeps waiting through it); a
// shard without a live quorum answers unavailable sooner.
func (r *Router) failingPatience(key string) time.Duration {
	m := r.Map()
	rg, err := m.ShardFor(key)
	if err != nil {
		return r.cfg.LeaderWait
	}
	voters := m.Voters(rg.GetShardId())
	live := 0
	for _, v := range voters {
		if r.isLocal(v.GetNodeId()) || r.live(v.GetNodeId()) {
			live++
		}
	}
	if 2*live > len(voters) {
		return 3 * r.cfg.LeaderWait
	}
	return r.cfg.LeaderWait
}

// notAnswered reports whether err, from a forwarded call, is one that no
// Warden node sent (it did not come from the wire) and that the caller's
// own deadline or cancel did not cause: the answer was cut off or was
// not Connect's (an HTTP 400 of something else that now listens on the
// node's address, a proxy in between, a reply past the size limit). The
// call's outcome is unknown, as after a broken connection; a retry with
// the same ids settles it, so forward retries it and, when no node
// answers, tells the client Unavailable rather than pass a code the
// client would take as the node's word.
func notAnswered(ctx context.Context, err error) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && !connect.IsWireError(ce) && ctx.Err() == nil &&
		ce.Code() != connect.CodeCanceled && ce.Code() != connect.CodeDeadlineExceeded
}

// remoteFor returns where key's shard is led from when that is another
// node, or nil when it is here or unknown (serving here gives the error),
// with the leader lookup's error.
func (r *Router) remoteFor(ctx context.Context, key string) (*remoteLeader, error) {
	rg, err := r.Map().ShardFor(key)
	if err != nil {
		return nil, err
	}
	_, _, err = r.leader(ctx, rg.GetShardId())
	var rl *remoteLeader
	if errors.As(err, &rl) {
		return rl, nil
	}
	return nil, err
}

// errPeerDown is the cause of a forwarded call's cancellation when its
// node missed a clock reading with the call in flight (callLive).
var errPeerDown = errors.New("the node stopped answering its clock readings")

// peerDownPoll is how often callLive looks at a peer's last clock reading.
const peerDownPoll = 100 * time.Millisecond

// callLive runs f, a call to node id through r, and cancels it, with an
// Unavailable error, once id is found unresponsive: it failed
// peerDownAfter clock readings in a row (one every ClockInterval, each
// bounded by it) with the call in flight, or before it began. A SIGSTOPped node's kernel still accepts the
// connection and the request, so without this a call to it waited for
// the caller's deadline (issue 41).
func callLive[Resp any](ctx context.Context, r *Router, id uint64, f func(context.Context) (*connect.Response[Resp], error)) (*connect.Response[Resp], error) {
	down := func() error {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("node %d: %w", id, errPeerDown))
	}
	if r.unresponsive(id) {
		return nil, down()
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		tick := time.NewTicker(peerDownPoll)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if r.unresponsive(id) {
					cancel(errPeerDown)
					return
				}
			}
		}
	}()
	resp, err := f(ctx)
	if err != nil && errors.Is(context.Cause(ctx), errPeerDown) {
		return nil, down()
	}
	return resp, err
}

// proposeShard proposes env on shardID's leader, which must be local.
// The caller sets env's generation.
func (r *Router) proposeShard(ctx context.Context, shardID uint64, env *shardv1.Envelope) (*shardv1.Result, error) {
	var res *shardv1.Result
	err := r.retryDropped(ctx, func() error {
		n, t, err := r.leader(ctx, shardID)
		if err != nil {
			return err
		}
		res, err = r.proposeOn(ctx, n, t, shardID, env)
		return err
	})
	return res, err
}

// shardClient is the placement.ShardClient of a Router: local leaders
// first, else the node that hosts the leader, over NodeService.
type shardClient struct{ r *Router }

func (c shardClient) Propose(ctx context.Context, shardID uint64, env *shardv1.Envelope) (*shardv1.Result, error) {
	res, err := c.r.proposeShard(ctx, shardID, env)
	var rl *remoteLeader
	if !errors.As(err, &rl) {
		return res, err
	}
	req := connect.NewRequest(&placementv1.ProposeRequest{ShardId: shardID, Envelope: env})
	req.Header().Set(forwardedHeader, "1")
	out, err := c.r.peers.get(rl.node.GetListenAddr()).node.Propose(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("shard %d via node %d: %w", shardID, rl.node.GetId(), err)
	}
	return out.Msg.GetResult(), nil
}

func (c shardClient) Read(ctx context.Context, shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	out, err := c.r.readShard(ctx, shardID, q)
	var rl *remoteLeader
	if !errors.As(err, &rl) {
		return out, err
	}
	req := connect.NewRequest(&placementv1.ReadRequest{ShardId: shardID, Query: q})
	req.Header().Set(forwardedHeader, "1")
	resp, err := c.r.peers.get(rl.node.GetListenAddr()).node.Read(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("shard %d via node %d: %w", shardID, rl.node.GetId(), err)
	}
	return resp.Msg.GetResult(), nil
}

// Shards returns a client of every data shard's leader, wherever it runs.
func (r *Router) Shards() placement.ShardClient { return shardClient{r} }

// remoteMeta is the placement.MetaClient of a node that hosts no replica
// of the placement group: it asks the nodes it knows (seeds, then the
// map's) over NodeService.
type remoteMeta struct {
	peers *Peers
	seeds []string
	known func() []string
}

// Placement returns the placement client that asks the nodes at seeds
// and then, if known is set, at the addresses it lists (the map's), over
// NodeService: the placement.MetaClient of a node that hosts no replica
// of the placement group.
func (p *Peers) Placement(seeds []string, known func() []string) placement.MetaClient {
	return remoteMeta{peers: p, seeds: seeds, known: known}
}

func (m remoteMeta) addrs() []string {
	out := append([]string(nil), m.seeds...)
	if m.known != nil {
		out = append(out, m.known()...)
	}
	return out
}

func (m remoteMeta) Propose(ctx context.Context, cmd *placementv1.Command) (*placementv1.Result, error) {
	var errs []error
	for _, a := range m.addrs() {
		resp, err := m.peers.get(a).node.ProposeMeta(ctx, connect.NewRequest(&placementv1.ProposeMetaRequest{Command: cmd}))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if res := resp.Msg.GetResult(); res.GetError() != "" {
			return res, &placement.RefusedError{Reason: res.GetError()}
		}
		return resp.Msg.GetResult(), nil
	}
	return nil, fmt.Errorf("placement: no node answered: %w", errors.Join(errs...))
}

func (m remoteMeta) Read(ctx context.Context) (*placementv1.State, error) {
	var errs []error
	for _, a := range m.addrs() {
		resp, err := m.peers.get(a).node.ReadMeta(ctx, connect.NewRequest(&placementv1.ReadMetaRequest{}))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return resp.Msg.GetState(), nil
	}
	return nil, fmt.Errorf("placement: no node answered: %w", errors.Join(errs...))
}
