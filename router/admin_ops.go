package router

import (
	"context"
	"errors"
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
)

// localReplica returns the local node hosting a replica of shardID and
// the replica's id, or nil.
func (r *Router) localReplica(shardID uint64) (*LocalNode, uint64) {
	for _, rep := range r.Map().Shard(shardID).GetReplicas() {
		for i := range r.nodes {
			if r.nodes[i].id == rep.GetNodeId() {
				return &r.nodes[i], rep.GetReplicaId()
			}
		}
	}
	return nil, 0
}

// replicaPeer returns the clients of a remote node hosting a replica of
// shardID, or nil.
func (r *Router) replicaPeer(shardID uint64) *peer {
	m := r.Map()
	for _, rep := range m.Shard(shardID).GetReplicas() {
		if n := m.Node(rep.GetNodeId()); n != nil && !r.isLocal(n.GetId()) {
			return r.peers.get(n.GetListenAddr())
		}
	}
	return nil
}

// forwardedReq is a request for another node, forwarded once.
func forwardedReq[T any](m *T) *connect.Request[T] {
	req := connect.NewRequest(m)
	req.Header().Set(forwardedHeader, "1")
	return req
}

// nextHopReq is req forwarded once more.
func nextHopReq[T any](req *connect.Request[T]) *connect.Request[T] {
	fr := connect.NewRequest(req.Msg)
	fr.Header().Set(forwardedHeader, strconv.Itoa(hopsOf(req.Header())+1))
	return fr
}

// sameHopReq is a request for m made on behalf of a request with header
// h (a batch's item): it counts as many forwarding hops as h.
func sameHopReq[T any](m *T, h http.Header) *connect.Request[T] {
	r := connect.NewRequest(m)
	r.Header().Set(forwardedHeader, strconv.Itoa(hopsOf(h)))
	return r
}

// TransferLeader implements AdminService.TransferLeader.
func (s *AdminServer) TransferLeader(ctx context.Context, req *connect.Request[wardenv1.TransferLeaderRequest]) (*connect.Response[wardenv1.TransferLeaderResponse], error) {
	resp, err := s.transferLeader(ctx, req)
	return resp, err
}

func (s *AdminServer) transferLeader(ctx context.Context, req *connect.Request[wardenv1.TransferLeaderRequest]) (*connect.Response[wardenv1.TransferLeaderResponse], error) {
	m := req.Msg
	if err := s.r.RefreshMap(ctx); err != nil { // a move may have just placed the replica
		return nil, fmt.Errorf("%w: %v", ErrNoLeader, err)
	}
	sh := s.r.Map().Shard(m.GetShardId())
	if sh == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("shard_id: shard %d does not exist", m.GetShardId()))
	}
	var target uint64
	for _, rep := range sh.GetReplicas() {
		if rep.GetNodeId() == m.GetNodeId() {
			target = rep.GetReplicaId()
		}
	}
	if target == 0 {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("node_id: node %d has no replica of shard %d", m.GetNodeId(), m.GetShardId()))
	}
	n, _ := s.r.localReplica(sh.GetId())
	if n == nil {
		p := s.r.replicaPeer(sh.GetId())
		if p == nil || req.Header().Get(forwardedHeader) != "" {
			return nil, fmt.Errorf("%w: no node hosting shard %d answers", ErrNoLeader, sh.GetId())
		}
		return p.admin.TransferLeader(ctx, forwardedReq(m))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if s.r.leaderNode(sh.GetId()) == m.GetNodeId() {
			return connect.NewResponse(&wardenv1.TransferLeaderResponse{LeaderNodeId: m.GetNodeId()}), nil
		}
		if err := n.raft.transferLeader(sh.GetId(), target); err != nil && !errors.Is(err, errDropped) {
			return nil, fmt.Errorf("%w: %v", ErrNoLeader, err)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: shard %d is still led from node %d", ErrNoLeader, sh.GetId(), s.r.leaderNode(sh.GetId()))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
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
			if s.r.isLocal(rep.GetNodeId()) {
				out.Snapshots = append(out.Snapshots, s.r.snapshotLocal(ctx, id, rep.GetNodeId()))
			} else if req.Header().Get(forwardedHeader) == "" && node != nil {
				remote[node.GetListenAddr()] = append(remote[node.GetListenAddr()], &wardenv1.ReplicaSnapshot{ShardId: id, NodeId: rep.GetNodeId()})
			}
		}
	}
	for addr, reps := range remote {
		resp, err := s.r.peers.get(addr).admin.Snapshot(ctx, forwardedReq(req.Msg))
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

// snapshotTimeout bounds the snapshot of one replica, its waits for
// another snapshot of it included.
const snapshotTimeout = 30 * time.Second

// snapshotBusyWait is how long snapshotLocal waits before it asks again
// for a snapshot of a replica that is taking another, and snapshotBusyFor
// how long it goes on asking. A local snapshot of an on-disk state
// machine syncs its database and records an index: milliseconds. The
// bound keeps a replica that stays busy from holding up the replicas
// after it and the CLI's call (10 s by default).
const (
	snapshotBusyWait = 50 * time.Millisecond
	snapshotBusyFor  = 5 * time.Second
)

// snapshotLocal snapshots the replica of shardID on local node nodeID and
// compacts its log behind the snapshot. A replica taking another
// snapshot (errSnapshotBusy: the node's idle compaction, or a second
// admin call) is asked again every snapshotBusyWait for snapshotBusyFor;
// it then reports a snapshot, or nothing to snapshot when the other took
// everything applied, or, still busy, errSnapshotBusy.
func (r *Router) snapshotLocal(ctx context.Context, shardID, nodeID uint64) *wardenv1.ReplicaSnapshot {
	out := &wardenv1.ReplicaSnapshot{ShardId: shardID, NodeId: nodeID}
	for i := range r.nodes {
		if r.nodes[i].id != nodeID {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
		idx, err := r.nodes[i].raft.snapshot(sctx, shardID)
		giveUp := time.Now().Add(snapshotBusyFor)
		for errors.Is(err, errSnapshotBusy) && time.Now().Before(giveUp) && sctx.Err() == nil {
			if f := r.cfg.Knobs.OnSnapshotBusy; f != nil {
				f()
			}
			select {
			case <-sctx.Done(): // the caller is gone: the busy answer stands
			case <-time.After(snapshotBusyWait):
				idx, err = r.nodes[i].raft.snapshot(sctx, shardID)
			}
		}
		cancel()
		if err != nil {
			out.Error = err.Error()
		}
		out.Index = idx
	}
	return out
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
	if err := s.r.RefreshMap(ctx); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoLeader, err)
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
		res, err := s.r.Shards().Propose(ctx, id, &shardv1.Envelope{Generation: s.r.Map().Generation(), Command: &shardv1.Envelope_SetConfig{SetConfig: cmd}})
		if err != nil {
			return nil, err
		}
		if res.GetCode() != shardv1.Code_CODE_OK {
			return nil, &resultError{res: res}
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
	if err := s.r.RefreshMap(ctx); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoLeader, err)
	}
	notJobs := s.r.jobsProposable()
	if err := jobFlags(notJobs, m.GetRequestId(), false, m.GetNoWait()); err != nil {
		return nil, err
	}
	if p := s.r.operatorPeer(req.Header()); p != nil && !m.GetDryRun() {
		resp, err := p.admin.Rebalance(ctx, nextHopReq(req))
		return resp, err
	}
	st := s.r.Map().State()
	var plan []placement.Action
	if m, err := s.r.placementMembership(ctx); err == nil {
		if to := placement.PlanPlacementVoter(st, m, s.r.live); to != 0 {
			plan = append(plan, placement.Action{Kind: "add_placement_voter", To: to})
		}
	}
	plan = append(plan, placement.PlanRebalance(st, s.r.leaders(ctx), s.r.live)...)
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
	op, last, err := s.runOperator(ctx, m.GetNoWait(), func() (*placementv1.Operator, error) { return s.r.ops.BeginJob(ctx, begin) })
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
			_, err = s.transferLeader(ctx, connect.NewRequest(&wardenv1.TransferLeaderRequest{ShardId: a.Shard, NodeId: a.To}))
		default:
			err = fmt.Errorf("%s needs every node at placement command version 7: %w", a.Kind, s.r.jobsProposable())
		}
		act.Done = err == nil
		if err != nil {
			act.Error = err.Error()
		}
	}
}

// leaders returns the node leading each data shard (0: unknown).
func (r *Router) leaders(ctx context.Context) map[uint64]uint64 {
	out := map[uint64]uint64{}
	for _, id := range r.Map().DataShards() {
		out[id] = r.leaderOf(ctx, id)
	}
	return out
}

// leaderOf returns the node leading shardID: as a local replica knows it,
// else as a node hosting a replica answers (0 if none does).
func (r *Router) leaderOf(ctx context.Context, shardID uint64) uint64 {
	if id := r.leaderNode(shardID); id != 0 {
		return id
	}
	p := r.replicaPeer(shardID)
	if p == nil {
		return 0
	}
	resp, err := p.admin.ListShards(ctx, forwardedReq(&wardenv1.ListShardsRequest{}))
	if err != nil {
		return 0
	}
	for _, s := range resp.Msg.GetShards() {
		if s.GetId() == shardID {
			return s.GetLeaderNodeId()
		}
	}
	return 0
}
