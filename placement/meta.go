package placement

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// MetaShardID is the Raft shard id of the placement group (the "meta"
// shard). Data shard ids are allocated from 1 upwards and stay below it.
const MetaShardID uint64 = 1 << 32

// EpochWindow is how many epochs a placement leader reserves in one
// placement entry (the window TiKV PD's timestamp oracle persists ahead).
const EpochWindow = 32

// MetaCommandVersion is the newest placement command version this binary
// applies. Placement commands are versioned as data-shard envelopes are
// (shard.CommandVersion): a new command kind, or a changed rule for an
// existing one, takes the next version in metaKindVersions and raises
// this; ApplyMeta keeps the old rule for older entries.
//
// Version 2: BeginSplitCmd creates its target shard with
// ordered_config_change (membership changes compare-and-set).
//
// Version 3: AuthCmd (the auth state, State.auth).
//
// Version 4: RestoreCmd (a cluster restored from a backup).
//
// Version 5: RemoveNodeCmd (State.removed_node_ids, which RegisterNode
// refuses).
//
// Version 6: operations kept and named. EndOperatorCmd keeps the ended
// operator in State.finished_operators (the last 64); BeginSplitCmd and
// BeginMoveCmd take a request_id (needing version 6), and one that an
// operator in progress or kept has returns it instead of beginning
// another.
//
// Version 7: jobs. BeginJobCmd and AdvanceJobCmd (a node removal or a
// rebalance as an operator whose steps are moves); BeginMoveCmd's parent
// (a job's step, which may add a replica or, for a forced removal, drop
// one); EndOperatorCmd's error, and its recording of a move's outcome in
// its job. From version 7 a running job does not keep a split or move
// from beginning (only another split or move does), and a node being
// removed takes no new replica.
const MetaCommandVersion uint32 = 7

// finishedKept is how many ended operators the state keeps (version 6).
const finishedKept = 64

// MaxRequestID bounds an operation's request_id, in bytes.
const MaxRequestID = 128

// metaKindVersions is the version each command kind needs, by its field
// number in Command's oneof: the version in which it appeared. A kind
// missing here needs version 1.
var metaKindVersions = map[protoreflect.FieldNumber]uint32{
	9:  3, // auth
	10: 4, // restore
	11: 5, // remove_node
	12: 7, // begin_job
	13: 7, // advance_job
}

// MetaVersionOf returns the placement command version cmd needs.
func MetaVersionOf(cmd *placementv1.Command) uint32 {
	if cmd.GetBeginMove().GetParent() != 0 || cmd.GetEndOperator().GetError() != "" {
		return 7
	}
	if cmd.GetBeginSplit().GetRequestId() != "" || cmd.GetBeginMove().GetRequestId() != "" {
		return 6
	}
	m := cmd.ProtoReflect()
	if f := m.WhichOneof(m.Descriptor().Oneofs().ByName("command")); f != nil {
		if v, ok := metaKindVersions[f.Number()]; ok {
			return v
		}
	}
	return 1
}

// ErrMetaVersion: a placement command needs a newer version than this
// binary applies (Update stops the replica rather than diverge), or than
// some placement replica's node applies (it is not proposed yet).
var ErrMetaVersion = errors.New("placement: command version not applied by every replica")

// stampVersion returns a copy of cmd to propose to a placement group
// whose nodes all apply version cluster (clusterMetaVersion): stamped
// with cluster, so the newest rule every replica knows decides it. It is
// ErrMetaVersion if cmd needs more: the higher of the version it carries
// (a command passed on from a newer node) and MetaVersionOf's. A command
// of no kind this binary knows but with fields it does not know is a
// newer binary's, whose version it cannot tell: ErrMetaVersion too.
func stampVersion(cmd *placementv1.Command, cluster uint32) (*placementv1.Command, error) {
	if newerKind(cmd) {
		return nil, fmt.Errorf("%w: a command of a kind this binary does not know", ErrMetaVersion)
	}
	if _, ok := cmd.GetCommand().(*placementv1.Command_Restore); ok {
		// A restore creates the state, before any node has registered the
		// binary it runs (cluster is 1 then). A replica whose binary does
		// not know the version stops at it (metaSM.Update) rather than
		// apply something else, and on a state that exists a restore
		// changes nothing: it is proposed at this binary's version.
		cluster = MetaCommandVersion
	}
	if need := max(cmd.GetVersion(), MetaVersionOf(cmd)); need > cluster {
		return nil, fmt.Errorf("%w: the command needs version %d, every node applies %d", ErrMetaVersion, need, cluster)
	}
	out := proto.CloneOf(cmd)
	out.Version = cluster
	return out, nil
}

// Proposable reports whether cmd may be proposed to the placement group
// whose state is st: ErrMetaVersion (wrapped, saying which versions)
// while some node registered a binary that does not apply the version
// cmd needs. Callers that do work before proposing check it first.
func Proposable(st *placementv1.State, cmd *placementv1.Command) error {
	_, err := stampVersion(cmd, clusterMetaVersion(st))
	return err
}

// newerKind reports whether cmd's kind is unknown to this binary but
// present (its field is among the unknown ones): a newer binary's.
func newerKind(cmd *placementv1.Command) bool {
	return cmd.GetCommand() == nil && len(cmd.ProtoReflect().GetUnknown()) > 0
}

// clusterMetaVersion is the placement command version to propose at: the
// newest that this binary and every node of st apply (nodesMetaVersion).
func clusterMetaVersion(st *placementv1.State) uint32 {
	return min(MetaCommandVersion, nodesMetaVersion(st))
}

// nodesMetaVersion is the newest placement command version that every
// node of st registered a binary applying (a node that registered none
// applies version 1). Every node, not only the placement group's
// replicas, which the state does not list: stricter, and as safe. Before
// the bootstrap the state has no nodes, and the version is 1: the nodes
// that will start the first shard's replicas have not said which binary
// they run.
func nodesMetaVersion(st *placementv1.State) uint32 {
	if len(st.GetNodes()) == 0 {
		return 1
	}
	v := uint32(math.MaxUint32)
	for _, n := range st.GetNodes() {
		v = min(v, max(n.GetMetaCommandVersion(), 1))
	}
	return v
}

// ApplyMeta decides one placement command against st and returns the new
// state (st itself is never modified) and the result; a refused command
// returns st unchanged and a Result whose Error says why. It is pure, like
// shard.Apply: no clock, no randomness, no I/O.
func ApplyMeta(st *placementv1.State, cmd *placementv1.Command) (*placementv1.State, *placementv1.Result) {
	next := proto.CloneOf(st)
	res, err := applyMeta(next, cmd)
	if err != nil {
		return st, &placementv1.Result{Error: err.Error()}
	}
	return next, res
}

func applyMeta(st *placementv1.State, cmd *placementv1.Command) (*placementv1.Result, error) {
	// The proposer read the versions before proposing; a node that
	// registered an older binary since (a new node, a downgrade) would
	// start the shard a newer rule creates by its older one. Refusing by
	// the state the entry applies to closes that window on every replica
	// alike. Version 1 entries never meet it: no rule changed for them.
	_, restore := cmd.GetCommand().(*placementv1.Command_Restore)
	if v := cmd.GetVersion(); v > 1 && v > nodesMetaVersion(st) && !restore { // a restore: stampVersion
		return nil, fmt.Errorf("version: %d, but some node registered a binary that applies only up to %d", v, nodesMetaVersion(st))
	}
	ok := &placementv1.Result{}
	switch c := cmd.GetCommand().(type) {
	case *placementv1.Command_Bootstrap:
		return ok, bootstrap(st, c.Bootstrap)
	case *placementv1.Command_RegisterNode:
		return ok, registerNode(st, c.RegisterNode.GetNode())
	case *placementv1.Command_ReserveEpochs:
		return reserveEpochs(st, c.ReserveEpochs)
	case *placementv1.Command_BeginSplit:
		rid := requestID(c.BeginSplit.GetRequestId(), cmd.GetVersion())
		if op, err := requested(st, rid, sameSplit(c.BeginSplit)); op != nil || err != nil {
			return &placementv1.Result{Operator: op}, err
		}
		return beginSplit(st, c.BeginSplit, rid, cmd.GetVersion())
	case *placementv1.Command_AdvanceSplit:
		return ok, advanceSplit(st, c.AdvanceSplit)
	case *placementv1.Command_EndOperator:
		return ok, endOperator(st, c.EndOperator, cmd.GetVersion())
	case *placementv1.Command_BeginMove:
		rid := requestID(c.BeginMove.GetRequestId(), cmd.GetVersion())
		if op, err := requested(st, rid, sameMove(c.BeginMove)); op != nil || err != nil {
			return &placementv1.Result{Operator: op}, err
		}
		return beginMove(st, c.BeginMove, rid, cmd.GetVersion())
	case *placementv1.Command_AdvanceMove:
		return ok, advanceMove(st, c.AdvanceMove)
	case *placementv1.Command_Auth:
		return ok, applyAuth(st, c.Auth)
	case *placementv1.Command_Restore:
		return ok, applyRestore(st, c.Restore)
	case *placementv1.Command_RemoveNode:
		return ok, removeNode(st, c.RemoveNode.GetNodeId())
	case *placementv1.Command_BeginJob:
		if op, err := requested(st, c.BeginJob.GetRequestId(), sameJob(c.BeginJob)); op != nil || err != nil {
			return &placementv1.Result{Operator: op}, err
		}
		return beginJob(st, c.BeginJob)
	case *placementv1.Command_AdvanceJob:
		return ok, advanceJob(st, c.AdvanceJob)
	}
	return nil, errors.New("command: missing or unknown")
}

// ErrBootstrapped is the Error of a BootstrapCmd on a state that has a map.
var ErrBootstrapped = errors.New("placement is bootstrapped already")

func bootstrap(st *placementv1.State, c *placementv1.BootstrapCmd) error {
	if st.GetGeneration() != 0 {
		return ErrBootstrapped
	}
	if len(c.GetNodes()) == 0 {
		return errors.New("nodes: at least one is required")
	}
	first := &placementv1.Shard{Id: FirstDataShard, Epoch: 1, State: placementv1.ShardState_SHARD_STATE_ACTIVE}
	for _, n := range c.GetNodes() {
		if err := registerNode(st, n); err != nil {
			return err
		}
		if slices.ContainsFunc(first.Replicas, func(r *placementv1.Replica) bool { return r.GetNodeId() == n.GetId() }) {
			return fmt.Errorf("nodes: node %d is named twice", n.GetId())
		}
		first.Replicas = append(first.Replicas, &placementv1.Replica{ReplicaId: n.GetId(), NodeId: n.GetId()})
		first.NextReplicaId = max(first.NextReplicaId, n.GetId()+1)
	}
	st.Generation = 1
	st.Ranges = []*shardv1.RangeDescriptor{{ShardId: FirstDataShard, Generation: 1}}
	st.Shards = []*placementv1.Shard{first}
	st.NextShardId, st.NextOperatorId, st.EpochLimit, st.LastEpoch = FirstDataShard+1, 1, 2, 1
	return nil
}

func registerNode(st *placementv1.State, n *placementv1.Node) error {
	if n.GetId() == 0 {
		return errors.New("node.id: is required")
	}
	if n.GetRaftAddr() == "" || n.GetListenAddr() == "" {
		return fmt.Errorf("node %d: raft_addr and listen_addr are required", n.GetId())
	}
	// Only a version 5 entry removes a node, and once one has applied
	// every placement replica knows the rule: older entries never meet a
	// removed id.
	if slices.Contains(st.GetRemovedNodeIds(), n.GetId()) {
		return fmt.Errorf("node.id: node %d was removed from the cluster, and a node id is never used again: join under a new id", n.GetId())
	}
	if i := slices.IndexFunc(st.Nodes, func(m *placementv1.Node) bool { return m.GetId() == n.GetId() }); i >= 0 {
		old := st.Nodes[i].GetZone()
		switch {
		case n.GetZone() == "":
			n = proto.CloneOf(n)
			n.Zone = old
		case old != "" && n.GetZone() != old:
			// Replicas were placed by zone: a node never changes zone.
			return fmt.Errorf("node.zone: node %d is in zone %q, not %q", n.GetId(), old, n.GetZone())
		}
		st.Nodes[i] = n
		return nil
	}
	st.Nodes = append(st.Nodes, n)
	slices.SortFunc(st.Nodes, func(a, b *placementv1.Node) int { return cmp.Compare(a.GetId(), b.GetId()) })
	return nil
}

// removeNode takes node id out of the map: no replica may be on it and
// no operator may name it (RemoveNode moves them off first).
func removeNode(st *placementv1.State, id uint64) error {
	i := slices.IndexFunc(st.GetNodes(), func(n *placementv1.Node) bool { return n.GetId() == id })
	if i < 0 {
		return fmt.Errorf("node_id: node %d is not in the map", id)
	}
	for _, s := range st.GetShards() {
		for _, r := range s.GetReplicas() {
			if r.GetNodeId() == id {
				return fmt.Errorf("node_id: node %d still hosts replica %d of shard %d", id, r.GetReplicaId(), s.GetId())
			}
		}
	}
	for _, op := range st.GetOperators() {
		if m := op.GetMove(); m.GetFromNode() == id || m.GetToNode() == id {
			return fmt.Errorf("node_id: operator %d moves a replica of node %d", op.GetId(), id)
		}
	}
	st.Nodes = slices.Delete(st.Nodes, i, i+1)
	st.RemovedNodeIds = append(st.RemovedNodeIds, id)
	return nil
}

func reserveEpochs(st *placementv1.State, c *placementv1.ReserveEpochsCmd) (*placementv1.Result, error) {
	if st.GetGeneration() == 0 {
		return nil, errors.New("placement is not bootstrapped")
	}
	if st.GetEpochLimit() != c.GetExpectedLimit() {
		return nil, fmt.Errorf("epoch limit is %d, not %d: another leader reserved a window", st.GetEpochLimit(), c.GetExpectedLimit())
	}
	if c.GetCount() == 0 || c.GetCount() > 1024 || st.GetEpochLimit()+c.GetCount() > shard.MaxEpoch+1 {
		return nil, fmt.Errorf("count: %d epochs from %d do not fit (at most 1024, up to epoch %d)", c.GetCount(), st.GetEpochLimit(), shard.MaxEpoch)
	}
	start := st.EpochLimit
	st.EpochLimit += c.GetCount()
	return &placementv1.Result{EpochStart: start}, nil
}

// Shard returns the shard with id, or nil.
func shardByID(st *placementv1.State, id uint64) *placementv1.Shard {
	for _, s := range st.GetShards() {
		if s.GetId() == id {
			return s
		}
	}
	return nil
}

// rangeOf returns the index of the range owned by shard id (each shard
// owns one contiguous range), or -1.
func rangeOf(st *placementv1.State, id uint64) int {
	return slices.IndexFunc(st.GetRanges(), func(r *shardv1.RangeDescriptor) bool { return r.GetShardId() == id })
}

// Middle returns the hash halfway through [start, end) (end 0: 2^64).
func Middle(start, end uint64) uint64 {
	if start == end { // the whole space: [0, 2^64)
		return start + 1<<63
	}
	return start + (end-start)/2 // end-start wraps to the size when end is 0
}

// beginSplit applies c, proposed at placement command version v: from
// version 2 the target shard's membership changes compare-and-set.
func beginSplit(st *placementv1.State, c *placementv1.BeginSplitCmd, rid string, v uint32) (*placementv1.Result, error) {
	if op := blocking(st, v); op != nil {
		return nil, fmt.Errorf("operation %d is in progress; %s", op.GetId(), busyReason)
	}
	src := shardByID(st, c.GetSource())
	i := rangeOf(st, c.GetSource())
	if src == nil || i < 0 {
		return nil, fmt.Errorf("source: shard %d owns no range", c.GetSource())
	}
	r := st.Ranges[i]
	at := c.GetSplitAt()
	if at == 0 {
		at = Middle(r.GetStart(), r.GetEnd())
	}
	if at <= r.GetStart() || (r.GetEnd() != 0 && at >= r.GetEnd()) {
		return nil, fmt.Errorf("split_at: %#x is not inside shard %d's range [%#x, %#x)", at, src.GetId(), r.GetStart(), r.GetEnd())
	}
	if c.GetEpoch() <= st.GetLastEpoch() {
		return nil, fmt.Errorf("epoch: %d is not above the last one assigned, %d", c.GetEpoch(), st.GetLastEpoch())
	}
	if c.GetEpoch() >= st.GetEpochLimit() {
		return nil, fmt.Errorf("epoch: %d was not reserved (limit %d)", c.GetEpoch(), st.GetEpochLimit())
	}
	target := &placementv1.Shard{Id: st.NextShardId, Epoch: c.GetEpoch(), State: placementv1.ShardState_SHARD_STATE_PENDING, NextReplicaId: 1,
		OrderedConfigChange: v >= 2}
	zones := map[string]bool{}
	for _, id := range c.GetNodes() {
		n := nodeByID(st, id)
		if n == nil {
			return nil, fmt.Errorf("nodes: node %d is not registered", id)
		}
		if job := removing(st, id); job != nil && v >= 7 {
			return nil, fmt.Errorf("nodes: node %d is being removed (operation %d)", id, job.GetId())
		}
		if zones[n.GetZone()] {
			return nil, fmt.Errorf("nodes: two replicas in zone %q", n.GetZone())
		}
		zones[n.GetZone()] = true
		target.Replicas = append(target.Replicas, &placementv1.Replica{ReplicaId: target.NextReplicaId, NodeId: id})
		target.NextReplicaId++
	}
	if len(target.Replicas) == 0 {
		return nil, errors.New("nodes: at least one is required")
	}
	st.LastEpoch = c.GetEpoch()
	st.NextShardId++
	if st.NextShardId >= MetaShardID {
		return nil, errors.New("shard ids are exhausted")
	}
	st.Shards = append(st.Shards, target)
	op := &placementv1.Operator{Id: st.NextOperatorId, RequestId: rid, Kind: &placementv1.Operator_Split{Split: &placementv1.SplitOp{
		Source: src.GetId(), Target: target.GetId(), SplitAt: at, Epoch: c.GetEpoch(),
		Step: placementv1.SplitStep_SPLIT_STEP_PREPARED, Generation: st.GetGeneration() + 1}}}
	st.NextOperatorId++
	st.Operators = append(st.Operators, op)
	return &placementv1.Result{Operator: op}, nil
}

// requestID is the request id a begin of version v carries: none below
// version 6, whose rule ignored the field (no proposer sets it there).
func requestID(id string, v uint32) string {
	if v < 6 {
		return ""
	}
	return id
}

// requested returns the operator, in progress or kept, whose request_id
// is id, if same says it is the operation asked for; an error if one has
// it but is another; nil, nil if none has it (or id is empty: the caller
// gave none, as every entry before version 6).
func requested(st *placementv1.State, id string, same func(*placementv1.Operator) bool) (*placementv1.Operator, error) {
	if id == "" {
		return nil, nil
	}
	if err := shard.CheckName("request_id", id, MaxRequestID); err != nil {
		return nil, err
	}
	op, _ := FindOperator(st, 0, id)
	switch {
	case op == nil:
		return nil, nil
	case !same(op):
		return nil, fmt.Errorf("request_id: %q names operation %d, %s, not this one", id, op.GetId(), describeOperator(op))
	}
	return op, nil
}

// describeOperator says what operator op does, for a refusal.
func describeOperator(op *placementv1.Operator) string {
	if s := op.GetSplit(); s != nil {
		return fmt.Sprintf("a split of shard %d at %#016x", s.GetSource(), s.GetSplitAt())
	}
	if r := op.GetRemoveNode(); r != nil && r.GetForce() {
		return fmt.Sprintf("a forced removal of node %d", r.GetNodeId())
	} else if r != nil {
		return fmt.Sprintf("a removal of node %d", r.GetNodeId())
	}
	if op.GetRebalance() != nil {
		return "a rebalance"
	}
	m := op.GetMove()
	return fmt.Sprintf("a move of shard %d's replica from node %d to node %d", m.GetShard(), m.GetFromNode(), m.GetToNode())
}

// sameSplit reports whether an operator is the split c asks for: of the
// same source, at the same hash when c names one.
func sameSplit(c *placementv1.BeginSplitCmd) func(*placementv1.Operator) bool {
	return func(op *placementv1.Operator) bool {
		s := op.GetSplit()
		return s != nil && s.GetSource() == c.GetSource() && (c.GetSplitAt() == 0 || s.GetSplitAt() == c.GetSplitAt())
	}
}

// sameMove reports whether an operator is the move c asks for.
func sameMove(c *placementv1.BeginMoveCmd) func(*placementv1.Operator) bool {
	return func(op *placementv1.Operator) bool {
		m := op.GetMove()
		return m != nil && m.GetShard() == c.GetShard() && m.GetFromNode() == c.GetFromNode() && m.GetToNode() == c.GetToNode() && op.GetParent() == c.GetParent()
	}
}

// FindOperator returns the operator of st with id or, when id is 0,
// with requestID, and whether it is in progress (else it is one of the
// ended ones kept); nil if there is none.
func FindOperator(st *placementv1.State, id uint64, requestID string) (*placementv1.Operator, bool) {
	match := func(op *placementv1.Operator) bool {
		if id != 0 {
			return op.GetId() == id
		}
		return requestID != "" && op.GetRequestId() == requestID
	}
	for _, op := range st.GetOperators() {
		if match(op) {
			return op, true
		}
	}
	for _, op := range slices.Backward(st.GetFinishedOperators()) {
		if match(op) {
			return op, false
		}
	}
	return nil, false
}

func nodeByID(st *placementv1.State, id uint64) *placementv1.Node {
	for _, n := range st.GetNodes() {
		if n.GetId() == id {
			return n
		}
	}
	return nil
}

func operatorByID(st *placementv1.State, id uint64) (*placementv1.Operator, int) {
	for i, op := range st.GetOperators() {
		if op.GetId() == id {
			return op, i
		}
	}
	return nil, -1
}

func advanceSplit(st *placementv1.State, c *placementv1.AdvanceSplitCmd) error {
	op, _ := operatorByID(st, c.GetOperatorId())
	s := op.GetSplit()
	if s == nil {
		return fmt.Errorf("operator_id: no split %d is in progress", c.GetOperatorId())
	}
	if s.GetRollingBack() || c.GetTo() != s.GetStep()+1 || c.GetTo() > placementv1.SplitStep_SPLIT_STEP_COMMITTED {
		return fmt.Errorf("to: split %d is at %v, it cannot go to %v", op.GetId(), s.GetStep(), c.GetTo())
	}
	if c.GetTo() == placementv1.SplitStep_SPLIT_STEP_COMMITTED {
		if err := commitSplit(st, s); err != nil {
			return err
		}
	}
	s.Step = c.GetTo()
	return nil
}

// commitSplit gives [split_at, end) of the source's range to the target
// at the split's generation.
func commitSplit(st *placementv1.State, s *placementv1.SplitOp) error {
	i := rangeOf(st, s.GetSource())
	if i < 0 || st.GetGeneration()+1 != s.GetGeneration() {
		return fmt.Errorf("split of shard %d: the map moved on (generation %d, source range %d)", s.GetSource(), st.GetGeneration(), i)
	}
	r := st.Ranges[i]
	lower := &shardv1.RangeDescriptor{ShardId: r.GetShardId(), Start: r.GetStart(), End: s.GetSplitAt(), Generation: s.GetGeneration()}
	upper := &shardv1.RangeDescriptor{ShardId: s.GetTarget(), Start: s.GetSplitAt(), End: r.GetEnd(), Generation: s.GetGeneration()}
	st.Ranges = slices.Replace(st.Ranges, i, i+1, lower, upper)
	st.Generation = s.GetGeneration()
	shardByID(st, s.GetTarget()).State = placementv1.ShardState_SHARD_STATE_ACTIVE
	return nil
}

// endOperator ends operator c.operator_id, or marks it rolling back;
// from version 6 (v) the ended operator is kept in finished_operators,
// and from version 7 a job ends too (endJob), and a move's end is
// recorded in its job's step.
func endOperator(st *placementv1.State, c *placementv1.EndOperatorCmd, v uint32) error {
	op, i := operatorByID(st, c.GetOperatorId())
	if op == nil {
		return fmt.Errorf("operator_id: %d is not in progress", c.GetOperatorId())
	}
	if c.GetError() != "" && !isJob(op) {
		return fmt.Errorf("error: operator %d is no node removal or rebalance; only a job ends with an error", op.GetId())
	}
	if s := op.GetSplit(); s != nil {
		switch {
		case c.GetRollback() && s.GetStep() >= placementv1.SplitStep_SPLIT_STEP_ACTIVATED:
			return fmt.Errorf("rollback: split %d is at %v, past its point of no return", op.GetId(), s.GetStep())
		case c.GetRollback():
			st.Shards = slices.DeleteFunc(st.Shards, func(sh *placementv1.Shard) bool { return sh.GetId() == s.GetTarget() })
			s.RollingBack = true
			return nil
		case s.GetStep() != placementv1.SplitStep_SPLIT_STEP_COMMITTED && !s.GetRollingBack():
			return fmt.Errorf("operator_id: split %d is at %v, not done", op.GetId(), s.GetStep())
		}
	}
	if m := op.GetMove(); m != nil {
		switch {
		case c.GetRollback() && m.GetStep() >= placementv1.MoveStep_MOVE_STEP_PROMOTED:
			return fmt.Errorf("rollback: move %d is at %v, past its point of no return", op.GetId(), m.GetStep())
		case c.GetRollback():
			m.RollingBack = true
			return nil
		case m.GetRollingBack():
			// The driver removed the new replica from the group: drop it.
			sh := shardByID(st, m.GetShard())
			sh.Replicas = slices.DeleteFunc(sh.Replicas, func(r *placementv1.Replica) bool { return r.GetReplicaId() == m.GetToReplica() })
		case m.GetStep() != placementv1.MoveStep_MOVE_STEP_REMOVED:
			return fmt.Errorf("operator_id: move %d is at %v, not done", op.GetId(), m.GetStep())
		}
		if v >= 7 {
			endStep(st, op)
		}
	}
	if isJob(op) && v >= 7 {
		if err := endJob(st, op, c); err != nil {
			return err
		}
	}
	finish(st, i, v)
	return nil
}

// finish takes the operator at index i out of those in progress and,
// from version 6 (v), keeps it among the last ended.
func finish(st *placementv1.State, i int, v uint32) {
	op := st.Operators[i]
	st.Operators = slices.Delete(st.Operators, i, i+1)
	if v >= 6 {
		st.FinishedOperators = append(st.FinishedOperators, op)
		if n := len(st.FinishedOperators); n > finishedKept {
			st.FinishedOperators = slices.Delete(st.FinishedOperators, 0, n-finishedKept)
		}
	}
}

func beginMove(st *placementv1.State, c *placementv1.BeginMoveCmd, rid string, v uint32) (*placementv1.Result, error) {
	if op := blocking(st, v); op != nil {
		return nil, fmt.Errorf("operation %d is in progress; %s", op.GetId(), busyReason)
	}
	sh := shardByID(st, c.GetShard())
	if sh == nil || sh.GetState() != placementv1.ShardState_SHARD_STATE_ACTIVE {
		return nil, fmt.Errorf("shard_id: shard %d does not exist", c.GetShard())
	}
	var job *placementv1.Operator
	if c.GetParent() != 0 {
		var err error
		if job, err = stepParent(st, c); err != nil {
			return nil, err
		}
	}
	var to *placementv1.Node
	if c.GetToNode() != 0 || job == nil {
		if to = nodeByID(st, c.GetToNode()); to == nil {
			return nil, fmt.Errorf("to_node_id: node %d does not exist", c.GetToNode())
		}
		if r := removing(st, to.GetId()); r != nil && v >= 7 {
			return nil, fmt.Errorf("to_node_id: node %d is being removed (operation %d)", to.GetId(), r.GetId())
		}
	}
	if c.GetFromNode() == c.GetToNode() {
		return nil, fmt.Errorf("to_node_id: node %d is also from_node_id", c.GetToNode())
	}
	var from *placementv1.Replica
	for _, r := range sh.GetReplicas() {
		if r.GetNodeId() == c.GetFromNode() {
			from = r
		}
	}
	switch {
	case from == nil && (c.GetFromNode() != 0 || job == nil):
		return nil, fmt.Errorf("from_node_id: node %d has no replica of shard %d", c.GetFromNode(), sh.GetId())
	case from == nil && len(sh.GetReplicas()) >= Replicas:
		return nil, fmt.Errorf("from_node_id: shard %d has %d replicas already; a replica is added only below %d", sh.GetId(), len(sh.GetReplicas()), Replicas)
	case to == nil && len(sh.GetReplicas()) <= minReplicas:
		return nil, fmt.Errorf("to_node_id: dropping node %d's replica would leave shard %d with fewer than %d replicas", c.GetFromNode(), sh.GetId(), minReplicas)
	}
	for _, r := range sh.GetReplicas() {
		switch {
		case to == nil:
		case r.GetNodeId() == c.GetToNode():
			return nil, fmt.Errorf("to_node_id: node %d already hosts a replica of shard %d", c.GetToNode(), sh.GetId())
		case r != from && nodeByID(st, r.GetNodeId()).GetZone() == to.GetZone():
			return nil, fmt.Errorf("to_node_id: zone %q already has a replica of shard %d", to.GetZone(), sh.GetId())
		}
	}
	if sh.GetNextReplicaId() == 0 { // shards created before the field existed
		for _, r := range sh.GetReplicas() {
			sh.NextReplicaId = max(sh.NextReplicaId, r.GetReplicaId()+1)
		}
	}
	m := &placementv1.MoveOp{Shard: sh.GetId(), Step: placementv1.MoveStep_MOVE_STEP_PLANNED}
	if from != nil {
		m.FromReplica, m.FromNode = from.GetReplicaId(), from.GetNodeId()
	}
	if to != nil {
		added := &placementv1.Replica{ReplicaId: sh.NextReplicaId, NodeId: to.GetId(), Join: true, NonVoting: true}
		sh.NextReplicaId++
		sh.Replicas = append(sh.Replicas, added)
		m.ToReplica, m.ToNode = added.GetReplicaId(), to.GetId()
	}
	op := &placementv1.Operator{Id: st.NextOperatorId, RequestId: rid, Parent: c.GetParent(), Kind: &placementv1.Operator_Move{Move: m}}
	st.NextOperatorId++
	st.Operators = append(st.Operators, op)
	if job != nil {
		job.Steps = append(job.Steps, &placementv1.JobStep{Kind: moveKind(m), Shard: m.GetShard(), FromNode: m.GetFromNode(), ToNode: m.GetToNode(),
			OperatorId: op.GetId(), State: placementv1.JobStepState_JOB_STEP_STATE_RUNNING})
	}
	return &placementv1.Result{Operator: op}, nil
}

func advanceMove(st *placementv1.State, c *placementv1.AdvanceMoveCmd) error {
	op, _ := operatorByID(st, c.GetOperatorId())
	m := op.GetMove()
	if m == nil {
		return fmt.Errorf("operator_id: no move %d is in progress", c.GetOperatorId())
	}
	if m.GetRollingBack() || c.GetTo() != m.GetStep()+1 || c.GetTo() > placementv1.MoveStep_MOVE_STEP_REMOVED {
		return fmt.Errorf("to: move %d is at %v, it cannot go to %v", op.GetId(), m.GetStep(), c.GetTo())
	}
	if c.GetTo() == placementv1.MoveStep_MOVE_STEP_REMOVED {
		sh := shardByID(st, m.GetShard())
		sh.Replicas = slices.DeleteFunc(sh.Replicas, func(r *placementv1.Replica) bool { return r.GetReplicaId() == m.GetFromReplica() })
	}
	m.Step = c.GetTo()
	return nil
}

// CheckMap reports whether st's ranges cover the hash space exactly once,
// each owned by an active shard: the invariant of every committed map.
func CheckMap(st *placementv1.State) error {
	var next uint64
	for i, r := range st.GetRanges() {
		if r.GetStart() != next || (i > 0 && next == 0) {
			return fmt.Errorf("range %d of shard %d starts at %#x, want %#x", i, r.GetShardId(), r.GetStart(), next)
		}
		if s := shardByID(st, r.GetShardId()); s.GetState() != placementv1.ShardState_SHARD_STATE_ACTIVE {
			return fmt.Errorf("range %d is owned by shard %d, which is %v", i, r.GetShardId(), s.GetState())
		}
		if r.GetEnd() != 0 && r.GetEnd() <= r.GetStart() {
			return fmt.Errorf("range %d of shard %d is empty", i, r.GetShardId())
		}
		next = r.GetEnd()
		if next == 0 && i != len(st.GetRanges())-1 {
			return fmt.Errorf("range %d of shard %d ends the space before the last range", i, r.GetShardId())
		}
	}
	if len(st.GetRanges()) > 0 && next != 0 {
		return fmt.Errorf("the ranges stop at %#x", next)
	}
	return nil
}

// metaSM is the placement group's state machine: the whole State in
// memory (it is small), recovered by Dragonboat from snapshots and the log.
type metaSM struct {
	st *placementv1.State
}

// NewMetaStateMachine creates placement state machines for Dragonboat.
func NewMetaStateMachine(shardID, replicaID uint64) sm.IStateMachine {
	return &metaSM{st: &placementv1.State{}}
}

func (m *metaSM) Update(e sm.Entry) (sm.Result, error) {
	cmd := &placementv1.Command{}
	var res *placementv1.Result
	if err := proto.Unmarshal(e.Cmd, cmd); err != nil {
		res = &placementv1.Result{Error: "malformed command: " + err.Error()}
	} else if cmd.GetVersion() > MetaCommandVersion || newerKind(cmd) {
		// A newer replica applies it; refusing it here would diverge.
		// Stopping keeps this replica's state as it was: an upgraded
		// binary applies the entry on restart.
		return sm.Result{}, fmt.Errorf("%w: entry %d needs version %d (or a kind this binary does not know), this binary applies up to %d",
			ErrMetaVersion, e.Index, cmd.GetVersion(), MetaCommandVersion)
	} else {
		m.st, res = ApplyMeta(m.st, cmd)
	}
	data, err := proto.Marshal(res)
	return sm.Result{Data: data}, err
}

// Lookup answers any query with a copy of the state.
func (m *metaSM) Lookup(any) (any, error) { return proto.CloneOf(m.st), nil }

func (m *metaSM) SaveSnapshot(w io.Writer, _ sm.ISnapshotFileCollection, _ <-chan struct{}) error {
	b, err := proto.Marshal(m.st)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

func (m *metaSM) RecoverFromSnapshot(r io.Reader, _ []sm.SnapshotFile, _ <-chan struct{}) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	st := &placementv1.State{}
	if err := proto.Unmarshal(b, st); err != nil {
		return fmt.Errorf("placement snapshot: %w", err)
	}
	m.st = st
	return nil
}

func (m *metaSM) Close() error { return nil }
