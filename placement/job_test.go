package placement

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

func jobCmd(c *placementv1.BeginJobCmd) *placementv1.Command {
	return &placementv1.Command{Version: 7, Command: &placementv1.Command_BeginJob{BeginJob: c}}
}

func removalJob(node, placementNode uint64, force bool, requestID string) *placementv1.Command {
	return jobCmd(&placementv1.BeginJobCmd{RequestId: requestID, Job: &placementv1.BeginJobCmd_RemoveNode{RemoveNode: &placementv1.RemoveNodeOp{
		NodeId: node, Force: force, PlacementNodeId: placementNode}}})
}

func rebalanceJob(planned uint32) *placementv1.Command {
	return jobCmd(&placementv1.BeginJobCmd{Job: &placementv1.BeginJobCmd_Rebalance{Rebalance: &placementv1.RebalanceOp{Planned: planned}}})
}

func stepMove(v uint32, shard, from, to, parent uint64) *placementv1.Command {
	return &placementv1.Command{Version: v, Command: &placementv1.Command_BeginMove{BeginMove: &placementv1.BeginMoveCmd{Shard: shard, FromNode: from, ToNode: to, Parent: parent}}}
}

func advanceRemoval(op uint64, to placementv1.RemoveNodeStep) *placementv1.Command {
	return &placementv1.Command{Version: 7, Command: &placementv1.Command_AdvanceJob{AdvanceJob: &placementv1.AdvanceJobCmd{OperatorId: op, RemoveStep: to}}}
}

func endJobCmd(op uint64, why string, rollback bool) *placementv1.Command {
	return &placementv1.Command{Version: 7, Command: &placementv1.Command_EndOperator{EndOperator: &placementv1.EndOperatorCmd{OperatorId: op, Error: why, Rollback: rollback}}}
}

// replicaNodes lists the nodes hosting shard id's replicas in st.
func replicaNodes(st *placementv1.State, id uint64) []uint64 {
	var out []uint64
	for _, r := range shardByID(st, id).GetReplicas() {
		out = append(out, r.GetNodeId())
	}
	return out
}

// The rules Apply holds a node removal to, one step at a time: one job at
// a time, named by its request id; its moves one at a time, each recorded
// in it with its outcome; a node being removed takes no replica; the node
// leaves the map only once it hosts none, after its placement vote; a
// removal ends without an error only by leaving, and is never rolled
// back.
func TestRemovalJobRules(t *testing.T) {
	st := movesState(t) // nodes 1-3 in az1-az3, node 4 in az1; shards 1 and 2 on nodes 1-3
	st = mustApply(t, st, removalJob(1, 4, false, "drain-1"))
	job := st.GetOperators()[0]
	if r := job.GetRemoveNode(); r.GetReplicas() != 2 || r.GetStep() != placementv1.RemoveNodeStep_REMOVE_NODE_STEP_MOVING || job.GetRequestId() != "drain-1" {
		t.Fatalf("begun: %v", job)
	}
	id := job.GetId()
	if _, res := ApplyMeta(st, removalJob(1, 4, false, "drain-1")); res.GetOperator().GetId() != id || res.GetError() != "" {
		t.Fatalf("the same request id again: %v", res)
	}
	for cmd, want := range map[*placementv1.Command]string{
		removalJob(2, 0, false, ""):            "one node removal or rebalance runs at a time",
		rebalanceJob(1):                        "one node removal or rebalance runs at a time",
		stepMove(7, 2, 2, 1, 0):                "node 1 is being removed",
		stepMove(7, 1, 1, 0, id):               "no forced removal of node 1",
		stepMove(7, 1, 0, 4, id):               "only a rebalance adds a replica",
		stepMove(7, 1, 1, 4, 99):               "parent: no node removal or rebalance 99",
		advanceRemoval(id, 2):                  "node 1 still hosts a replica of shard 1",
		advanceRemoval(id, 3):                  "cannot go to REMOVE_NODE_STEP_PLACEMENT_LEFT",
		endJobCmd(id, "", false):               "not done",
		endJobCmd(id, "", true):                "not rolled back",
		endJobCmd(job.GetId()+100, "x", false): "is not in progress",
	} {
		if got := refusal(st, cmd); !strings.Contains(got, want) {
			t.Errorf("%v: refused with %q, want %q", cmd, got, want)
		}
	}
	if got := refusal(st, removalJob(2, 0, false, "drain-1")); !strings.Contains(got, "names operation") {
		t.Fatalf("the request id of another job: %q", got)
	}
	if got := refusal(st, removalJob(1, 4, true, "drain-1")); !strings.Contains(got, "names operation") {
		t.Fatalf("the request id of the removal, forced this time: %q", got)
	}

	// A move begun on its own still runs beside the job (version 7), not
	// below version 7, where any operator in progress keeps it out.
	if got := refusal(st, stepMove(6, 2, 2, 4, 0)); !strings.Contains(got, busyReason) {
		t.Fatalf("a version 6 move beside a job: %q", got)
	}
	if got := refusal(st, stepMove(7, 2, 2, 4, 0)); !strings.Contains(got, "zone") {
		t.Fatalf("a version 7 move beside a job is judged on its own (node 4 is in az1, shard 2 has az1 on node 1): %q", got)
	}

	st = mustApply(t, st, stepMove(7, 1, 1, 4, id))
	child := st.GetOperators()[1].GetId()
	if s := st.GetOperators()[0].GetSteps(); len(s) != 1 || s[0].GetOperatorId() != child || s[0].GetState() != placementv1.JobStepState_JOB_STEP_STATE_RUNNING ||
		s[0].GetKind() != placementv1.JobStepKind_JOB_STEP_KIND_MOVE {
		t.Fatalf("the job's steps after its first move began: %v", s)
	}
	if got := refusal(st, stepMove(7, 2, 1, 4, id)); !strings.Contains(got, busyReason) {
		t.Fatalf("a second step while the first runs: %q", got)
	}
	st = endMove(t, st, child, 7)
	if s := st.GetOperators()[0].GetSteps()[0]; s.GetState() != placementv1.JobStepState_JOB_STEP_STATE_DONE {
		t.Fatalf("the step after its move ended: %v", s)
	}
	st = endMove(t, mustApply(t, st, stepMove(7, 2, 1, 4, id)), child+1, 7)
	for _, to := range []placementv1.RemoveNodeStep{2, 3} {
		st = mustApply(t, st, advanceRemoval(id, to))
	}
	if nodeByID(st, 1) == nil {
		t.Fatal("node 1 left the map before its last step")
	}
	st = mustApply(t, st, advanceRemoval(id, placementv1.RemoveNodeStep_REMOVE_NODE_STEP_REMOVED))
	done, running := FindOperator(st, id, "")
	if running || nodeByID(st, 1) != nil || !slices.Contains(st.GetRemovedNodeIds(), 1) || done.GetError() != "" || len(st.GetOperators()) != 0 {
		t.Fatalf("after the removal: job %v (running %v), nodes %v, removed %v", done, running, st.GetNodes(), st.GetRemovedNodeIds())
	}
	if fmt.Sprint(replicaNodes(st, 1), replicaNodes(st, 2)) != "[2 3 4] [2 3 4]" {
		t.Fatalf("replicas after the removal: %v %v", replicaNodes(st, 1), replicaNodes(st, 2))
	}

	// A job ended with an error is kept with it; its moves stay made.
	failed := mustApply(t, movesState(t), removalJob(1, 4, false, ""))
	failed = mustApply(t, failed, endJobCmd(failed.GetOperators()[0].GetId(), "operation 9 rolled back", false))
	if f := failed.GetFinishedOperators(); len(f) != 1 || f[0].GetError() != "operation 9 rolled back" || len(failed.GetOperators()) != 0 {
		t.Fatalf("ended with an error: %v", f)
	}
}

// A forced removal drops a replica that has no place (never below two
// replicas), and a rebalance adds one back in the zone that lacks it once
// a node is there (never above three, never two in a zone).
func TestForcedRemovalAndRepairRules(t *testing.T) {
	st := movesState(t)
	st = mustApply(t, st, removalJob(3, 0, true, ""))
	id := st.GetOperators()[0].GetId()
	st = mustApply(t, st, stepMove(7, 1, 3, 0, id))
	drop := st.GetOperators()[1]
	if m := drop.GetMove(); m.GetToReplica() != 0 || m.GetFromReplica() != 3 || st.GetOperators()[0].GetSteps()[0].GetKind() != placementv1.JobStepKind_JOB_STEP_KIND_DROP_REPLICA {
		t.Fatalf("the drop: %v, steps %v", drop, st.GetOperators()[0].GetSteps())
	}
	st = endMove(t, st, drop.GetId(), 7)
	if got := replicaNodes(st, 1); fmt.Sprint(got) != "[1 2]" {
		t.Fatalf("shard 1 after the drop: %v", got)
	}
	if err := CheckMap(st); err != nil {
		t.Fatal(err)
	}
	// Node 3 leaves once shard 2's replica is dropped too.
	st = endMove(t, mustApply(t, st, stepMove(7, 2, 3, 0, id)), drop.GetId()+1, 7)
	for _, to := range []placementv1.RemoveNodeStep{2, 3, 4} {
		st = mustApply(t, st, advanceRemoval(id, to))
	}
	// A second forced removal may not leave a shard with one replica.
	st = mustApply(t, st, removalJob(2, 0, true, ""))
	if got := refusal(st, stepMove(7, 1, 2, 0, st.GetOperators()[0].GetId())); !strings.Contains(got, "fewer than 2 replicas") {
		t.Fatalf("dropping a shard's second to last replica: %q", got)
	}
	st = mustApply(t, st, endJobCmd(st.GetOperators()[0].GetId(), "given up", false))

	// Node 5 joins in az3; a rebalance adds each shard's third replica there.
	st = mustApply(t, st, &placementv1.Command{Command: &placementv1.Command_RegisterNode{RegisterNode: &placementv1.RegisterNodeCmd{
		Node: &placementv1.Node{Id: 5, Zone: "az3", RaftAddr: "r5", ListenAddr: "l5", MetaCommandVersion: MetaCommandVersion}}}})
	plan := PlanRebalance(st, nil, nil)
	if fmt.Sprint(plan[:2]) != "[{add_replica 1 0 5} {add_replica 2 0 5}]" {
		t.Fatalf("the repair plan: %v", plan)
	}
	st = mustApply(t, st, rebalanceJob(uint32(len(plan))))
	rb := st.GetOperators()[0].GetId()
	for cmd, want := range map[*placementv1.Command]string{
		stepMove(7, 1, 0, 4, rb): `zone "az1" already has a replica`,
		stepMove(7, 1, 0, 3, rb): "node 3 does not exist",
		stepMove(7, 1, 1, 0, rb): "no forced removal",
		stepMove(7, 1, 0, 5, 0):  "from_node_id: node 0 has no replica",
	} {
		if got := refusal(st, cmd); !strings.Contains(got, want) {
			t.Errorf("%v: refused with %q, want %q", cmd, got, want)
		}
	}
	st = mustApply(t, st, stepMove(7, 1, 0, 5, rb))
	add := st.GetOperators()[1].GetId()
	st = endMove(t, st, add, 7)
	if got := replicaNodes(st, 1); fmt.Sprint(got) != "[1 2 5]" {
		t.Fatalf("shard 1 after the add: %v", got)
	}
	if got := refusal(st, stepMove(7, 1, 0, 5, rb)); !strings.Contains(got, "already hosts") && !strings.Contains(got, "replicas already") {
		t.Fatalf("adding to a shard that has its replicas: %q", got)
	}
	st = mustApply(t, st, endJobCmd(rb, "", false))
	if f := st.GetFinishedOperators(); f[len(f)-1].GetSteps()[0].GetState() != placementv1.JobStepState_JOB_STEP_STATE_DONE {
		t.Fatalf("the rebalance's step: %v", f[len(f)-1])
	}
}

// Jobs are placement command version 7: never proposed, nor applied,
// while a node registered a binary that applies less.
func TestJobsNeedVersion7(t *testing.T) {
	for _, cmd := range []*placementv1.Command{removalJob(1, 0, false, ""), rebalanceJob(0), stepMove(7, 1, 1, 4, 3), endJobCmd(3, "x", false),
		{Version: 7, Command: &placementv1.Command_AdvanceJob{AdvanceJob: &placementv1.AdvanceJobCmd{OperatorId: 3}}}} {
		unstamped := proto.CloneOf(cmd)
		unstamped.Version = 0
		if v := MetaVersionOf(unstamped); v != 7 {
			t.Errorf("%v needs version %d, want 7", cmd, v)
		}
		old := movesState(t)
		old.Nodes[2].MetaCommandVersion = 6
		if err := Proposable(old, cmd); !errors.Is(err, ErrMetaVersion) {
			t.Errorf("%v beside a version 6 node: %v", cmd, err)
		}
		if got := refusal(old, cmd); !strings.Contains(got, "applies only up to 6") {
			t.Errorf("%v applied beside a version 6 node: %q", cmd, got)
		}
	}
}

// jobShards is a ShardClient over many shards: each shard's membership
// starts as the replicas the placement state gave it when first asked,
// and changes as a shard's do. Reads answer applied index applied; every
// replica has applied caughtUp.
type jobShards struct {
	meta *memMeta

	mu                sync.Mutex
	members           map[uint64]map[uint64]bool // shard → replica → voting
	log               []string
	applied, caughtUp uint64
}

func (f *jobShards) Propose(context.Context, uint64, *shardv1.Envelope) (*shardv1.Result, error) {
	return &shardv1.Result{Code: shardv1.Code_CODE_OK}, nil
}

func (f *jobShards) Read(context.Context, uint64, *shardv1.Query) (*shardv1.QueryResult, error) {
	return &shardv1.QueryResult{AppliedIndex: f.applied, Meta: &shardv1.ShardMeta{}}, nil
}

func (f *jobShards) AppliedIndex(context.Context, uint64, uint64) (uint64, error) {
	return f.caughtUp, nil
}

func (f *jobShards) Membership(_ context.Context, req *placementv1.MembershipRequest) (*placementv1.MembershipResponse, error) {
	st, _ := f.meta.Read(context.Background())
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.members == nil {
		f.members = map[uint64]map[uint64]bool{}
	}
	m := f.members[req.GetShardId()]
	if m == nil {
		m = map[uint64]bool{}
		for _, r := range shardByID(st, req.GetShardId()).GetReplicas() {
			if !r.GetNonVoting() {
				m[r.GetReplicaId()] = true
			}
		}
		f.members[req.GetShardId()] = m
	}
	switch c := req.GetChange(); c {
	case placementv1.MembershipChange_MEMBERSHIP_CHANGE_ADD_NON_VOTING:
		m[req.GetReplicaId()] = false
	case placementv1.MembershipChange_MEMBERSHIP_CHANGE_ADD_VOTING:
		m[req.GetReplicaId()] = true
	case placementv1.MembershipChange_MEMBERSHIP_CHANGE_REMOVE:
		delete(m, req.GetReplicaId())
	}
	if c := req.GetChange(); c != placementv1.MembershipChange_MEMBERSHIP_CHANGE_NONE {
		f.log = append(f.log, fmt.Sprintf("shard %d: %v %d", req.GetShardId(), strings.TrimPrefix(c.String(), "MEMBERSHIP_CHANGE_"), req.GetReplicaId()))
	}
	out := &placementv1.MembershipResponse{Voting: map[uint64]string{}, NonVoting: map[uint64]string{}}
	for r, voting := range m {
		if voting {
			out.Voting[r] = ""
		} else {
			out.NonVoting[r] = ""
		}
	}
	return out, nil
}

// jobCluster is a Cluster whose placement group's voters start as nodes
// 1 to 3, recording what the jobs ask of it.
type jobCluster struct {
	mu      sync.Mutex
	voters  map[uint64]bool
	leaders map[uint64]uint64
	log     []string
}

func (c *jobCluster) PlacementMembership(context.Context) (*placementv1.MembershipResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := &placementv1.MembershipResponse{Voting: map[uint64]string{}}
	for v := range c.voters {
		out.Voting[v] = ""
	}
	return out, nil
}

func (c *jobCluster) ReplacePlacementVoter(_ context.Context, old, to uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.voters, old)
	c.voters[to] = true
	c.log = append(c.log, fmt.Sprintf("placement: node %d votes for node %d", to, old))
	return nil
}

func (c *jobCluster) RemovePlacementMember(_ context.Context, id uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.voters, id)
	c.log = append(c.log, fmt.Sprintf("placement: node %d removed", id))
	return nil
}

func (c *jobCluster) HandOffPlacement(context.Context, uint64) (bool, error) { return false, nil }

func (c *jobCluster) Leaders(context.Context) map[uint64]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.leaders)
}

func (c *jobCluster) TransferLeader(_ context.Context, shard, node uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leaders[shard] = node
	c.log = append(c.log, fmt.Sprintf("shard %d: led from node %d", shard, node))
	return nil
}

// jobRig is a placement group (bootstrapped on nodes 1 to 3, zones az1
// to az3, with shard 2 split off) and the operators that drive its jobs.
func jobRig(t *testing.T) (*Operators, *jobShards, *jobCluster) {
	t.Helper()
	meta := &memMeta{st: movesState(t)}
	meta.st.Nodes = slices.DeleteFunc(meta.st.Nodes, func(n *placementv1.Node) bool { return n.GetId() == 4 })
	shards := &jobShards{meta: meta}
	cluster := &jobCluster{voters: map[uint64]bool{1: true, 2: true, 3: true}, leaders: map[uint64]uint64{1: 1, 2: 1}}
	return &Operators{Meta: meta, Shards: shards, Alloc: NewAllocator(meta), TargetWait: time.Second, Cluster: cluster}, shards, cluster
}

func (o *Operators) register(t *testing.T, id uint64, zone string) {
	t.Helper()
	if _, err := o.Meta.Propose(context.Background(), &placementv1.Command{Command: &placementv1.Command_RegisterNode{RegisterNode: &placementv1.RegisterNodeCmd{
		Node: &placementv1.Node{Id: id, Zone: zone, RaftAddr: fmt.Sprintf("r%d", id), ListenAddr: fmt.Sprintf("l%d", id), MetaCommandVersion: MetaCommandVersion}}}}); err != nil {
		t.Fatal(err)
	}
}

// runJob begins job c and drives it to its end; it returns the job as it
// ended and the placement state after.
func (o *Operators) runJob(t *testing.T, c *placementv1.Command) (*placementv1.Operator, *placementv1.State) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	op, err := o.BeginJob(ctx, c.GetBeginJob())
	if err != nil {
		t.Fatal(err)
	}
	last, err := o.Run(ctx, op.GetId())
	if err != nil {
		t.Fatal(err)
	}
	st, _ := o.Meta.Read(ctx)
	if err := CheckMap(st); err != nil {
		t.Fatal(err)
	}
	return last, st
}

// steps describes a job's steps.
func steps(job *placementv1.Operator) []string {
	var out []string
	for _, s := range job.GetSteps() {
		out = append(out, fmt.Sprintf("%s %d %d→%d %s", ActionKind(s.GetKind()), s.GetShard(), s.GetFromNode(), s.GetToNode(), strings.ToLower(strings.TrimPrefix(s.GetState().String(), "JOB_STEP_STATE_"))))
	}
	return out
}

// A removal driven to its end: node 1's replicas move to node 4 (its
// zone), one membership change at a time, node 1 (the leader of both
// shards) handing each shard's lead to node 4 before its replica is
// removed; node 4 takes its placement vote; node 1 leaves the map.
func TestRemovalJobRuns(t *testing.T) {
	o, shards, cluster := jobRig(t)
	o.register(t, 4, "az1")
	job, st := o.runJob(t, removalJob(1, 4, false, ""))
	if job.GetError() != "" || fmt.Sprint(steps(job)) != "[move_replica 1 1→4 done move_replica 2 1→4 done]" {
		t.Fatalf("the removal ended as %v, steps %v", job, steps(job))
	}
	if nodeByID(st, 1) != nil || fmt.Sprint(replicaNodes(st, 1), replicaNodes(st, 2)) != "[2 3 4] [2 3 4]" {
		t.Fatalf("after: nodes %v, replicas %v %v", st.GetNodes(), replicaNodes(st, 1), replicaNodes(st, 2))
	}
	want := []string{
		"shard 1: ADD_NON_VOTING 4", "shard 1: ADD_VOTING 4", "shard 1: REMOVE 1",
		"shard 2: ADD_NON_VOTING 5", "shard 2: ADD_VOTING 5", "shard 2: REMOVE 1",
	}
	if fmt.Sprint(shards.log) != fmt.Sprint(want) || fmt.Sprint(cluster.log) != "[shard 1: led from node 4 shard 2: led from node 4 placement: node 4 votes for node 1]" {
		t.Fatalf("membership changes %v, placement %v", shards.log, cluster.log)
	}
}

// A forced removal of the only node of az3 drops its replicas and its
// placement vote; once node 5 joins az3, a rebalance adds the replicas
// back there and spreads the leaders.
func TestForcedRemovalThenRebalance(t *testing.T) {
	o, shards, cluster := jobRig(t)
	job, st := o.runJob(t, removalJob(3, 0, true, ""))
	if job.GetError() != "" || fmt.Sprint(steps(job)) != "[drop_replica 1 3→0 done drop_replica 2 3→0 done]" {
		t.Fatalf("the forced removal ended as %v, steps %v", job, steps(job))
	}
	if fmt.Sprint(replicaNodes(st, 1), replicaNodes(st, 2)) != "[1 2] [1 2]" || fmt.Sprint(cluster.log) != "[placement: node 3 removed]" {
		t.Fatalf("after: replicas %v %v, placement %v", replicaNodes(st, 1), replicaNodes(st, 2), cluster.log)
	}
	o.register(t, 5, "az3")
	shards.log = nil
	job, st = o.runJob(t, rebalanceJob(3))
	if job.GetError() != "" || fmt.Sprint(steps(job)) != "[add_placement_voter 0 0→5 done add_replica 1 0→5 done add_replica 2 0→5 done transfer_leader 2 1→2 done]" {
		t.Fatalf("the rebalance ended as %v, steps %v", job, steps(job))
	}
	if fmt.Sprint(replicaNodes(st, 1), replicaNodes(st, 2)) != "[1 2 5] [1 2 5]" {
		t.Fatalf("after: replicas %v %v", replicaNodes(st, 1), replicaNodes(st, 2))
	}
	if fmt.Sprint(shards.log) != "[shard 1: ADD_NON_VOTING 4 shard 1: ADD_VOTING 4 shard 2: ADD_NON_VOTING 5 shard 2: ADD_VOTING 5]" ||
		fmt.Sprint(cluster.log) != "[placement: node 3 removed placement: node 5 votes for node 0 shard 2: led from node 2]" {
		t.Fatalf("membership changes %v, placement %v", shards.log, cluster.log)
	}
}

// A step that fails ends the job with an error naming it: node 4's new
// replica never catches up, the move rolls back, and the removal stops
// there with node 1 still in the map and hosting its replica.
func TestRemovalJobFailsWithItsStep(t *testing.T) {
	o, shards, _ := jobRig(t)
	o.register(t, 4, "az1")
	shards.applied = 10 // the leader's; the new replica stays at 0
	o.TargetWait = 100 * time.Millisecond
	job, st := o.runJob(t, removalJob(1, 4, false, "drain"))
	if !strings.Contains(job.GetError(), "rolled back") || fmt.Sprint(steps(job)) != "[move_replica 1 1→4 failed]" {
		t.Fatalf("the removal ended as %v, steps %v", job, steps(job))
	}
	if nodeByID(st, 1) == nil || fmt.Sprint(replicaNodes(st, 1)) != "[1 2 3]" || len(st.GetOperators()) != 0 {
		t.Fatalf("after: nodes %v, replicas %v, operators %v", st.GetNodes(), replicaNodes(st, 1), st.GetOperators())
	}
	if again, _ := FindOperator(st, 0, "drain"); !proto.Equal(again, job) {
		t.Fatalf("the request id finds %v, not the job that failed", again)
	}
}

// A removal of live node 1 while node 3, a voter of its shards, is down
// ends at its first step with an error naming node 3, having changed no
// membership: the step would have needed every other node up until it
// ended (fault 3 of issue 41; BeginMove refuses the same).
func TestRemovalJobRefusedWithVoterDown(t *testing.T) {
	o, shards, _ := jobRig(t)
	o.register(t, 4, "az1")
	o.Live = nodeIs(3)
	job, st := o.runJob(t, removalJob(1, 4, false, ""))
	if !strings.Contains(job.GetError(), "voter on node 3 does not answer") || len(shards.log) != 0 {
		t.Fatalf("the removal ended as %v, steps %v, membership changes %v", job, steps(job), shards.log)
	}
	if nodeByID(st, 1) == nil || fmt.Sprint(replicaNodes(st, 1)) != "[1 2 3]" || len(st.GetOperators()) != 0 {
		t.Fatalf("after: nodes %v, replicas %v, operators %v", st.GetNodes(), replicaNodes(st, 1), st.GetOperators())
	}
}

// FuzzJobCommands applies arbitrary version 7 commands to a state with a
// node removal and its move in progress: Apply never panics, and every
// state it makes keeps the map whole and each job's steps bounded.
func FuzzJobCommands(f *testing.F) {
	for _, c := range []*placementv1.Command{
		removalJob(2, 0, true, "r"), rebalanceJob(2), stepMove(7, 2, 1, 4, 3), stepMove(7, 1, 0, 4, 3), stepMove(7, 2, 1, 0, 3),
		advanceRemoval(3, 2), endJobCmd(3, "why", false), endJobCmd(4, "", false),
		{Version: 7, Command: &placementv1.Command_AdvanceJob{AdvanceJob: &placementv1.AdvanceJobCmd{OperatorId: 3, Step: &placementv1.JobStep{Kind: 4, State: 2}}}},
	} {
		b, _ := proto.Marshal(c)
		f.Add(b)
	}
	base := movesState(f)
	base, _ = ApplyMeta(base, removalJob(1, 4, false, ""))
	base, _ = ApplyMeta(base, stepMove(7, 1, 1, 4, 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		cmd := &placementv1.Command{}
		if proto.Unmarshal(b, cmd) != nil {
			return
		}
		cmd.Version = 7
		st, _ := ApplyMeta(base, cmd)
		if err := CheckMap(st); err != nil {
			t.Fatalf("%v made a broken map: %v", cmd, err)
		}
		for _, op := range st.GetOperators() {
			if len(op.GetSteps()) > maxJobSteps {
				t.Fatalf("operator %d has %d steps", op.GetId(), len(op.GetSteps()))
			}
		}
	})
}
