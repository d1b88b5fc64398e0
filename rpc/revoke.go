package rpc

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/shard"
)

// RevokeLease implements AdminService.RevokeLease: once every replica of
// the resource's shard applies envelope version 9, the node that leads
// the shard proposes a RevokeCmd.
func (s *AdminServer) RevokeLease(ctx context.Context, req *connect.Request[wardenv1.RevokeLeaseRequest]) (*connect.Response[wardenv1.RevokeLeaseResponse], error) {
	m := req.Msg
	if err := validateResource(m.GetResource()); err != nil {
		return nil, err
	}
	if m.GetFencingToken() == 0 {
		return nil, &shard.FieldError{Field: "fencing_token", Reason: "is required (the token Describe shows)"}
	}
	// Checked before forwarding: the leader may be the older binary,
	// which does not know the call.
	rg, err := s.r.Map().ShardFor(m.GetResource())
	if err != nil {
		return nil, err
	}
	if !s.r.Applies(rg.GetShardId(), shard.VersionRevoke) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("a replica of shard %d runs a binary older than RevokeLease (envelope version %d): finish the rolling upgrade first", rg.GetShardId(), shard.VersionRevoke))
	}
	if resp, ok, err := forward(ctx, s.r, req, m.GetResource(), func(p *peer) func(context.Context, *connect.Request[wardenv1.RevokeLeaseRequest]) (*connect.Response[wardenv1.RevokeLeaseResponse], error) {
		return p.Admin.RevokeLease
	}); ok {
		return resp, err
	}
	res, err := s.r.Propose(ctx, m.GetResource(), &shardv1.Envelope{Command: &shardv1.Envelope_Revoke{Revoke: &shardv1.RevokeCmd{Resource: m.GetResource(), FencingToken: m.GetFencingToken()}}})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&wardenv1.RevokeLeaseResponse{Revoked: res.GetReleased()}), nil
}
