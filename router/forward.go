package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/placement"
	"github.com/warden-dev/warden/proto/rpctypes"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// FailingPatience is how long a run of failed forwards of key may last:
// LeaderWait, or three of them while a quorum of the key's shard's
// voters answer their clock readings (the leader died or moved, and the
// others will elect one: a waiting Acquire keeps waiting through it); a
// shard without a live quorum answers unavailable sooner.
func (r *Router) FailingPatience(key string) time.Duration {
	m := r.Map()
	rg, err := m.ShardFor(key)
	if err != nil {
		return r.cfg.LeaderWait
	}
	voters := m.Voters(rg.GetShardId())
	live := 0
	for _, v := range voters {
		if r.IsLocal(v.GetNodeId()) || r.Live(v.GetNodeId()) {
			live++
		}
	}
	if 2*live > len(voters) {
		return 3 * r.cfg.LeaderWait
	}
	return r.cfg.LeaderWait
}

// ProposeShard proposes env on shardID's leader, which must be local.
// The caller sets env's generation.
func (r *Router) ProposeShard(ctx context.Context, shardID uint64, env *shardv1.Envelope) (*shardv1.Result, error) {
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
	res, err := c.r.ProposeShard(ctx, shardID, env)
	var rl *RemoteLeader
	if !errors.As(err, &rl) {
		return res, err
	}
	req := connect.NewRequest(&placementv1.ProposeRequest{ShardId: shardID, Envelope: env})
	req.Header().Set(ForwardedHeader, "1")
	out, err := c.r.peers.Get(rl.Node.GetListenAddr()).Node.Propose(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("shard %d via node %d: %w", shardID, rl.Node.GetId(), err)
	}
	return out.Msg.GetResult(), nil
}

func (c shardClient) Read(ctx context.Context, shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	out, err := c.r.ReadShard(ctx, shardID, q)
	var rl *RemoteLeader
	if !errors.As(err, &rl) {
		return out, err
	}
	req := connect.NewRequest(&placementv1.ReadRequest{ShardId: shardID, Query: q})
	req.Header().Set(ForwardedHeader, "1")
	resp, err := c.r.peers.Get(rl.Node.GetListenAddr()).Node.Read(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("shard %d via node %d: %w", shardID, rl.Node.GetId(), err)
	}
	return resp.Msg.GetResult(), nil
}

// Shards returns a client of every data shard's leader, wherever it runs.
func (r *Router) Shards() placement.ShardClient { return shardClient{r} }

// Forward makes a call about key, through call, to the node that hosts
// the leader of key's shard, when that is another node, and returns the
// call's error with ok set, and the node asked last; with ok unset the
// call is to be served here (a local node leads, no node is there to
// ask, or hops, the times the call was forwarded already, reached
// MaxHops). While the other node answers Unavailable (its leadership
// moved, a range is moving), or its connection breaks before it answers
// (it went down), or it misses its clock readings with the call in
// flight (it stopped, or is cut off: its kernel may still accept the
// connection, and nothing else would end the wait), it looks again and
// retries, until the answers have been Unavailable for the failing
// patience (counted from the first of them, so a wait that lasted
// minutes before its node died is retried too); within that run each
// try, and each look for a leader, ends with it. Retrying is safe: every
// RPC is idempotent under its request id or lease id.
func (r *Router) Forward(ctx context.Context, key string, hops int, call func(ctx context.Context, node *placementv1.Node) error) (asked *RemoteLeader, ok bool, err error) {
	if hops >= MaxHops {
		return nil, false, nil
	}
	var failing time.Time // when the run of Unavailable answers began
	for {
		// Within a run of failures, every leader lookup ends with the run.
		tctx, cancel := ctx, context.CancelFunc(func() {})
		if !failing.IsZero() {
			tctx, cancel = context.WithDeadline(ctx, failing.Add(r.FailingPatience(key)))
		}
		rl, lerr := r.RemoteFor(tctx, key)
		// Read before cancel: cancel sets tctx's error too, and a look
		// that found the leader here must not read as a run of failures
		// that ran out.
		runOver := tctx.Err() != nil
		if rl == nil {
			cancel()
			switch {
			case ctx.Err() != nil:
			case failing.IsZero() && errors.Is(lerr, ErrNoLeader):
				// No leader here, and no live node to ask, for LeaderWait:
				// no quorum. Serving here would wait for one again.
				return asked, true, lerr
			case !failing.IsZero() && (errors.Is(lerr, ErrNoLeader) || runOver):
				return asked, true, err // the same, after the asked node failed
			}
			return asked, false, nil
		}
		asked = rl
		// The call itself has the caller's deadline: a waiting Acquire
		// on a leader that answers waits as long as it asked to (a node
		// that stops answering is given up by callLive).
		err = r.callLive(ctx, rl.Node.GetId(), func(ctx context.Context) error { return call(ctx, rl.Node) })
		cancel()
		if !rpctypes.Retryable(err) && !notAnswered(ctx, err) {
			return asked, true, err
		}
		if failing.IsZero() {
			failing = time.Now()
		} else if time.Since(failing) > r.FailingPatience(key) {
			return asked, true, err
		}
		select {
		case <-ctx.Done():
			return asked, true, err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// notAnswered reports whether err, from a forwarded call, is one that no
// Warden node sent (it did not come from the wire) and that the caller's
// own deadline or cancel did not cause: the answer was cut off or was
// not Connect's (an HTTP 400 of something else that now listens on the
// node's address, a proxy in between, a reply past the size limit). The
// call's outcome is unknown, as after a broken connection; a retry with
// the same ids settles it, so Forward retries it and, when no node
// answers, the API layer tells the client Unavailable rather than pass a
// code the client would take as the node's word.
func notAnswered(ctx context.Context, err error) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && !connect.IsWireError(ce) && ctx.Err() == nil &&
		ce.Code() != connect.CodeCanceled && ce.Code() != connect.CodeDeadlineExceeded
}

// errPeerDown is the cause of a forwarded call's cancellation when its
// node missed its clock readings with the call in flight (callLive).
var errPeerDown = errors.New("the node stopped answering its clock readings")

// peerDownPoll is how often callLive looks at a peer's last clock reading.
const peerDownPoll = 100 * time.Millisecond

// callLive runs f, a call to node id, and cancels it, with an Unavailable
// error, once id is found unresponsive: it failed peerDownAfter clock
// readings in a row (one every ClockInterval, each bounded by it) with
// the call in flight, or before it began. A SIGSTOPped node's kernel
// still accepts the connection and the request, so without this a call
// to it waited for the caller's deadline (issue 41).
func (r *Router) callLive(ctx context.Context, id uint64, f func(context.Context) error) error {
	down := func() error {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("node %d: %w", id, errPeerDown))
	}
	if r.Unresponsive(id) {
		return down()
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
				if r.Unresponsive(id) {
					cancel(errPeerDown)
					return
				}
			}
		}
	}()
	err := f(ctx)
	if err != nil && errors.Is(context.Cause(ctx), errPeerDown) {
		return down()
	}
	return err
}
