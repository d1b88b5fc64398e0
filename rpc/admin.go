package rpc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/shard"
)

// AdminServer implements wardenv1connect.AdminServiceHandler on a Router.
type AdminServer struct {
	r *node
}

var _ wardenv1connect.AdminServiceHandler = (*AdminServer)(nil)

// newAdminServer returns the AdminService handler of r.
func newAdminServer(r *node) *AdminServer { return &AdminServer{r: r} }

// Bounds of HotResources' limit.
const (
	defaultHotLimit = 10
	maxHotLimit     = 100
)

// HotResources implements AdminService.HotResources.
func (s *AdminServer) HotResources(ctx context.Context, req *connect.Request[wardenv1.HotResourcesRequest]) (*connect.Response[wardenv1.HotResourcesResponse], error) {
	resp, err := s.hotResources(ctx, req.Msg)
	return resp, err
}

func (s *AdminServer) hotResources(ctx context.Context, m *wardenv1.HotResourcesRequest) (*connect.Response[wardenv1.HotResourcesResponse], error) {
	limit := int(m.GetLimit())
	switch {
	case limit == 0:
		limit = defaultHotLimit
	case limit > maxHotLimit:
		return nil, &shard.FieldError{Field: "limit", Reason: "must be at most 100"}
	}
	out := &wardenv1.HotResourcesResponse{}
	var locks []*shardv1.LockRecord
	for _, id := range s.r.Map().DataShards() {
		q, err := s.r.ops.Shards().Read(ctx, id, &shardv1.Query{Query: &shardv1.Query_Hot{Hot: &shardv1.HotQuery{Limit: uint32(limit)}}})
		if err != nil {
			return nil, err
		}
		locks = append(locks, q.GetHot()...)
	}
	slices.SortStableFunc(locks, func(a, b *shardv1.LockRecord) int { return int(b.GetWaiters()) - int(a.GetWaiters()) })
	for _, l := range locks[:min(limit, len(locks))] {
		out.ByWaiters = append(out.ByWaiters, &wardenv1.HotResource{Resource: l.GetResource(), Waiters: l.GetWaiters()})
	}
	for _, rr := range s.r.Acquires().Top(limit) {
		out.ByAcquireRate = append(out.ByAcquireRate, &wardenv1.HotResource{Resource: rr.Resource, AcquiresPerSecond: rr.PerSec})
	}
	return connect.NewResponse(out), nil
}

// ListNodes implements AdminService.ListNodes.
func (s *AdminServer) ListNodes(ctx context.Context, _ *connect.Request[wardenv1.ListNodesRequest]) (*connect.Response[wardenv1.ListNodesResponse], error) {
	err := s.r.ops.RefreshMap(ctx)
	out := &wardenv1.ListNodesResponse{}
	mem, _ := s.r.ops.PlacementMembership(ctx) // nil: this node hosts no placement replica
	for _, n := range s.r.Map().State().GetNodes() {
		info := &wardenv1.NodeInfo{Id: n.GetId(), Zone: n.GetZone(), RaftAddr: n.GetRaftAddr(), ListenAddr: n.GetListenAddr(), Version: n.GetBuildVersion()}
		info.Up, info.LastHeard = s.r.ops.HeardFrom(n.GetId())
		if mem != nil {
			info.Placement = wardenv1.PlacementRole_PLACEMENT_ROLE_NONE
			if voting, member := placement.IsMember(mem, n.GetId()); voting { // meta replica id = node id
				info.Placement = wardenv1.PlacementRole_PLACEMENT_ROLE_VOTER
			} else if member {
				info.Placement = wardenv1.PlacementRole_PLACEMENT_ROLE_NON_VOTING
			}
		}
		out.Nodes = append(out.Nodes, info)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", router.ErrNoLeader, err)
	}
	out.PlacementLeaderId = s.r.ops.MetaLeader().GetId()
	return connect.NewResponse(out), nil
}

// ListShards implements AdminService.ListShards.
func (s *AdminServer) ListShards(ctx context.Context, req *connect.Request[wardenv1.ListShardsRequest]) (*connect.Response[wardenv1.ListShardsResponse], error) {
	if err := s.r.ops.RefreshMap(ctx); err != nil {
		return nil, fmt.Errorf("%w: %v", router.ErrNoLeader, err)
	}
	m := s.r.Map()
	out := &wardenv1.ListShardsResponse{Generation: m.Generation(), EpochLimit: m.State().GetEpochLimit()}
	for _, sh := range m.State().GetShards() {
		info := &wardenv1.ShardInfo{Id: sh.GetId(), Epoch: sh.GetEpoch(), State: "active"}
		if sh.GetState() == placementv1.ShardState_SHARD_STATE_PENDING {
			info.State = "pending"
		}
		for _, rg := range m.State().GetRanges() {
			if rg.GetShardId() == sh.GetId() {
				info.RangeStart, info.RangeEnd = rg.GetStart(), rg.GetEnd()
			}
		}
		for _, rep := range sh.GetReplicas() {
			info.Replicas = append(info.Replicas, &wardenv1.ReplicaInfo{ReplicaId: rep.GetReplicaId(), NodeId: rep.GetNodeId(), Zone: m.Node(rep.GetNodeId()).GetZone()})
		}
		if info.State == "active" {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			q, err := s.r.ops.Shards().Read(rctx, sh.GetId(), &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}})
			cancel()
			if err == nil {
				info.HeldLocks, info.QueuedWaiters = q.GetMeta().GetHeldLocks(), q.GetMeta().GetQueuedWaiters()
			}
		}
		info.LeaderNodeId = s.r.ops.LeaderNode(sh.GetId())
		if info.LeaderNodeId == 0 && req.Header().Get(router.ForwardedHeader) == "" {
			info.LeaderNodeId = s.r.ops.LeaderOf(ctx, sh.GetId())
		}
		for _, rep := range info.Replicas {
			// A node that stopped answering is down even while this node's
			// view of the leader still names it (an election takes a moment).
			switch up, _ := s.r.ops.HeardFrom(rep.NodeId); {
			case s.r.ops.ReplicaFailed(rep.NodeId, sh.GetId()):
				rep.State = "failed"
			case !up:
				rep.State = "down"
			case rep.NodeId == info.LeaderNodeId:
				rep.State = "leader"
			default:
				rep.State = "follower"
			}
		}
		out.Shards = append(out.Shards, info)
	}
	return connect.NewResponse(out), nil
}

// SplitShard implements AdminService.SplitShard. The node that leads the
// placement group drives the split (a request elsewhere is forwarded
// there); if that node fails, the next placement leader finishes it.
func (s *AdminServer) SplitShard(ctx context.Context, req *connect.Request[wardenv1.SplitShardRequest]) (*connect.Response[wardenv1.SplitShardResponse], error) {
	if err := s.requestIDProposable(ctx, req.Msg.GetRequestId()); err != nil {
		return nil, err
	}
	if p := operatorPeer(s.r, req.Header()); p != nil {
		resp, err := p.Admin.SplitShard(ctx, nextHopReq(req))
		return resp, err
	}
	resp, err := s.splitShard(ctx, req.Msg)
	return resp, err
}

// requestIDProposable refuses an operation's request id, before the call
// is forwarded to the placement leader, while some node runs a binary
// older than placement command version 6: the leader may be one, which
// would ignore the id (an unknown field) and begin the operation again
// on a retry.
func (s *AdminServer) requestIDProposable(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	if err := shard.CheckName("request_id", id, placement.MaxRequestID); err != nil {
		return err
	}
	if err := s.r.ops.RefreshMap(ctx); err != nil {
		return fmt.Errorf("%w: %v", router.ErrNoLeader, err)
	}
	begin := &placementv1.Command{Command: &placementv1.Command_BeginMove{BeginMove: &placementv1.BeginMoveCmd{RequestId: id}}}
	if err := placement.Proposable(s.r.Map().State(), begin); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("request_id needs every node upgraded first: %w", err))
	}
	return nil
}

// refusedToConnect maps a placement refusal to a Connect error whose
// message is shown (the refusal itself, or its reason alone for a change
// the caller does not think of as placement: auth). Refusals of a request
// field start with the field's name, which the error's FieldViolation
// detail carries.
func refusedToConnect(refused *placement.RefusedError, shown error) error {
	field, reason, _ := strings.Cut(refused.Reason, ": ")
	switch {
	case strings.Contains(refused.Reason, "does not exist"), strings.Contains(refused.Reason, "owns no range"):
		return connect.NewError(connect.CodeNotFound, shown)
	case field == "split_at", field == "to_node_id", field == "from_node_id", field == "request_id":
		return withDetail(connect.NewError(connect.CodeInvalidArgument, shown), &wardenv1.FieldViolation{Field: field, Description: reason})
	}
	return connect.NewError(connect.CodeFailedPrecondition, shown)
}

// runOperator records an operator with begin (or finds the one its
// request id began) and, unless noWait, drives it to its end, returning
// it as begun and as last recorded (as begun, with noWait). A refusal of
// the placement group is mapped to its Connect code.
func (s *AdminServer) runOperator(ctx context.Context, noWait bool, begin func() (*placementv1.Operator, error)) (op, last *placementv1.Operator, err error) {
	op, err = begin()
	var refused *placement.RefusedError
	switch {
	case errors.As(err, &refused):
		return nil, nil, refusedToConnect(refused, refused)
	case errors.Is(err, placement.ErrMetaVersion):
		return nil, nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("request_id needs every node upgraded first: %w", err))
	case err != nil:
		return nil, nil, fmt.Errorf("%w: %v", router.ErrNoLeader, err)
	case noWait:
		return op, op, nil
	}
	if last, err = s.r.ops.Operators().Run(ctx, op.GetId()); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", router.ErrOutcomeUnknown, err)
	}
	return op, last, nil
}

// MoveReplica implements AdminService.MoveReplica, driven like SplitShard.
func (s *AdminServer) MoveReplica(ctx context.Context, req *connect.Request[wardenv1.MoveReplicaRequest]) (*connect.Response[wardenv1.MoveReplicaResponse], error) {
	if err := s.requestIDProposable(ctx, req.Msg.GetRequestId()); err != nil {
		return nil, err
	}
	if p := operatorPeer(s.r, req.Header()); p != nil {
		resp, err := p.Admin.MoveReplica(ctx, nextHopReq(req))
		return resp, err
	}
	resp, err := s.moveReplica(ctx, req.Msg)
	return resp, err
}

func (s *AdminServer) moveReplica(ctx context.Context, m *wardenv1.MoveReplicaRequest) (*connect.Response[wardenv1.MoveReplicaResponse], error) {
	if !s.r.ops.Live(m.GetToNodeId()) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("to_node_id: node %d does not answer", m.GetToNodeId()))
	}
	op, last, err := s.runOperator(ctx, m.GetNoWait(), func() (*placementv1.Operator, error) {
		return s.r.ops.Operators().BeginMove(ctx, m.GetShardId(), m.GetFromNodeId(), m.GetToNodeId(), m.GetRequestId())
	})
	if err != nil {
		return nil, err
	}
	if last.GetMove().GetRollingBack() {
		return nil, connect.NewError(connect.CodeAborted, fmt.Errorf("move %d was rolled back: the new replica did not catch up", op.GetId()))
	}
	return connect.NewResponse(&wardenv1.MoveReplicaResponse{ReplicaId: op.GetMove().GetToReplica(), OperationId: op.GetId()}), nil
}

func (s *AdminServer) splitShard(ctx context.Context, m *wardenv1.SplitShardRequest) (*connect.Response[wardenv1.SplitShardResponse], error) {
	if m.GetShardId() == 0 {
		return nil, &shard.FieldError{Field: "shard_id", Reason: "is required"}
	}
	op, last, err := s.runOperator(ctx, m.GetNoWait(), func() (*placementv1.Operator, error) {
		return s.r.ops.Operators().BeginSplit(ctx, m.GetShardId(), m.GetSplitAt(), m.GetRequestId())
	})
	if err != nil {
		return nil, err
	}
	if m.GetNoWait() {
		return connect.NewResponse(&wardenv1.SplitShardResponse{OperationId: op.GetId()}), nil
	}
	if err := s.r.ops.RefreshMap(ctx); err != nil { // route by the new map at once
		s.r.Config().Logger.Debug("placement map refresh", "err", err)
	}
	sp := last.GetSplit()
	if sp.GetRollingBack() {
		return nil, connect.NewError(connect.CodeAborted, fmt.Errorf("split %d was rolled back: the new shard did not start or the source refused the fence", op.GetId()))
	}
	return connect.NewResponse(&wardenv1.SplitShardResponse{NewShardId: sp.GetTarget(), SplitAt: sp.GetSplitAt(), Generation: sp.GetGeneration(), OperationId: op.GetId()}), nil
}

// RemoveNode implements AdminService.RemoveNode, on the placement
// leader's node like the operators it runs: from placement command
// version 7 as a job (removeNodeJob), before it as a sequence of moves
// this call makes (removeNodeMoves).
//
// The version check comes first, on the node the call reached: the
// placement leader may run a binary that predates RemoveNode and would
// answer unimplemented rather than name the version.
func (s *AdminServer) RemoveNode(ctx context.Context, req *connect.Request[wardenv1.RemoveNodeRequest]) (*connect.Response[wardenv1.RemoveNodeResponse], error) {
	if err := s.r.ops.RefreshMap(ctx); err != nil {
		return nil, fmt.Errorf("%w: %v", router.ErrNoLeader, err)
	}
	m := req.Msg
	if m.GetNodeId() == 0 {
		return nil, &shard.FieldError{Field: "node_id", Reason: "is required (node ids start at 1)"}
	}
	remove := &placementv1.Command{Command: &placementv1.Command_RemoveNode{RemoveNode: &placementv1.RemoveNodeCmd{NodeId: m.GetNodeId()}}}
	if err := placement.Proposable(s.r.Map().State(), remove); err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("node removal needs every node upgraded first: %w", err))
	}
	notJobs := s.r.ops.JobsProposable()
	if err := jobFlags(notJobs, m.GetRequestId(), m.GetForce(), m.GetNoWait()); err != nil {
		return nil, err
	}
	if _, err := s.r.ops.HandOffPlacement(ctx, m.GetNodeId()); err != nil {
		return nil, err
	}
	if p := operatorPeer(s.r, req.Header()); p != nil {
		resp, err := p.Admin.RemoveNode(ctx, nextHopReq(req))
		return resp, err
	}
	if notJobs != nil {
		resp, err := s.removeNodeMoves(ctx, remove)
		return resp, err
	}
	resp, err := s.removeNodeJob(ctx, m)
	return resp, err
}

// jobFlags checks the flags of a call that begins a job: request_id as
// an operation's, and, while some node runs a binary older than version
// 7 (notJobs), none of the flags that need a job.
func jobFlags(notJobs error, requestID string, force, noWait bool) error {
	if requestID != "" {
		if err := shard.CheckName("request_id", requestID, placement.MaxRequestID); err != nil {
			return err
		}
	}
	if notJobs != nil && (requestID != "" || force || noWait) {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("force, request_id and no_wait need every node upgraded first: %w", notJobs))
	}
	return nil
}

// removeNodeJob begins the removal of node m.node_id as a job (or finds
// the one its request id began) and, unless no_wait, waits for its end.
// Before anything is recorded it refuses, naming the shard or the zone,
// a removal that could not finish: a replica with no place (unless
// forced), a placement group vote with no replacement (unless forced).
func (s *AdminServer) removeNodeJob(ctx context.Context, m *wardenv1.RemoveNodeRequest) (*connect.Response[wardenv1.RemoveNodeResponse], error) {
	id := m.GetNodeId()
	st := s.r.Map().State()
	removal := &placementv1.RemoveNodeOp{NodeId: id, Force: m.GetForce()}
	begin := &placementv1.BeginJobCmd{Job: &placementv1.BeginJobCmd_RemoveNode{RemoveNode: removal}, RequestId: m.GetRequestId()}
	if op, _ := placement.FindOperator(st, 0, m.GetRequestId()); op == nil {
		switch {
		case s.r.Map().Node(id) == nil && slices.Contains(st.GetRemovedNodeIds(), id):
			// Removed already: a retry after a lost answer or a timeout.
			return connect.NewResponse(&wardenv1.RemoveNodeResponse{}), nil
		case s.r.Map().Node(id) == nil:
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("node_id: node %d is not in the map", id))
		}
		to, err := s.r.ops.PlacementSuccessor(ctx, id, m.GetForce())
		if err != nil {
			return nil, err
		}
		if _, err := placement.PlanRemoval(st, id, s.r.ops.Live, m.GetForce()); err != nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, err)
		}
		removal.PlacementNodeId = to
	}
	op, last, err := s.runOperator(ctx, m.GetNoWait(), func() (*placementv1.Operator, error) { return s.r.ops.Operators().BeginJob(ctx, begin) })
	if err != nil {
		return nil, err
	}
	out := &wardenv1.RemoveNodeResponse{OperationId: op.GetId(), PlacementNodeId: op.GetRemoveNode().GetPlacementNodeId()}
	if m.GetNoWait() {
		return connect.NewResponse(out), nil
	}
	if err := s.r.ops.RefreshMap(ctx); err != nil {
		s.r.Config().Logger.Debug("placement map refresh", "err", err)
	}
	if last.GetError() != "" {
		return nil, connect.NewError(connect.CodeAborted, fmt.Errorf("removal of node %d (operation %d) failed: %s; the moves made stay made: see warden admin operation %d", id, op.GetId(), last.GetError(), op.GetId()))
	}
	for _, st := range last.GetSteps() {
		switch st.GetKind() {
		case placementv1.JobStepKind_JOB_STEP_KIND_MOVE:
			out.Moves = append(out.Moves, &wardenv1.ReplicaMove{ShardId: st.GetShard(), FromNodeId: st.GetFromNode(), ToNodeId: st.GetToNode(), ReplicaId: s.r.ops.MovedReplica(st.GetOperatorId())})
		case placementv1.JobStepKind_JOB_STEP_KIND_DROP_REPLICA:
			out.DroppedShardIds = append(out.DroppedShardIds, st.GetShard())
		}
	}
	return connect.NewResponse(out), nil
}

// removeNodeMoves removes a node below placement command version 7: it
// plans a move for each replica of the node (placement.PlanRemoval) and,
// for a voter of the placement group, its replacement there, refusing
// before anything moves if one has no place; makes the moves one at a
// time, replaces the voter, and then removes the node from the map.
func (s *AdminServer) removeNodeMoves(ctx context.Context, remove *placementv1.Command) (*connect.Response[wardenv1.RemoveNodeResponse], error) {
	id := remove.GetRemoveNode().GetNodeId()
	st := s.r.Map().State()
	node := s.r.Map().Node(id)
	if node == nil && slices.Contains(st.GetRemovedNodeIds(), id) {
		// Removed already: a retry after a lost answer or a timeout.
		return connect.NewResponse(&wardenv1.RemoveNodeResponse{}), nil
	}
	if node == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("node_id: node %d is not in the map", id))
	}
	membership, err := s.r.ops.PlacementMembership(ctx)
	if err != nil {
		return nil, err
	}
	out := &wardenv1.RemoveNodeResponse{}
	if out.PlacementNodeId, err = s.r.ops.PlacementSuccessor(ctx, id, false); err != nil {
		return nil, err
	}
	plan, err := placement.PlanRemoval(st, id, s.r.ops.Live, false)
	if err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	for _, a := range plan {
		resp, err := s.moveReplica(ctx, &wardenv1.MoveReplicaRequest{ShardId: a.Shard, FromNodeId: id, ToNodeId: a.To})
		if err != nil {
			return nil, fmt.Errorf("moving shard %d's replica to node %d (after %d moves): %w", a.Shard, a.To, len(out.Moves), err)
		}
		out.Moves = append(out.Moves, &wardenv1.ReplicaMove{ShardId: a.Shard, FromNodeId: id, ToNodeId: a.To, ReplicaId: resp.Msg.GetReplicaId()})
	}
	if to := out.GetPlacementNodeId(); to != 0 {
		if err := s.r.ops.ReplacePlacementVoter(ctx, id, to); err != nil {
			return nil, fmt.Errorf("replacing node %d in the placement group by node %d (after %d moves): %w", id, to, len(out.Moves), err)
		}
	} else if _, member := placement.IsMember(membership, id); member {
		// A non-voting member (a replacement that never got to vote)
		// leaves with the node.
		if _, err := s.r.ops.ChangePlacement(ctx, membership, placementv1.MembershipChange_MEMBERSHIP_CHANGE_REMOVE, id); err != nil {
			return nil, err
		}
	}
	if _, err := s.r.ops.Meta().Propose(ctx, remove); err != nil {
		var refused *placement.RefusedError
		if errors.As(err, &refused) {
			return nil, refusedToConnect(refused, refused)
		}
		return nil, fmt.Errorf("%w: %v", router.ErrNoLeader, err)
	}
	if err := s.r.ops.RefreshMap(ctx); err != nil {
		s.r.Config().Logger.Debug("placement map refresh", "err", err)
	}
	s.r.Config().Logger.Info("node removed", "node", id, "moves", len(out.Moves), "placement_replacement", out.GetPlacementNodeId())
	return connect.NewResponse(out), nil
}

// operatorPeer returns the placement leader's clients when it runs on
// another node and the request was not forwarded already: operators are
// driven there.
func operatorPeer(r *node, h http.Header) *peer {
	if hopsOf(h) >= router.MaxHops {
		return nil
	}
	if leader := r.ops.MetaLeader(); leader != nil {
		if r.IsLocal(leader.GetId()) {
			return nil
		}
		return r.peer(leader.GetListenAddr())
	}
	// No placement replica here to know the leader: ask another node.
	nodes := r.Map().State().GetNodes()
	for k := range nodes {
		if n := nodes[(k+rand.IntN(len(nodes)))%len(nodes)]; !r.IsLocal(n.GetId()) {
			return r.peer(n.GetListenAddr())
		}
	}
	return nil
}
