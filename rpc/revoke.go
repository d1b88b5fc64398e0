package rpc

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/shard"
)

// RevokeLease implements AdminService.RevokeLease here: once every
// replica of the resource's shard applies envelope version 9 (checkRevoke,
// which the routing interceptor runs first), the node that leads the
// shard proposes a RevokeCmd.
func (s *AdminServer) RevokeLease(ctx context.Context, req *connect.Request[wardenv1.RevokeLeaseRequest]) (*connect.Response[wardenv1.RevokeLeaseResponse], error) {
	m := req.Msg
	res, err := s.r.Propose(ctx, m.GetResource(), &shardv1.Envelope{Command: &shardv1.Envelope_Revoke{Revoke: &shardv1.RevokeCmd{Resource: m.GetResource(), FencingToken: m.GetFencingToken()}}})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&wardenv1.RevokeLeaseResponse{Revoked: res.GetReleased()}), nil
}

// checkRevoke refuses RevokeLease m before it is routed: checked before
// forwarding, as the leader may be the older binary, which does not know
// the call.
func checkRevoke(n *node, m *wardenv1.RevokeLeaseRequest) error {
	if err := validateResource(m.GetResource()); err != nil {
		return err
	}
	if m.GetFencingToken() == 0 {
		return &shard.FieldError{Field: "fencing_token", Reason: "is required (the token Describe shows)"}
	}
	rg, err := n.Map().ShardFor(m.GetResource())
	if err != nil {
		return err
	}
	if !n.Applies(rg.GetShardId(), shard.VersionRevoke) {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("a replica of shard %d runs a binary older than RevokeLease (envelope version %d): finish the rolling upgrade first", rg.GetShardId(), shard.VersionRevoke))
	}
	return nil
}
