package rpc

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
)

// nextHopReq is req forwarded once more.
func nextHopReq[T any](req *connect.Request[T]) *connect.Request[T] {
	fr := connect.NewRequest(req.Msg)
	fr.Header().Set(router.ForwardedHeader, strconv.Itoa(hopsOf(req.Header())+1))
	return fr
}

// sameHopReq is a request for m made on behalf of a request with header
// h (a batch's item): it counts as many forwarding hops as h.
func sameHopReq[T any](m *T, h http.Header) *connect.Request[T] {
	r := connect.NewRequest(m)
	r.Header().Set(router.ForwardedHeader, strconv.Itoa(hopsOf(h)))
	return r
}

// TransferLeader implements AdminService.TransferLeader.
func (s *AdminServer) TransferLeader(ctx context.Context, req *connect.Request[wardenv1.TransferLeaderRequest]) (*connect.Response[wardenv1.TransferLeaderResponse], error) {
	m := req.Msg
	lead, err := s.r.ops.TransferLeader(ctx, m.GetShardId(), m.GetNodeId(), req.Header().Get(router.ForwardedHeader) != "")
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&wardenv1.TransferLeaderResponse{LeaderNodeId: lead}), nil
}

// Snapshot implements AdminService.Snapshot. A forwarded request
// snapshots only the receiving node's replicas.
func (s *AdminServer) Snapshot(ctx context.Context, req *connect.Request[wardenv1.SnapshotRequest]) (*connect.Response[wardenv1.SnapshotResponse], error) {
	ids := s.r.Map().DataShards()
	if id := req.Msg.GetShardId(); id != 0 {
		if s.r.Map().Shard(id) == nil {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("shard_id: shard %d does not exist", id))
		}
		ids = []uint64{id}
	}
	out := &wardenv1.SnapshotResponse{}
	remote := map[string][]*wardenv1.ReplicaSnapshot{} // by node address: the replicas it would snapshot
	m := s.r.Map()
	for _, id := range ids {
		for _, rep := range m.Shard(id).GetReplicas() {
			node := m.Node(rep.GetNodeId())
			if s.r.IsLocal(rep.GetNodeId()) {
				rs := &wardenv1.ReplicaSnapshot{ShardId: id, NodeId: rep.GetNodeId()}
				var err error
				if rs.Index, err = s.r.ops.SnapshotLocal(ctx, id, rep.GetNodeId()); err != nil {
					rs.Error = err.Error()
				}
				out.Snapshots = append(out.Snapshots, rs)
			} else if req.Header().Get(router.ForwardedHeader) == "" && node != nil {
				remote[node.GetListenAddr()] = append(remote[node.GetListenAddr()], &wardenv1.ReplicaSnapshot{ShardId: id, NodeId: rep.GetNodeId()})
			}
		}
	}
	for addr, reps := range remote {
		resp, err := s.r.peer(addr).Admin.Snapshot(ctx, router.ForwardedReq(req.Msg))
		if err != nil {
			// Each replica the node hosts gets the error, so a caller can
			// tell which were not snapshotted.
			for _, rs := range reps {
				rs.Error = fmt.Sprintf("node %s: %v", addr, err)
			}
			out.Snapshots = append(out.Snapshots, reps...)
			continue
		}
		out.Snapshots = append(out.Snapshots, resp.Msg.GetSnapshots()...)
	}
	return connect.NewResponse(out), nil
}

// SetShardConfig implements AdminService.SetShardConfig.
func (s *AdminServer) SetShardConfig(ctx context.Context, req *connect.Request[wardenv1.SetShardConfigRequest]) (*connect.Response[wardenv1.SetShardConfigResponse], error) {
	resp, err := s.setShardConfig(ctx, req.Msg)
	return resp, err
}

func (s *AdminServer) setShardConfig(ctx context.Context, m *wardenv1.SetShardConfigRequest) (*connect.Response[wardenv1.SetShardConfigResponse], error) {
	if err := validateShardConfig(m); err != nil {
		return nil, err
	}
	if err := s.r.ops.RefreshMap(ctx); err != nil {
		return nil, fmt.Errorf("%w: %v", router.ErrNoLeader, err)
	}
	ids := s.r.Map().DataShards()
	if id := m.GetShardId(); id != 0 {
		if s.r.Map().Shard(id) == nil {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("shard_id: shard %d does not exist", id))
		}
		ids = []uint64{id}
	}
	cmd := &shardv1.SetConfigCmd{
		MaxClockSkewNanos:     nanos(m.GetMaxClockSkew()),
		MinLeaseTtlNanos:      nanos(m.GetMinLeaseTtl()),
		MaxLeaseTtlNanos:      nanos(m.GetMaxLeaseTtl()),
		DefaultLeaseTtlNanos:  nanos(m.GetDefaultLeaseTtl()),
		DedupWindowNanos:      nanos(m.GetDedupWindow()),
		MaxWaitTimeoutNanos:   nanos(m.GetMaxWaitTimeout()),
		MaxWaitersPerResource: m.MaxWaitersPerResource,
		MaxWaitersPerTenant:   m.MaxWaitersPerTenant,

		DefaultReservationTtlNanos: nanos(m.GetDefaultReservationTtl()),
		MaxReservationTtlNanos:     nanos(m.GetMaxReservationTtl()),
		FairnessThresholdPercent:   m.FairnessThresholdPercent,
		LedgerRetentionNanos:       nanos(m.GetLedgerRetention()),
	}
	out := &wardenv1.SetShardConfigResponse{}
	for _, id := range ids {
		res, err := s.r.ops.Shards().Propose(ctx, id, &shardv1.Envelope{Generation: s.r.Map().Generation(), Command: &shardv1.Envelope_SetConfig{SetConfig: cmd}})
		if err != nil {
			return nil, err
		}
		if res.GetCode() != shardv1.Code_CODE_OK {
			return nil, &router.ResultError{Res: res}
		}
		c := res.GetConfig()
		out.Shards = append(out.Shards, &wardenv1.ShardConfigInfo{
			ShardId:               id,
			MaxClockSkew:          durationpb.New(time.Duration(c.GetMaxClockSkewNanos())),
			MinLeaseTtl:           durationpb.New(time.Duration(c.GetMinLeaseTtlNanos())),
			MaxLeaseTtl:           durationpb.New(time.Duration(c.GetMaxLeaseTtlNanos())),
			DefaultLeaseTtl:       durationpb.New(time.Duration(c.GetDefaultLeaseTtlNanos())),
			DedupWindow:           durationpb.New(time.Duration(c.GetDedupWindowNanos())),
			MaxWaitTimeout:        durationpb.New(time.Duration(c.GetMaxWaitTimeoutNanos())),
			MaxWaitersPerResource: c.GetMaxWaitersPerResource(),
			MaxWaitersPerTenant:   c.GetMaxWaitersPerTenant(),

			DefaultReservationTtl:    durationpb.New(time.Duration(c.GetDefaultReservationTtlNanos())),
			MaxReservationTtl:        durationpb.New(time.Duration(c.GetMaxReservationTtlNanos())),
			FairnessThresholdPercent: c.GetFairnessThresholdPercent(),
			LedgerRetention:          durationpb.New(time.Duration(c.GetLedgerRetentionNanos())),
		})
	}
	return connect.NewResponse(out), nil
}

// nanos converts an optional duration to optional nanoseconds.
func nanos(d *durationpb.Duration) *int64 {
	if d == nil {
		return nil
	}
	v := int64(d.AsDuration())
	return &v
}

// Rebalance implements AdminService.Rebalance. Steps are driven like
// MoveReplica, on the placement leader's node: from placement command
// version 7 as a job that plans again before each step, before it as the
// plan this call makes, step by step.
func (s *AdminServer) Rebalance(ctx context.Context, req *connect.Request[wardenv1.RebalanceRequest]) (*connect.Response[wardenv1.RebalanceResponse], error) {
	m := req.Msg
	if err := s.r.ops.RefreshMap(ctx); err != nil {
		return nil, fmt.Errorf("%w: %v", router.ErrNoLeader, err)
	}
	notJobs := s.r.ops.JobsProposable()
	if err := jobFlags(notJobs, m.GetRequestId(), false, m.GetNoWait()); err != nil {
		return nil, err
	}
	if p := operatorPeer(s.r, req.Header()); p != nil && !m.GetDryRun() {
		resp, err := p.Admin.Rebalance(ctx, nextHopReq(req))
		return resp, err
	}
	st := s.r.Map().State()
	var plan []placement.Action
	if m, err := s.r.ops.PlacementMembership(ctx); err == nil {
		if to := placement.PlanPlacementVoter(st, m, s.r.ops.Live); to != 0 {
			plan = append(plan, placement.Action{Kind: "add_placement_voter", To: to})
		}
	}
	plan = append(plan, placement.PlanRebalance(st, s.r.ops.Leaders(ctx), s.r.ops.Live)...)
	out := &wardenv1.RebalanceResponse{}
	switch {
	case m.GetDryRun(), len(plan) == 0 && m.GetRequestId() == "":
		for _, a := range plan {
			out.Actions = append(out.Actions, &wardenv1.RebalanceAction{Kind: a.Kind, ShardId: a.Shard, FromNodeId: a.From, ToNodeId: a.To})
		}
		return connect.NewResponse(out), nil
	case notJobs != nil:
		s.rebalanceSteps(ctx, plan, out)
		return connect.NewResponse(out), nil
	}
	begin := &placementv1.BeginJobCmd{Job: &placementv1.BeginJobCmd_Rebalance{Rebalance: &placementv1.RebalanceOp{Planned: uint32(len(plan))}}, RequestId: m.GetRequestId()}
	op, last, err := s.runOperator(ctx, m.GetNoWait(), func() (*placementv1.Operator, error) { return s.r.ops.Operators().BeginJob(ctx, begin) })
	if err != nil {
		return nil, err
	}
	out.OperationId = op.GetId()
	if m.GetNoWait() {
		return connect.NewResponse(out), nil
	}
	for _, st := range last.GetSteps() {
		out.Actions = append(out.Actions, &wardenv1.RebalanceAction{Kind: placement.ActionKind(st.GetKind()), ShardId: st.GetShard(), FromNodeId: st.GetFromNode(), ToNodeId: st.GetToNode(),
			Done: st.GetState() == placementv1.JobStepState_JOB_STEP_STATE_DONE, Error: st.GetError()})
	}
	if last.GetError() != "" {
		return nil, connect.NewError(connect.CodeAborted, fmt.Errorf("rebalance (operation %d) failed after %d steps: %s; the steps made stay made: see warden admin operation %d", op.GetId(), len(out.Actions), last.GetError(), op.GetId()))
	}
	return connect.NewResponse(out), nil
}

// rebalanceSteps carries out plan below placement command version 7, one
// action at a time, each marked done or with its error in out (adding a
// replica needs version 7).
func (s *AdminServer) rebalanceSteps(ctx context.Context, plan []placement.Action, out *wardenv1.RebalanceResponse) {
	for _, a := range plan {
		act := &wardenv1.RebalanceAction{Kind: a.Kind, ShardId: a.Shard, FromNodeId: a.From, ToNodeId: a.To}
		out.Actions = append(out.Actions, act)
		var err error
		switch a.Kind {
		case "move_replica":
			_, err = s.moveReplica(ctx, &wardenv1.MoveReplicaRequest{ShardId: a.Shard, FromNodeId: a.From, ToNodeId: a.To})
		case "transfer_leader":
			_, err = s.TransferLeader(ctx, connect.NewRequest(&wardenv1.TransferLeaderRequest{ShardId: a.Shard, NodeId: a.To}))
		default:
			err = fmt.Errorf("%s needs every node at placement command version 7: %w", a.Kind, s.r.ops.JobsProposable())
		}
		act.Done = err == nil
		if err != nil {
			act.Error = err.Error()
		}
	}
}
