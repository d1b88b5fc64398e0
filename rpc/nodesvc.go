package rpc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/shard"
)

// NodeServer implements placementv1connect.NodeServiceHandler, the
// node-to-node API: it only ever serves from this node's own replicas.
type NodeServer struct {
	r *node
}

var _ placementv1connect.NodeServiceHandler = (*NodeServer)(nil)

// Propose implements NodeService.Propose.
func (s *NodeServer) Propose(ctx context.Context, req *connect.Request[placementv1.ProposeRequest]) (*connect.Response[placementv1.ProposeResponse], error) {
	if req.Msg.GetEnvelope() == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("envelope: is required"))
	}
	res, err := s.r.ops.ProposeShard(ctx, req.Msg.GetShardId(), req.Msg.GetEnvelope())
	if p := nextHop(req.Header(), err); p != nil {
		fr := connect.NewRequest(req.Msg)
		fr.Header().Set(router.ForwardedHeader, strconv.Itoa(hopsOf(req.Header())+1))
		return s.r.ops.Peers().Get(p.Node.GetListenAddr()).Node.Propose(ctx, fr)
	}
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&placementv1.ProposeResponse{Result: res}), nil
}

// Read implements NodeService.Read.
func (s *NodeServer) Read(ctx context.Context, req *connect.Request[placementv1.ReadRequest]) (*connect.Response[placementv1.ReadResponse], error) {
	if req.Msg.GetQuery() == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("query: is required"))
	}
	out, err := s.r.ops.ReadShard(ctx, req.Msg.GetShardId(), req.Msg.GetQuery())
	if p := nextHop(req.Header(), err); p != nil {
		fr := connect.NewRequest(req.Msg)
		fr.Header().Set(router.ForwardedHeader, strconv.Itoa(hopsOf(req.Header())+1))
		return s.r.ops.Peers().Get(p.Node.GetListenAddr()).Node.Read(ctx, fr)
	}
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&placementv1.ReadResponse{Result: out}), nil
}

// ProposeMeta implements NodeService.ProposeMeta; a refused command is a
// Result with Error set, not an RPC error.
func (s *NodeServer) ProposeMeta(ctx context.Context, req *connect.Request[placementv1.ProposeMetaRequest]) (*connect.Response[placementv1.ProposeMetaResponse], error) {
	if id, joining := ctx.Value(joiningKey{}).(uint64); joining && req.Msg.GetCommand().GetRegisterNode().GetNode().GetId() != id {
		return nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("node %d is not in the cluster's map: it may only register itself", id))
	}
	res, err := s.r.ops.Meta().Propose(ctx, req.Msg.GetCommand())
	var refused *placement.RefusedError
	if err != nil && !errors.As(err, &refused) {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return connect.NewResponse(&placementv1.ProposeMetaResponse{Result: res}), nil
}

// ReadMeta implements NodeService.ReadMeta.
func (s *NodeServer) ReadMeta(ctx context.Context, _ *connect.Request[placementv1.ReadMetaRequest]) (*connect.Response[placementv1.ReadMetaResponse], error) {
	st, err := s.r.ops.Meta().Read(ctx)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return connect.NewResponse(&placementv1.ReadMetaResponse{State: st}), nil
}

// hopsOf returns how many times a request was forwarded. A value that
// is not a count (negative, not a number) counts as maxHops: the request
// is served where it is, never sent on. (The guard strips the header
// from every caller that is not a node.)
func hopsOf(h http.Header) int {
	v := h.Get(router.ForwardedHeader)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return router.MaxHops
	}
	return n
}

// nextHop returns where to forward a request that failed here because the
// shard is led from another node, if it may be forwarded again.
func nextHop(h http.Header, err error) *router.RemoteLeader {
	var rl *router.RemoteLeader
	if errors.As(err, &rl) && hopsOf(h) < router.MaxHops {
		return rl
	}
	return nil
}

// Clock implements NodeService.Clock: the clock, the command version,
// and whether a local node's disk is below its reserve.
func (s *NodeServer) Clock(context.Context, *connect.Request[placementv1.ClockRequest]) (*connect.Response[placementv1.ClockResponse], error) {
	resp := &placementv1.ClockResponse{UnixNano: s.r.Now().UnixNano(), CommandVersion: shard.CommandVersion}
	for i := range s.r.ops.Nodes() {
		resp.DiskLow = resp.DiskLow || s.r.ops.DiskLow(s.r.ops.Nodes()[i].ID)
	}
	return connect.NewResponse(resp), nil
}
