package rpc

import (
	"context"
	"errors"
	"strconv"

	"connectrpc.com/connect"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/router"
)

// served says where forward left a call.
type served int

const (
	// servedHere: not sent anywhere; the call is to be served here.
	servedHere served = iota
	// servedThere: another node answered the call, and recorded it.
	servedThere
	// servedNowhere: no node answered (or there was none to ask); the
	// call's answer is this node's, and it is recorded here.
	servedNowhere
)

// peerCall is one procedure on another node's client API.
type peerCall[Req, Resp any] = func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)

// forward sends a client RPC about key to the node that hosts the leader
// of key's shard, when that is another node (router.Router.Forward:
// retried while that node answers Unavailable, breaks the connection or
// stops answering its clock readings), and returns its answer and where
// it was served: servedHere when the RPC is to be served here. A call
// another node answered is servedThere (recorded there); one that no
// node answered is servedNowhere (recorded here), and the client is told
// to retry without the transport's details (addresses, another server's
// text), which the log keeps, with the node asked named when it is known
// to lead: a client that reaches it directly may get through. It is the
// one forwarding function: the routing interceptor (route.go) calls it
// for a call about one key, Batch and RenewBatch for each shard's part.
func forward[Req, Resp any](ctx context.Context, r *node, req *connect.Request[Req], key string,
	call func(*peer) peerCall[Req, Resp]) (resp *connect.Response[Resp], where served, err error) {
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
	case !ok:
		return nil, servedHere, nil
	case asked == nil: // no node to ask: err is this node's
		return nil, servedNowhere, err
	case err == nil || errors.As(err, &ce) && connect.IsWireError(ce):
		where = servedThere // a node served it and recorded it
	case ctx.Err() == nil:
		where = servedNowhere
		r.Config().Logger.Warn("a forwarded call got no answer", "key", key, "addr", asked.Node.GetListenAddr(), "err", err)
		err = withDetail(connect.NewError(connect.CodeUnavailable, errors.New("the node that leads the key's shard did not answer; retry with the same ids")), notLeader(asked))
	default:
		where = servedNowhere
	}
	if err != nil {
		return nil, where, err
	}
	return resp, where, nil
}
