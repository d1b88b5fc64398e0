package router

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// JobsProposable is nil when every node applies placement command
// version 7 (jobs), else why not.
func (r *Router) JobsProposable() error {
	begin := &placementv1.Command{Command: &placementv1.Command_BeginJob{BeginJob: &placementv1.BeginJobCmd{}}}
	return placement.Proposable(r.Map().State(), begin)
}

// MovedReplica returns the replica id that move operator id added, from
// the operators the map keeps (0 when it is no longer kept).
func (r *Router) MovedReplica(id uint64) uint64 {
	op, _ := placement.FindOperator(r.Map().State(), id, "")
	return op.GetMove().GetToReplica()
}

// PlacementSuccessor returns the node to take node id's vote in the
// placement group: 0 when it has none; a live node of its zone that is
// not a voter (placementReplacement); FAILED_PRECONDITION when there is
// none, unless force (then 0: the vote is removed).
func (r *Router) PlacementSuccessor(ctx context.Context, id uint64, force bool) (uint64, error) {
	membership, err := r.PlacementMembership(ctx)
	if err != nil {
		return 0, err
	}
	if voting, _ := placement.IsMember(membership, id); !voting {
		return 0, nil
	}
	zone := r.Map().Node(id).GetZone()
	to := r.placementReplacement(membership, id, zone, placement.ReplicaLoad(r.Map().State()))
	if to == 0 && !force {
		return 0, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"node %d votes in the placement group: no other live node in zone %q outside it to take its place; add one first, or force the removal", id, zone))
	}
	return to, nil
}

// PlacementMembership reads the placement group's Raft membership through
// this node's replica of it (ErrNoLeader when it hosts none).
func (r *Router) PlacementMembership(ctx context.Context) (*placementv1.MembershipResponse, error) {
	n := r.HostOf(placement.MetaShardID)
	if n == nil {
		return nil, fmt.Errorf("%w: this node hosts no replica of the placement group", ErrNoLeader)
	}
	ctx, cancel := context.WithTimeout(ctx, membershipTimeout)
	defer cancel()
	m, err := n.Raft.ChangeMembership(ctx, &placementv1.MembershipRequest{ShardId: placement.MetaShardID, Change: placementv1.MembershipChange_MEMBERSHIP_CHANGE_NONE})
	if err != nil {
		return nil, fmt.Errorf("%w: the placement group's membership: %v", ErrNoLeader, err)
	}
	return m, nil
}

// placementReplacement picks the node to take voter id's place in the
// placement group: a live node of zone that is in the map and not a
// voter, preferring one a call that stopped part way already added as
// non-voting, then the one hosting the fewest replicas (load). It
// returns 0 when there is none.
func (r *Router) placementReplacement(m *placementv1.MembershipResponse, id uint64, zone string, load map[uint64]int) uint64 {
	var to uint64
	for _, n := range r.Map().State().GetNodes() {
		voting, member := placement.IsMember(m, n.GetId())
		if n.GetId() == id || voting || n.GetZone() != zone || !r.Live(n.GetId()) {
			continue
		}
		if member {
			return n.GetId()
		}
		if to == 0 || load[n.GetId()] < load[to] {
			to = n.GetId()
		}
	}
	return to
}

// ReplacePlacementVoter makes node to a voter of the placement group in
// place of node old, on the placement leader's node: add to as
// non-voting (unless it is one), start its replica there and wait until
// it has caught up, promote it, remove old. Each step is skipped when
// the membership shows it done.
func (r *Router) ReplacePlacementVoter(ctx context.Context, old, to uint64) error {
	m, err := r.PlacementMembership(ctx)
	if err != nil {
		return err
	}
	change := func(c placementv1.MembershipChange, replica uint64) error {
		m, err = r.ChangePlacement(ctx, m, c, replica)
		return err
	}
	voting, member := placement.IsMember(m, to)
	if !member {
		if err := change(placementv1.MembershipChange_MEMBERSHIP_CHANGE_ADD_NON_VOTING, to); err != nil {
			return err
		}
	}
	if !voting {
		if err := r.joinPlacement(ctx, to); err != nil {
			return err
		}
		if err := change(placementv1.MembershipChange_MEMBERSHIP_CHANGE_ADD_VOTING, to); err != nil {
			return err
		}
	}
	if _, member := placement.IsMember(m, old); member {
		return change(placementv1.MembershipChange_MEMBERSHIP_CHANGE_REMOVE, old)
	}
	return nil
}

// ChangePlacement makes change c of node replica's membership in the
// placement group, decided against membership m, and returns the new
// membership.
func (r *Router) ChangePlacement(ctx context.Context, m *placementv1.MembershipResponse, c placementv1.MembershipChange, replica uint64) (*placementv1.MembershipResponse, error) {
	host := r.HostOf(placement.MetaShardID)
	if host == nil {
		return nil, fmt.Errorf("%w: this node hosts no replica of the placement group", ErrNoLeader)
	}
	ctx, cancel := context.WithTimeout(ctx, membershipTimeout)
	defer cancel()
	m, err := host.Raft.ChangeMembership(ctx, &placementv1.MembershipRequest{
		ShardId: placement.MetaShardID, Change: c, ReplicaId: replica, Address: r.Map().Node(replica).GetRaftAddr(), ConfigChangeId: m.GetConfigChangeId()})
	if err != nil {
		return nil, fmt.Errorf("%w: the placement group: %v", ErrNoLeader, err)
	}
	r.cfg.Logger.Info("placement group membership changed", "change", c, "node", replica)
	return m, nil
}

// joinPlacement has node id start its replica of the placement group
// and waits until it has caught up, through NodeService.JoinPlacement
// unless the node is local.
func (r *Router) joinPlacement(ctx context.Context, id uint64) error {
	ctx, cancel := context.WithTimeout(ctx, joinPlacementWait)
	defer cancel()
	if n := r.LocalNode(id); n != nil {
		return JoinPlacementLocal(ctx, n)
	}
	_, err := r.peers.Get(r.Map().Node(id).GetListenAddr()).Node.JoinPlacement(ctx, ForwardedReq(&placementv1.JoinPlacementRequest{NodeId: id}))
	if connect.CodeOf(err) == connect.CodeUnimplemented {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"node %d runs a binary without NodeService.JoinPlacement: upgrade it and call again (the moves made are not repeated; it stays a non-voting member of the placement group until then)", id))
	}
	if err != nil {
		return fmt.Errorf("%w: node %d joining the placement group: %v", ErrNoLeader, id, err)
	}
	return nil
}

// HandOffPlacement moves the placement group's leadership off local node
// id, which is to be removed, to another live voter, and waits until a
// local replica sees the new leader: the removal then runs there (it
// ends by removing node id from the group, which its own leader cannot
// go on from). Nothing is done unless id is local and leads; it reports
// whether the leadership moved.
func (r *Router) HandOffPlacement(ctx context.Context, id uint64) (bool, error) {
	if l := r.MetaLeader(); l == nil || l.GetId() != id || !r.IsLocal(id) {
		return false, nil
	}
	m, err := r.PlacementMembership(ctx)
	if err != nil {
		return false, err
	}
	var to uint64
	for v := range m.GetVoting() {
		if v != id && r.Live(v) && (to == 0 || v < to) {
			to = v
		}
	}
	if to == 0 {
		return false, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("node %d leads the placement group and no other voter of it is live to take over", id))
	}
	if err := r.LocalNode(id).Raft.TransferLeader(placement.MetaShardID, to); err != nil {
		return false, fmt.Errorf("%w: handing the placement leadership to node %d: %v", ErrNoLeader, to, err)
	}
	for deadline := time.Now().Add(membershipTimeout); ; {
		if l := r.MetaLeader(); l != nil && l.GetId() != id {
			r.cfg.Logger.Info("placement leadership handed off before removal", "from", id, "to", l.GetId())
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("%w: the placement leadership did not move from node %d to node %d", ErrNoLeader, id, to)
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// joinPlacementWait bounds how long a new placement replica may take to
// catch up (the placement state is small: a snapshot of a few MB at
// most) when the call has no shorter deadline.
const joinPlacementWait = 2 * time.Minute

// JoinPlacementLocal starts local node n's placement replica (joining)
// and waits, until ctx ends, for a linearizable read on it to succeed.
func JoinPlacementLocal(ctx context.Context, n *LocalNode) error {
	if err := n.Node.JoinMeta(); err != nil {
		return err
	}
	for {
		_, err := n.Node.Meta().Read(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("node %d's replica of the placement group is still catching up: %v", n.ID, err))
		case <-time.After(100 * time.Millisecond):
		}
	}
}
