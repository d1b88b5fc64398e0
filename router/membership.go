package router

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"connectrpc.com/connect"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// Membership implements placement.ShardClient: through the shard's
// leader, on this node or another (Dragonboat accepts one membership
// change at a time, from a voting replica).
func (c shardClient) Membership(ctx context.Context, req *placementv1.MembershipRequest) (*placementv1.MembershipResponse, error) {
	return c.r.Membership(ctx, 0, req)
}

// Membership changes the shard's membership on its leader's node, having
// been forwarded hops times.
func (r *Router) Membership(ctx context.Context, hops int, m *placementv1.MembershipRequest) (*placementv1.MembershipResponse, error) {
	n, _, err := r.leader(ctx, m.GetShardId())
	if err == nil {
		ctx, cancel := context.WithTimeout(ctx, membershipTimeout)
		defer cancel()
		return n.Raft.ChangeMembership(ctx, m)
	}
	var rl *RemoteLeader
	if !errors.As(err, &rl) || hops >= MaxHops {
		return nil, err
	}
	req := connect.NewRequest(m)
	req.Header().Set(ForwardedHeader, strconv.Itoa(hops+1))
	resp, err := r.peers.Get(rl.Node.GetListenAddr()).Node.Membership(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("shard %d membership via node %d: %w", m.GetShardId(), rl.Node.GetId(), err)
	}
	return resp.Msg, nil
}

// AppliedIndex implements placement.ShardClient.
func (c shardClient) AppliedIndex(ctx context.Context, shardID, nodeID uint64) (uint64, error) {
	if c.r.IsLocal(nodeID) {
		return c.r.AppliedIndexLocal(shardID, nodeID)
	}
	node := c.r.Map().Node(nodeID)
	if node == nil {
		return 0, fmt.Errorf("node %d is not in the map", nodeID)
	}
	resp, err := c.r.peers.Get(node.GetListenAddr()).Node.AppliedIndex(ctx, ForwardedReq(&placementv1.AppliedIndexRequest{ShardId: shardID}))
	if err != nil {
		return 0, err
	}
	return resp.Msg.GetIndex(), nil
}

// AppliedIndexLocal reads how far local node nodeID's replica of shardID
// has applied (0 for any node when nodeID is 0: the first local replica).
func (r *Router) AppliedIndexLocal(shardID, nodeID uint64) (uint64, error) {
	for i := range r.nodes {
		n := &r.nodes[i]
		if nodeID != 0 && n.ID != nodeID {
			continue
		}
		out, err := n.Raft.StaleRead(shardID, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}})
		if err != nil {
			if nodeID == 0 {
				continue
			}
			return 0, err
		}
		return out.GetAppliedIndex(), nil
	}
	return 0, fmt.Errorf("no local replica of shard %d", shardID)
}

// membershipTimeout bounds one membership change (Dragonboat needs a
// deadline; the caller's, if shorter, wins).
const membershipTimeout = 10 * time.Second
