package placement

import (
	"errors"
	"fmt"
	"slices"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// Jobs (placement command version 7) are operators whose steps are
// other operators: a node removal moves the node's replicas off one move
// at a time and then takes the node out, a rebalance adds, moves and
// transfers one step at a time. Each step a job begins is recorded in
// the job (Operator.steps) in the same entry that begins it, and its
// outcome in the entry that ends it, so a new placement leader resumes a
// job from the state alone. One job runs at a time, beside at most one
// split or move: its own running step, or one begun on its own.

// Replicas is how many replicas a shard has, one per zone: a replica is
// added (a job's step) only to a shard with fewer.
const Replicas = 3

// minReplicas is the fewest replicas a forced removal leaves a shard:
// with one, a single failure loses the shard's data.
const minReplicas = 2

// busyReason ends the refusal of a split or move while another runs (a
// job's driver waits rather than fail).
const busyReason = "one split or move runs at a time"

// maxJobSteps bounds the steps one job takes (and the state it holds).
const maxJobSteps = 4096

// isJob reports whether op is a job (a node removal or a rebalance).
func isJob(op *placementv1.Operator) bool {
	return op.GetRemoveNode() != nil || op.GetRebalance() != nil
}

// blocking returns the operator in progress that keeps a split or move
// proposed at version v from beginning, or nil: below version 7 any
// operator, from version 7 a split or move (a job's own steps run beside
// it).
func blocking(st *placementv1.State, v uint32) *placementv1.Operator {
	for _, op := range st.GetOperators() {
		if v < 7 || !isJob(op) {
			return op
		}
	}
	return nil
}

// RangeOperator returns the split or move in progress, or nil: a map
// without one is quiescent (a job may run; its steps are moves).
func RangeOperator(st *placementv1.State) *placementv1.Operator {
	return blocking(st, MetaCommandVersion)
}

// NoSplitSince reports whether every operator begun from id on (up to
// st's next) is known, among those in progress and the last ended, to be
// a move or a job: then the ranges and the shards' records are as they
// were (a move changes a shard's replicas, not its records).
func NoSplitSince(st *placementv1.State, id uint64) bool {
	for ; id < st.GetNextOperatorId(); id++ {
		op, _ := FindOperator(st, id, "")
		if op == nil || op.GetSplit() != nil {
			return false
		}
	}
	return true
}

// runningJob returns the job in progress, or nil.
func runningJob(st *placementv1.State) *placementv1.Operator {
	for _, op := range st.GetOperators() {
		if isJob(op) {
			return op
		}
	}
	return nil
}

// removing returns the node removal of node id in progress, or nil.
func removing(st *placementv1.State, id uint64) *placementv1.Operator {
	if job := runningJob(st); job.GetRemoveNode() != nil && job.GetRemoveNode().GetNodeId() == id {
		return job
	}
	return nil
}

// stepParent returns the job that move c is to be a step of, or why it
// cannot be: the job must be in progress with no step running, a replica
// is added only by a rebalance, and dropped only by a forced removal of
// its node.
func stepParent(st *placementv1.State, c *placementv1.BeginMoveCmd) (*placementv1.Operator, error) {
	job, _ := operatorByID(st, c.GetParent())
	switch {
	case job == nil || !isJob(job):
		return nil, fmt.Errorf("parent: no node removal or rebalance %d is in progress", c.GetParent())
	case len(job.GetSteps()) >= maxJobSteps:
		return nil, fmt.Errorf("parent: operation %d has taken %d steps, the most one job takes", job.GetId(), maxJobSteps)
	case c.GetFromNode() == 0 && job.GetRebalance() == nil:
		return nil, fmt.Errorf("from_node_id: operation %d is no rebalance; only a rebalance adds a replica", job.GetId())
	case c.GetToNode() == 0 && (!job.GetRemoveNode().GetForce() || job.GetRemoveNode().GetNodeId() != c.GetFromNode()):
		return nil, fmt.Errorf("to_node_id: operation %d is no forced removal of node %d; only one drops a replica", job.GetId(), c.GetFromNode())
	}
	if s := runningStep(st, job); s != nil {
		return nil, fmt.Errorf("parent: operation %d's step, operation %d, is still running", job.GetId(), s.GetOperatorId())
	}
	return job, nil
}

// runningStep returns job's step whose move is still in progress, or nil.
func runningStep(st *placementv1.State, job *placementv1.Operator) *placementv1.JobStep {
	for _, s := range job.GetSteps() {
		if op, _ := operatorByID(st, s.GetOperatorId()); op != nil && s.GetOperatorId() != 0 {
			return s
		}
	}
	return nil
}

// moveKind is the kind of job step move m is.
func moveKind(m *placementv1.MoveOp) placementv1.JobStepKind {
	switch {
	case m.GetFromNode() == 0:
		return placementv1.JobStepKind_JOB_STEP_KIND_ADD_REPLICA
	case m.GetToNode() == 0:
		return placementv1.JobStepKind_JOB_STEP_KIND_DROP_REPLICA
	}
	return placementv1.JobStepKind_JOB_STEP_KIND_MOVE
}

// endStep records, in the job move op is a step of (if it is still in
// progress), how the move ended.
func endStep(st *placementv1.State, op *placementv1.Operator) {
	job, _ := operatorByID(st, op.GetParent())
	if job == nil || op.GetParent() == 0 {
		return
	}
	for _, s := range job.GetSteps() {
		if s.GetOperatorId() != op.GetId() {
			continue
		}
		s.State = placementv1.JobStepState_JOB_STEP_STATE_DONE
		if op.GetMove().GetRollingBack() {
			s.State, s.Error = placementv1.JobStepState_JOB_STEP_STATE_FAILED, "rolled back: the new replica did not catch up"
		}
	}
}

// endJob checks that job may end as c asks and records its error: a job
// is never rolled back (the steps it made stay made); it ends with an
// error at any time, and without one only when done.
func endJob(st *placementv1.State, job *placementv1.Operator, c *placementv1.EndOperatorCmd) error {
	switch {
	case c.GetRollback():
		return fmt.Errorf("rollback: operation %d is a job, which ends (with an error) but is not rolled back", job.GetId())
	case c.GetError() != "":
		if len(c.GetError()) > maxJobError {
			return fmt.Errorf("error: %d bytes, more than %d", len(c.GetError()), maxJobError)
		}
		job.Error = c.GetError()
	case job.GetRemoveNode() != nil:
		// A removal ends by reaching REMOVE_NODE_STEP_REMOVED (advanceJob).
		return fmt.Errorf("operator_id: the removal of node %d is at %v, not done", job.GetRemoveNode().GetNodeId(), job.GetRemoveNode().GetStep())
	case runningStep(st, job) != nil:
		return fmt.Errorf("operator_id: operation %d's step, operation %d, is still running", job.GetId(), runningStep(st, job).GetOperatorId())
	}
	return nil
}

// maxJobError bounds the error a job ends with, in bytes.
const maxJobError = 1024

// sameJob reports whether an operator is the job c asks for: a removal
// of the same node, forced alike, or a rebalance.
func sameJob(c *placementv1.BeginJobCmd) func(*placementv1.Operator) bool {
	return func(op *placementv1.Operator) bool {
		if r := c.GetRemoveNode(); r != nil {
			o := op.GetRemoveNode()
			return o != nil && o.GetNodeId() == r.GetNodeId() && o.GetForce() == r.GetForce()
		}
		return op.GetRebalance() != nil
	}
}

// beginJob records job c, one at a time. A removal's node must be in the
// map, and its replacement in the placement group (if named) another
// node of the same zone; the replicas it counts and the step it starts
// at are the state's, not the command's.
func beginJob(st *placementv1.State, c *placementv1.BeginJobCmd) (*placementv1.Result, error) {
	if job := runningJob(st); job != nil {
		return nil, fmt.Errorf("operation %d (%s) is in progress; one node removal or rebalance runs at a time", job.GetId(), describeOperator(job))
	}
	if st.GetGeneration() == 0 {
		return nil, errors.New("placement is not bootstrapped")
	}
	op := &placementv1.Operator{Id: st.NextOperatorId, RequestId: c.GetRequestId()}
	switch j := c.GetJob().(type) {
	case *placementv1.BeginJobCmd_RemoveNode:
		r := j.RemoveNode
		n := nodeByID(st, r.GetNodeId())
		if n == nil {
			return nil, fmt.Errorf("node_id: node %d is not in the map", r.GetNodeId())
		}
		if p := r.GetPlacementNodeId(); p != 0 {
			if pn := nodeByID(st, p); pn == nil || p == n.GetId() || pn.GetZone() != n.GetZone() {
				return nil, fmt.Errorf("placement_node_id: node %d is not another node of zone %q", p, n.GetZone())
			}
		}
		var replicas uint32
		for _, sh := range st.GetShards() {
			if slices.ContainsFunc(sh.GetReplicas(), func(rep *placementv1.Replica) bool { return rep.GetNodeId() == n.GetId() }) {
				replicas++
			}
		}
		op.Kind = &placementv1.Operator_RemoveNode{RemoveNode: &placementv1.RemoveNodeOp{NodeId: n.GetId(), Force: r.GetForce(),
			Step: placementv1.RemoveNodeStep_REMOVE_NODE_STEP_MOVING, PlacementNodeId: r.GetPlacementNodeId(), Replicas: replicas}}
	case *placementv1.BeginJobCmd_Rebalance:
		op.Kind = &placementv1.Operator_Rebalance{Rebalance: &placementv1.RebalanceOp{Planned: j.Rebalance.GetPlanned()}}
	default:
		return nil, errors.New("job: missing or unknown")
	}
	st.NextOperatorId++
	st.Operators = append(st.Operators, op)
	return &placementv1.Result{Operator: op}, nil
}

// advanceJob records c: a removal's next step, which must be the one
// after its current (it hosts no replica before REPLICAS_MOVED; REMOVED
// takes it out of the map and ends the job), or a rebalance's step that
// is no operator (a leadership transfer, a placement voter added).
func advanceJob(st *placementv1.State, c *placementv1.AdvanceJobCmd) error {
	job, i := operatorByID(st, c.GetOperatorId())
	if job == nil || !isJob(job) {
		return fmt.Errorf("operator_id: no node removal or rebalance %d is in progress", c.GetOperatorId())
	}
	if t := c.GetStep(); t != nil {
		kind := t.GetKind()
		switch {
		case job.GetRebalance() == nil:
			return fmt.Errorf("step: operation %d is no rebalance", job.GetId())
		case kind != placementv1.JobStepKind_JOB_STEP_KIND_TRANSFER_LEADER && kind != placementv1.JobStepKind_JOB_STEP_KIND_ADD_PLACEMENT_VOTER,
			t.GetOperatorId() != 0, t.GetState() == placementv1.JobStepState_JOB_STEP_STATE_RUNNING, t.GetState() == placementv1.JobStepState_JOB_STEP_STATE_UNSPECIFIED:
			return errors.New("step: a leadership transfer or a placement voter added, done or failed, with no operator")
		case len(job.GetSteps()) >= maxJobSteps:
			return fmt.Errorf("step: operation %d has taken %d steps, the most one job takes", job.GetId(), maxJobSteps)
		case len(t.GetError()) > maxJobError:
			return fmt.Errorf("step.error: %d bytes, more than %d", len(t.GetError()), maxJobError)
		}
		job.Steps = append(job.Steps, t)
		return nil
	}
	r := job.GetRemoveNode()
	to := c.GetRemoveStep()
	switch {
	case r == nil:
		return fmt.Errorf("remove_step: operation %d is no node removal", job.GetId())
	case to != r.GetStep()+1 || to > placementv1.RemoveNodeStep_REMOVE_NODE_STEP_REMOVED:
		return fmt.Errorf("remove_step: the removal of node %d is at %v, it cannot go to %v", r.GetNodeId(), r.GetStep(), to)
	case runningStep(st, job) != nil:
		return fmt.Errorf("remove_step: operation %d's step, operation %d, is still running", job.GetId(), runningStep(st, job).GetOperatorId())
	}
	switch to {
	case placementv1.RemoveNodeStep_REMOVE_NODE_STEP_REPLICAS_MOVED:
		for _, sh := range st.GetShards() {
			if slices.ContainsFunc(sh.GetReplicas(), func(rep *placementv1.Replica) bool { return rep.GetNodeId() == r.GetNodeId() }) {
				return fmt.Errorf("remove_step: node %d still hosts a replica of shard %d", r.GetNodeId(), sh.GetId())
			}
		}
	case placementv1.RemoveNodeStep_REMOVE_NODE_STEP_REMOVED:
		if err := removeNode(st, r.GetNodeId()); err != nil {
			return err
		}
		r.Step = to
		finish(st, i, 7)
		return nil
	}
	r.Step = to
	return nil
}
