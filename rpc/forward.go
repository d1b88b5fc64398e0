package rpc

import (
	"context"
	"errors"
	"strconv"

	"connectrpc.com/connect"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/router"
)

// forward sends a client RPC about key to the node that hosts the leader
// of key's shard, when that is another node (router.Router.Forward:
// retried while that node answers Unavailable, breaks the connection or
// stops answering its clock readings), and returns its answer with ok
// set; with ok unset the RPC is to be served here. A call another node
// answered is marked forwarded (recorded there); one that no node
// answered is recorded here, and the client is told to retry without the
// transport's details (addresses, another server's text), which the log
// keeps, with the node asked named when it is known to lead: a client
// that reaches it directly may get through.
func forward[Req, Resp any](ctx context.Context, r *node, req *connect.Request[Req], key string,
	call func(*peer) func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) (resp *connect.Response[Resp], ok bool, err error) {
	hops := hopsOf(req.Header())
	asked, ok, err := r.Forward(ctx, key, hops, func(ctx context.Context, node *placementv1.Node) error {
		fr := connect.NewRequest(req.Msg)
		fr.Header().Set(router.ForwardedHeader, strconv.Itoa(hops+1))
		metrics.forwards.Inc()
		var cerr error
		resp, cerr = call(r.peer(node.GetListenAddr()))(ctx, fr)
		return cerr
	})
	var ce *connect.Error
	switch {
	case !ok, asked == nil: // served here, or no node to ask: err is this node's
		return nil, ok, err
	case err == nil || errors.As(err, &ce) && connect.IsWireError(ce):
		markForwarded(ctx) // a node served it and recorded it
	case ctx.Err() == nil:
		r.Config().Logger.Warn("a forwarded call got no answer", "key", key, "addr", asked.Node.GetListenAddr(), "err", err)
		err = withDetail(connect.NewError(connect.CodeUnavailable, errors.New("the node that leads the key's shard did not answer; retry with the same ids")), notLeader(asked))
	}
	if err != nil {
		return nil, true, err
	}
	return resp, true, nil
}
