package router

import (
	"context"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// jobCluster is the router as the placement jobs reach it
// (placement.Cluster).
type jobCluster struct{ r *Router }

var _ placement.Cluster = jobCluster{}

func (c jobCluster) PlacementMembership(ctx context.Context) (*placementv1.MembershipResponse, error) {
	return c.r.PlacementMembership(ctx)
}

func (c jobCluster) ReplacePlacementVoter(ctx context.Context, old, to uint64) error {
	return c.r.ReplacePlacementVoter(ctx, old, to)
}

func (c jobCluster) RemovePlacementMember(ctx context.Context, id uint64) error {
	m, err := c.r.PlacementMembership(ctx)
	if err != nil {
		return err
	}
	if _, member := placement.IsMember(m, id); !member {
		return nil
	}
	_, err = c.r.ChangePlacement(ctx, m, placementv1.MembershipChange_MEMBERSHIP_CHANGE_REMOVE, id)
	return err
}

func (c jobCluster) HandOffPlacement(ctx context.Context, id uint64) (bool, error) {
	return c.r.HandOffPlacement(ctx, id)
}

func (c jobCluster) Leaders(ctx context.Context) map[uint64]uint64 { return c.r.Leaders(ctx) }

func (c jobCluster) TransferLeader(ctx context.Context, shard, node uint64) error {
	_, err := c.r.TransferLeader(ctx, shard, node, false)
	return err
}
