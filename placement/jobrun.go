package placement

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// Cluster is what a job changes besides the placement state and the data
// shards' membership: the placement group's own membership and the data
// shards' leaderships, which the router reaches.
type Cluster interface {
	// PlacementMembership reads the placement group's Raft membership.
	PlacementMembership(ctx context.Context) (*placementv1.MembershipResponse, error)
	// ReplacePlacementVoter makes node to a voter of the placement group
	// in place of node old: to added as non-voting, started and caught up,
	// promoted, old removed; each step skipped when the membership shows
	// it done.
	ReplacePlacementVoter(ctx context.Context, old, to uint64) error
	// RemovePlacementMember removes node id from the placement group's
	// membership (a non-voting member, or a voter a forced removal leaves
	// without a replacement).
	RemovePlacementMember(ctx context.Context, id uint64) error
	// HandOffPlacement moves the placement group's leadership off node id
	// when it is local and leads, and reports whether it did (the caller
	// no longer leads, and leaves the job to the new leader).
	HandOffPlacement(ctx context.Context, id uint64) (bool, error)
	// Leaders returns the node leading each data shard (0: unknown).
	Leaders(ctx context.Context) map[uint64]uint64
	// TransferLeader moves shard's leadership to its replica on node.
	TransferLeader(ctx context.Context, shard, node uint64) error
}

// errHandedOff: the driver handed the placement leadership away; the new
// leader drives the job on.
var errHandedOff = errors.New("placement leadership handed off; the new leader goes on")

// BeginJob records a node removal or a rebalance (placement command
// version 7); Drive carries it out. A request id the job was begun with
// before returns that job instead.
func (o *Operators) BeginJob(ctx context.Context, c *placementv1.BeginJobCmd) (*placementv1.Operator, error) {
	res, err := o.Meta.Propose(ctx, &placementv1.Command{Command: &placementv1.Command_BeginJob{BeginJob: c}})
	if err != nil {
		return nil, err
	}
	return res.GetOperator(), nil
}

// failJob ends job id before it finished, with why.
func (o *Operators) failJob(ctx context.Context, id uint64, why string) error {
	if len(why) > maxJobError {
		why = why[:maxJobError]
	}
	o.logger().Warn("placement job failed", "operator", id, "err", why)
	_, err := o.Meta.Propose(ctx, &placementv1.Command{Command: &placementv1.Command_EndOperator{EndOperator: &placementv1.EndOperatorCmd{OperatorId: id, Error: why}}})
	return err
}

// driveJob carries job id to its end, one step at a time, each decided on
// the state read just before it: a step already begun (by this driver or
// an earlier one) is driven first, then the next is planned. A step that
// fails ends the job with an error; the steps made stay made.
func (o *Operators) driveJob(ctx context.Context, id uint64) error {
	for {
		st, err := o.Meta.Read(ctx)
		if err != nil {
			return err
		}
		job, _ := operatorByID(st, id)
		if job == nil {
			return nil // ended
		}
		// A step running, or a split or move begun on its own: it goes
		// first (one runs at a time).
		if busy := blocking(st, MetaCommandVersion); busy != nil {
			if err := o.drive(ctx, busy); err != nil {
				return err
			}
			if err := sleep(ctx, 50*time.Millisecond); err != nil { // driven elsewhere: wait for it
				return err
			}
			continue
		}
		if s := lastStep(job); s.GetState() == placementv1.JobStepState_JOB_STEP_STATE_FAILED && s.GetOperatorId() != 0 {
			return o.failJob(ctx, id, fmt.Sprintf("operation %d (%s of shard %d) failed: %s", s.GetOperatorId(), ActionKind(s.GetKind()), s.GetShard(), s.GetError()))
		}
		if r := job.GetRemoveNode(); r != nil {
			err = o.removalStep(ctx, st, job, r)
		} else {
			err = o.rebalanceStep(ctx, st, job)
		}
		if err != nil {
			return err
		}
	}
}

// lastStep returns job's last step, or nil.
func lastStep(job *placementv1.Operator) *placementv1.JobStep {
	if n := len(job.GetSteps()); n > 0 {
		return job.GetSteps()[n-1]
	}
	return nil
}

// removalStep makes the next step of removal job r: a move of the next
// replica off its node (PlanRemoval on the state of now), then the
// placement group vote, then the map.
func (o *Operators) removalStep(ctx context.Context, st *placementv1.State, job *placementv1.Operator, r *placementv1.RemoveNodeOp) error {
	advance := func(to placementv1.RemoveNodeStep) error {
		_, err := o.Meta.Propose(ctx, &placementv1.Command{Command: &placementv1.Command_AdvanceJob{AdvanceJob: &placementv1.AdvanceJobCmd{OperatorId: job.GetId(), RemoveStep: to}}})
		return err
	}
	node := r.GetNodeId()
	switch r.GetStep() {
	case placementv1.RemoveNodeStep_REMOVE_NODE_STEP_MOVING:
		plan, err := PlanRemoval(st, node, o.Live, r.GetForce())
		if err != nil {
			return o.failJob(ctx, job.GetId(), err.Error())
		}
		if len(plan) == 0 {
			return advance(placementv1.RemoveNodeStep_REMOVE_NODE_STEP_REPLICAS_MOVED)
		}
		return o.beginStep(ctx, job.GetId(), plan[0])
	case placementv1.RemoveNodeStep_REMOVE_NODE_STEP_REPLICAS_MOVED:
		m, err := o.Cluster.PlacementMembership(ctx)
		if err != nil {
			return err
		}
		voting, member := IsMember(m, node)
		if voting || member {
			// Its own leader cannot remove it and go on: hand over first.
			if handed, err := o.Cluster.HandOffPlacement(ctx, node); err != nil || handed {
				return cmpErr(err, errHandedOff)
			}
		}
		switch to := r.GetPlacementNodeId(); {
		case voting && to != 0:
			err = o.Cluster.ReplacePlacementVoter(ctx, node, to)
		case voting && !r.GetForce():
			return o.failJob(ctx, job.GetId(), fmt.Sprintf("node %d votes in the placement group and no node was chosen to take its place", node))
		case member:
			err = o.Cluster.RemovePlacementMember(ctx, node)
		}
		if err != nil {
			return err
		}
		return advance(placementv1.RemoveNodeStep_REMOVE_NODE_STEP_PLACEMENT_LEFT)
	case placementv1.RemoveNodeStep_REMOVE_NODE_STEP_PLACEMENT_LEFT:
		if err := advance(placementv1.RemoveNodeStep_REMOVE_NODE_STEP_REMOVED); err != nil {
			return err
		}
		o.logger().Info("node removed", "operator", job.GetId(), "node", node, "placement_replacement", r.GetPlacementNodeId())
		return nil
	}
	return fmt.Errorf("removal %d: unknown step %v", job.GetId(), r.GetStep())
}

// cmpErr is err, or other when err is nil.
func cmpErr(err, other error) error {
	if err != nil {
		return err
	}
	return other
}

// rebalanceStep makes the next step of rebalance job: a voter of the
// placement group added in a zone without one (PlanPlacementVoter), else
// the first of PlanRebalance on the state and leaders of now, leaving out
// what this job failed at already (a voter's node, a shard's
// leadership); with nothing left the job ends. It fails after twice its
// planned steps and as many again as there are shards and zones: a plan
// that does not settle.
func (o *Operators) rebalanceStep(ctx context.Context, st *placementv1.State, job *placementv1.Operator) error {
	if limit := 2*int(job.GetRebalance().GetPlanned()) + len(st.GetShards()) + Replicas; len(job.GetSteps()) >= limit {
		return o.failJob(ctx, job.GetId(), fmt.Sprintf("the plan did not settle after %d steps", len(job.GetSteps())))
	}
	leaders := o.Cluster.Leaders(ctx)
	failedVoter := map[uint64]bool{}
	for _, s := range job.GetSteps() {
		if s.GetState() != placementv1.JobStepState_JOB_STEP_STATE_FAILED {
			continue
		}
		switch s.GetKind() {
		case placementv1.JobStepKind_JOB_STEP_KIND_TRANSFER_LEADER:
			leaders[s.GetShard()] = 0 // not tried again
		case placementv1.JobStepKind_JOB_STEP_KIND_ADD_PLACEMENT_VOTER:
			failedVoter[s.GetToNode()] = true
		}
	}
	m, err := o.Cluster.PlacementMembership(ctx)
	if err != nil {
		return err
	}
	live := func(id uint64) bool { return !failedVoter[id] && (o.Live == nil || o.Live(id)) }
	if to := PlanPlacementVoter(st, m, live); to != 0 {
		step := &placementv1.JobStep{Kind: placementv1.JobStepKind_JOB_STEP_KIND_ADD_PLACEMENT_VOTER, ToNode: to, State: placementv1.JobStepState_JOB_STEP_STATE_DONE}
		if err := o.Cluster.ReplacePlacementVoter(ctx, 0, to); err != nil {
			if ctx.Err() != nil {
				return err
			}
			step.State, step.Error = placementv1.JobStepState_JOB_STEP_STATE_FAILED, err.Error()
		}
		return o.recordStep(ctx, job.GetId(), step)
	}
	plan := PlanRebalance(st, leaders, o.Live)
	if len(plan) == 0 {
		_, err := o.Meta.Propose(ctx, &placementv1.Command{Command: &placementv1.Command_EndOperator{EndOperator: &placementv1.EndOperatorCmd{OperatorId: job.GetId()}}})
		if err == nil {
			o.logger().Info("rebalance done", "operator", job.GetId(), "steps", len(job.GetSteps()))
		}
		return err
	}
	a := plan[0]
	if a.Kind != "transfer_leader" {
		return o.beginStep(ctx, job.GetId(), a)
	}
	step := &placementv1.JobStep{Kind: placementv1.JobStepKind_JOB_STEP_KIND_TRANSFER_LEADER, Shard: a.Shard, FromNode: a.From, ToNode: a.To,
		State: placementv1.JobStepState_JOB_STEP_STATE_DONE}
	if err := o.Cluster.TransferLeader(ctx, a.Shard, a.To); err != nil {
		if ctx.Err() != nil {
			return err
		}
		step.State, step.Error = placementv1.JobStepState_JOB_STEP_STATE_FAILED, err.Error()
	}
	return o.recordStep(ctx, job.GetId(), step)
}

// recordStep appends step, which is no operator, to job's steps.
func (o *Operators) recordStep(ctx context.Context, job uint64, step *placementv1.JobStep) error {
	_, err := o.Meta.Propose(ctx, &placementv1.Command{Command: &placementv1.Command_AdvanceJob{AdvanceJob: &placementv1.AdvanceJobCmd{OperatorId: job, Step: step}}})
	return err
}

// beginStep begins the move that carries out action a as a step of job;
// the next pass of driveJob drives it. A refusal ends the job: the state
// it was planned on no longer allows it, or a voter of the shard is down
// while the step would move a live replica (voterDown, as for BeginMove).
func (o *Operators) beginStep(ctx context.Context, job uint64, a Action) error {
	err := o.voterDown(ctx, a.Shard, a.From, "")
	if err == nil {
		_, err = o.Meta.Propose(ctx, &placementv1.Command{Command: &placementv1.Command_BeginMove{BeginMove: &placementv1.BeginMoveCmd{
			Shard: a.Shard, FromNode: a.From, ToNode: a.To, Parent: job}}})
	}
	var refused *RefusedError
	if errors.As(err, &refused) && !strings.Contains(refused.Reason, busyReason) {
		return o.failJob(ctx, job, fmt.Sprintf("%s of shard %d refused: %s", a.Kind, a.Shard, refused.Reason))
	}
	return err
}

// ActionKind names a job step's kind as Action.Kind and the API do
// ("move_replica").
func ActionKind(k placementv1.JobStepKind) string {
	switch k {
	case placementv1.JobStepKind_JOB_STEP_KIND_ADD_REPLICA:
		return "add_replica"
	case placementv1.JobStepKind_JOB_STEP_KIND_DROP_REPLICA:
		return "drop_replica"
	case placementv1.JobStepKind_JOB_STEP_KIND_TRANSFER_LEADER:
		return "transfer_leader"
	case placementv1.JobStepKind_JOB_STEP_KIND_ADD_PLACEMENT_VOTER:
		return "add_placement_voter"
	}
	return "move_replica"
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
