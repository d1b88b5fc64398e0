package rpc

import (
	"context"

	"connectrpc.com/connect"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// Membership implements NodeService.Membership.
func (s *NodeServer) Membership(ctx context.Context, req *connect.Request[placementv1.MembershipRequest]) (*connect.Response[placementv1.MembershipResponse], error) {
	out, err := s.r.ops.Membership(ctx, hopsOf(req.Header()), req.Msg)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(out), nil
}

// AppliedIndex implements NodeService.AppliedIndex.
func (s *NodeServer) AppliedIndex(_ context.Context, req *connect.Request[placementv1.AppliedIndexRequest]) (*connect.Response[placementv1.AppliedIndexResponse], error) {
	idx, err := s.r.ops.AppliedIndexLocal(req.Msg.GetShardId(), 0)
	if err != nil {
		return nil, connect.NewError(connect.CodeNotFound, err)
	}
	return connect.NewResponse(&placementv1.AppliedIndexResponse{Index: idx}), nil
}
