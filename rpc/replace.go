package rpc

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/router"
)

// Replacing a voter of the placement group. The group's replica ids are
// node ids, and Dragonboat never lets a removed replica id back in, so a
// replacement is a node that has never voted in it, added as non-voting,
// caught up, promoted, and only then is the old voter removed: the
// group never has fewer live voters than before, and no step is undone
// (a call that fails part way is called again and goes on from the
// membership it finds).

// JoinPlacement implements NodeService.JoinPlacement.
func (s *NodeServer) JoinPlacement(ctx context.Context, req *connect.Request[placementv1.JoinPlacementRequest]) (*connect.Response[placementv1.JoinPlacementResponse], error) {
	n := s.r.ops.LocalNode(req.Msg.GetNodeId())
	if n == nil || n.Node == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("node_id: node %d is not served here", req.Msg.GetNodeId()))
	}
	if err := router.JoinPlacementLocal(ctx, n); err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, ce
		}
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return connect.NewResponse(&placementv1.JoinPlacementResponse{}), nil
}
