package rpc

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/shard"
)

// ListOperations implements AdminService.ListOperations, from a
// linearizable read of the placement state: on the placement leader's
// node, which knows how far a split it drives has copied its range, or
// here when that node does not answer.
func (s *AdminServer) ListOperations(ctx context.Context, req *connect.Request[wardenv1.ListOperationsRequest]) (*connect.Response[wardenv1.ListOperationsResponse], error) {
	if p := operatorPeer(s.r, req.Header()); p != nil {
		if resp, err := p.Admin.ListOperations(ctx, nextHopReq(req)); err == nil {
			return resp, nil
		}
	}
	st, err := s.r.ops.Meta().Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", router.ErrNoLeader, err)
	}
	out := &wardenv1.ListOperationsResponse{}
	for _, op := range st.GetOperators() {
		out.Operations = append(out.Operations, s.operation(ctx, op, true))
	}
	for _, op := range slices.Backward(st.GetFinishedOperators()) {
		out.Operations = append(out.Operations, s.operation(ctx, op, false))
	}
	return connect.NewResponse(out), nil
}

// GetOperation implements AdminService.GetOperation, answered like
// ListOperations.
func (s *AdminServer) GetOperation(ctx context.Context, req *connect.Request[wardenv1.GetOperationRequest]) (*connect.Response[wardenv1.GetOperationResponse], error) {
	id, rid := req.Msg.GetId(), req.Msg.GetRequestId()
	switch {
	case id == 0 && rid == "":
		return nil, &shard.FieldError{Field: "id", Reason: "is required, or request_id (operation ids start at 1)"}
	case id != 0 && rid != "":
		return nil, &shard.FieldError{Field: "request_id", Reason: "give id or request_id, not both"}
	}
	if p := operatorPeer(s.r, req.Header()); p != nil {
		if resp, err := p.Admin.GetOperation(ctx, nextHopReq(req)); err == nil || connect.CodeOf(err) == connect.CodeNotFound {
			return resp, err
		}
	}
	st, err := s.r.ops.Meta().Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", router.ErrNoLeader, err)
	}
	op, running := placement.FindOperator(st, id, rid)
	if op == nil {
		name := fmt.Sprintf("id %d", id)
		if id == 0 {
			name = fmt.Sprintf("request_id %q", rid)
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no operation with %s is in progress or among the last ended", name))
	}
	return connect.NewResponse(&wardenv1.GetOperationResponse{Operation: s.operation(ctx, op, running)}), nil
}

// operation describes operator op; for a running move whose new replica
// is catching up, with how far it got (read from the replicas, best
// effort: 0 when they do not answer).
func (s *AdminServer) operation(ctx context.Context, op *placementv1.Operator, running bool) *wardenv1.Operation {
	out := &wardenv1.Operation{Id: op.GetId(), RequestId: op.GetRequestId(), ParentId: op.GetParent(), Error: op.GetError()}
	rollingBack := false
	if sp := op.GetSplit(); sp != nil {
		out.Kind, out.ShardId, out.NewShardId, out.SplitAt, out.Generation = "split", sp.GetSource(), sp.GetTarget(), sp.GetSplitAt(), sp.GetGeneration()
		out.Step, out.StepsDone = stepName(sp.GetStep().String(), "SPLIT_STEP_"), uint32(sp.GetStep())
		out.StepsTotal = uint32(placementv1.SplitStep_SPLIT_STEP_COMMITTED)
		rollingBack = sp.GetRollingBack()
		if running {
			c := s.r.ops.Operators().Copied(op.GetId())
			out.RecordsCopied, out.BytesCopied = c.Records, c.Bytes
		}
	}
	if r := op.GetRemoveNode(); r != nil {
		out.Kind, out.NodeId, out.Force, out.ToNodeId = "remove_node", r.GetNodeId(), r.GetForce(), r.GetPlacementNodeId()
		out.Step, out.StepsDone = stepName(r.GetStep().String(), "REMOVE_NODE_STEP_"), uint32(r.GetStep())
		out.StepsTotal, out.StepsPlanned = uint32(placementv1.RemoveNodeStep_REMOVE_NODE_STEP_REMOVED), r.GetReplicas()
	}
	if rb := op.GetRebalance(); rb != nil {
		out.Kind, out.Step, out.StepsPlanned = "rebalance", "running", rb.GetPlanned()
		if !running {
			out.Step = "ended"
		}
	}
	for _, st := range op.GetSteps() {
		out.Steps = append(out.Steps, &wardenv1.OperationStep{Kind: placement.ActionKind(st.GetKind()), ShardId: st.GetShard(), FromNodeId: st.GetFromNode(),
			ToNodeId: st.GetToNode(), OperationId: st.GetOperatorId(), State: stepName(st.GetState().String(), "JOB_STEP_STATE_"), Error: st.GetError()})
	}
	if m := op.GetMove(); m != nil {
		out.Kind, out.ShardId, out.FromNodeId, out.ToNodeId, out.ReplicaId = "move", m.GetShard(), m.GetFromNode(), m.GetToNode(), m.GetToReplica()
		out.Step, out.StepsDone = stepName(m.GetStep().String(), "MOVE_STEP_"), uint32(m.GetStep())
		out.StepsTotal = uint32(placementv1.MoveStep_MOVE_STEP_REMOVED)
		rollingBack = m.GetRollingBack()
		if running && !rollingBack && m.GetStep() == placementv1.MoveStep_MOVE_STEP_ADDED {
			shards := s.r.ops.Shards()
			if q, err := shards.Read(ctx, m.GetShard(), &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}}); err == nil {
				out.CatchUpTarget = q.GetAppliedIndex()
			}
			if idx, err := shards.AppliedIndex(ctx, m.GetShard(), m.GetToNode()); err == nil {
				out.CaughtUp = idx
			}
		}
	}
	switch {
	case op.GetError() != "":
		out.State = wardenv1.OperationState_OPERATION_STATE_FAILED
	case running && rollingBack:
		out.State = wardenv1.OperationState_OPERATION_STATE_ROLLING_BACK
	case running:
		out.State = wardenv1.OperationState_OPERATION_STATE_RUNNING
	case rollingBack:
		out.State = wardenv1.OperationState_OPERATION_STATE_ROLLED_BACK
	default:
		out.State = wardenv1.OperationState_OPERATION_STATE_DONE
	}
	return out
}

// stepName is an enum value's name without its prefix, in lower case
// ("SPLIT_STEP_FENCED" → "fenced").
func stepName(v, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(v, prefix))
}
