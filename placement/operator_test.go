package placement

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// memMeta is a MetaClient over an in-memory placement state, stamping
// each command with the version its nodes apply.
type memMeta struct {
	mu sync.Mutex
	st *placementv1.State
}

func (m *memMeta) Propose(_ context.Context, cmd *placementv1.Command) (*placementv1.Result, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cmd, err := stampVersion(cmd, clusterMetaVersion(m.st)) // as localMeta.Propose does
	if err != nil {
		return nil, err
	}
	var res *placementv1.Result
	m.st, res = ApplyMeta(m.st, cmd)
	if err := CheckMap(m.st); err != nil {
		panic(err)
	}
	if res.GetError() != "" {
		return res, &RefusedError{res.GetError()}
	}
	return res, nil
}

func (m *memMeta) Read(context.Context) (*placementv1.State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st, nil
}

// fakeShards records the range commands the operator sends and answers
// OK; reads of shards in down fail, and AppliedIndex of a node in
// stopped answers nothing until its context ends. Its membership changes
// compare and set as an ordered shard's do: each bumps ccid, and one
// naming another id is refused.
type fakeShards struct {
	mu                sync.Mutex
	log               []string
	down              map[uint64]bool
	stopped           map[uint64]bool
	voting, nonVoting map[uint64]string // shard 1's membership
	ccid              uint64
	// interfere, if set, runs before a membership change is decided,
	// once: another driver's change landing between the read and it.
	interfere func(f *fakeShards)
}

func (f *fakeShards) Propose(_ context.Context, shardID uint64, env *shardv1.Envelope) (*shardv1.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var name string
	switch c := env.GetCommand().(type) {
	case *shardv1.Envelope_FenceRange:
		name = fmt.Sprintf("fence %#x", c.FenceRange.GetFence().GetStart())
	case *shardv1.Envelope_UnfenceRange:
		name = "unfence"
	case *shardv1.Envelope_ImportRange:
		name = "import"
	case *shardv1.Envelope_ActivateRange:
		name = fmt.Sprintf("activate epoch %d", c.ActivateRange.GetEpoch())
	case *shardv1.Envelope_ReleaseRange:
		name = fmt.Sprintf("release keep [%#x, %#x)", c.ReleaseRange.GetKeep().GetStart(), c.ReleaseRange.GetKeep().GetEnd())
	}
	f.log = append(f.log, fmt.Sprintf("shard %d gen %d: %s", shardID, env.GetGeneration(), name))
	return &shardv1.Result{Code: shardv1.Code_CODE_OK}, nil
}

func (f *fakeShards) Read(_ context.Context, shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down[shardID] {
		return nil, errors.New("no leader")
	}
	out := &shardv1.QueryResult{Meta: &shardv1.ShardMeta{Config: &shardv1.ShardConfig{}}}
	if q.GetExport() != nil {
		// The fence this fake source holds is the operator's (id 1).
		out.Meta.Fence = &shardv1.RangeFence{OperatorId: 1}
		out.Records = &shardv1.RangeRecords{Locks: []*shardv1.LockRecord{{Resource: "r"}}}
	}
	return out, nil
}

func (f *fakeShards) Membership(_ context.Context, req *placementv1.MembershipRequest) (*placementv1.MembershipResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.voting == nil {
		f.voting, f.nonVoting, f.ccid = map[uint64]string{1: "", 2: "", 3: ""}, map[uint64]string{}, 3
	}
	change := req.GetChange()
	if change != placementv1.MembershipChange_MEMBERSHIP_CHANGE_NONE {
		if in := f.interfere; in != nil {
			f.interfere = nil
			in(f)
		}
		if req.GetConfigChangeId() != f.ccid {
			f.log = append(f.log, fmt.Sprintf("refused %v %d at %d, now %d", change, req.GetReplicaId(), req.GetConfigChangeId(), f.ccid))
			return nil, errors.New("rejected: stale config change id")
		}
	}
	f.apply(req.GetShardId(), change, req.GetReplicaId())
	return &placementv1.MembershipResponse{Voting: maps.Clone(f.voting), NonVoting: maps.Clone(f.nonVoting), ConfigChangeId: f.ccid}, nil
}

func (f *fakeShards) apply(shardID uint64, change placementv1.MembershipChange, replica uint64) {
	switch change {
	case placementv1.MembershipChange_MEMBERSHIP_CHANGE_ADD_NON_VOTING:
		f.nonVoting[replica] = ""
	case placementv1.MembershipChange_MEMBERSHIP_CHANGE_ADD_VOTING:
		delete(f.nonVoting, replica)
		f.voting[replica] = ""
	case placementv1.MembershipChange_MEMBERSHIP_CHANGE_REMOVE:
		delete(f.voting, replica)
		delete(f.nonVoting, replica)
	}
	if change != placementv1.MembershipChange_MEMBERSHIP_CHANGE_NONE {
		f.ccid++
		f.log = append(f.log, fmt.Sprintf("shard %d: %v %d", shardID, change, replica))
	}
}

func (f *fakeShards) AppliedIndex(ctx context.Context, _, node uint64) (uint64, error) {
	f.mu.Lock()
	stopped := f.stopped[node]
	f.mu.Unlock()
	if stopped {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return 0, nil
}

func bootstrapped(t *testing.T) *memMeta {
	m := &memMeta{st: &placementv1.State{}}
	var nodes []*placementv1.Node
	for i := range 3 {
		nodes = append(nodes, &placementv1.Node{Id: uint64(i + 1), Zone: fmt.Sprintf("az%d", i+1), RaftAddr: "r", ListenAddr: "l"})
	}
	if _, err := m.Propose(context.Background(), &placementv1.Command{Command: &placementv1.Command_Bootstrap{Bootstrap: &placementv1.BootstrapCmd{Nodes: nodes}}}); err != nil {
		t.Fatal(err)
	}
	return m
}

// Two drivers (an old and a new placement leader) run the same split at
// once: the steps reach each shard in order, at the right generations,
// and the split commits exactly once.
func TestSplitWithTwoDrivers(t *testing.T) {
	meta, shards := bootstrapped(t), &fakeShards{}
	ops := []*Operators{
		{Meta: meta, Shards: shards, Alloc: NewAllocator(meta)},
		{Meta: meta, Shards: shards, Alloc: NewAllocator(meta)},
	}
	op, err := ops[0].BeginSplit(context.Background(), 1, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, o := range ops {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := o.Run(ctx, op.GetId()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	st, _ := meta.Read(context.Background())
	if st.GetGeneration() != 2 || len(st.GetRanges()) != 2 || len(st.GetOperators()) != 0 {
		t.Fatalf("after the split: %v", st)
	}
	first := map[string]int{}
	for i, l := range shards.log {
		if _, ok := first[l]; !ok {
			first[l] = i
		}
	}
	order := []string{
		"shard 1 gen 1: fence 0x8000000000000000",
		"shard 2 gen 2: import",
		"shard 2 gen 2: activate epoch 2",
		"shard 1 gen 2: release keep [0x0, 0x8000000000000000)",
	}
	for i, l := range order {
		at, ok := first[l]
		if !ok || (i > 0 && at < first[order[i-1]]) {
			t.Fatalf("step %q missing or out of order in:\n%v", l, shards.log)
		}
	}
}

// A split whose new shard never elects a leader rolls back: the rollback
// is recorded before the source is unfenced, the target is dropped, and
// the map is unchanged.
func TestSplitRollsBack(t *testing.T) {
	meta, shards := bootstrapped(t), &fakeShards{down: map[uint64]bool{2: true}}
	o := &Operators{Meta: meta, Shards: shards, Alloc: NewAllocator(meta), TargetWait: 100 * time.Millisecond}
	op, err := o.BeginSplit(context.Background(), 1, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	last, err := o.Run(ctx, op.GetId())
	if err != nil || !last.GetSplit().GetRollingBack() {
		t.Fatalf("run: %v %v", last, err)
	}
	st, _ := meta.Read(context.Background())
	if st.GetGeneration() != 1 || len(st.GetShards()) != 1 || len(st.GetOperators()) != 0 {
		t.Fatalf("after the rollback: %v", st)
	}
	if len(shards.log) != 1 || shards.log[0] != "shard 1 gen 1: unfence" {
		t.Fatalf("commands: %v", shards.log)
	}
	// The next split takes a new epoch, above the abandoned one.
	shards.down = nil
	op2, err := o.BeginSplit(context.Background(), 1, 0, "")
	if err != nil || op2.GetSplit().GetEpoch() <= op.GetSplit().GetEpoch() {
		t.Fatalf("second split: %v %v", op2, err)
	}
}

// A move of a replica of an idle shard (nothing applied yet: every applied
// index is 0) adds the new replica as non-voting, promotes it, removes the
// old one, in that order, and leaves the map with the new replica.
func TestMoveOfIdleShard(t *testing.T) {
	shards := &fakeShards{}
	st := moveReplica(t, shards)
	want := []string{
		"shard 1: MEMBERSHIP_CHANGE_ADD_NON_VOTING 4",
		"shard 1: MEMBERSHIP_CHANGE_ADD_VOTING 4",
		"shard 1: MEMBERSHIP_CHANGE_REMOVE 1",
	}
	if fmt.Sprint(shards.log) != fmt.Sprint(want) {
		t.Fatalf("membership changes %v, want %v", shards.log, want)
	}
	var nodes []uint64
	for _, r := range shardByID(st, 1).GetReplicas() {
		nodes = append(nodes, r.GetNodeId())
	}
	if fmt.Sprint(nodes) != "[2 3 4]" || len(st.GetOperators()) != 0 {
		t.Fatalf("after the move: replicas on %v, operators %v", nodes, st.GetOperators())
	}
}

// moveReplica registers node 4 (zone az1), moves shard 1's replica on
// node 1 to it through shards, to the end, and returns the placement
// state after.
func moveReplica(t *testing.T, shards *fakeShards) *placementv1.State {
	t.Helper()
	o := moveRig(t, "az1", shards, nil)
	if last := o.runMove(t, 1, 1, 4); last.GetMove().GetRollingBack() {
		t.Fatalf("run: %v", last)
	}
	st, _ := o.Meta.Read(context.Background())
	return st
}

// moveRig is a bootstrapped placement group with node 4 registered in
// zone, and operators over shards that judge nodes live by live.
func moveRig(t *testing.T, zone string, shards *fakeShards, live func(uint64) bool) *Operators {
	t.Helper()
	meta := bootstrapped(t)
	if _, err := meta.Propose(context.Background(), &placementv1.Command{Command: &placementv1.Command_RegisterNode{RegisterNode: &placementv1.RegisterNodeCmd{
		Node: &placementv1.Node{Id: 4, Zone: zone, RaftAddr: "r4", ListenAddr: "l4"}}}}); err != nil {
		t.Fatal(err)
	}
	return &Operators{Meta: meta, Shards: shards, Alloc: NewAllocator(meta), TargetWait: time.Second, Live: live}
}

// runMove moves shard's replica on node from to node to, to the end,
// and returns the move as it ended.
func (o *Operators) runMove(t *testing.T, shard, from, to uint64) *placementv1.Operator {
	t.Helper()
	op, err := o.BeginMove(context.Background(), shard, from, to, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	last, err := o.Run(ctx, op.GetId())
	if err != nil {
		t.Fatalf("run: %v %v", last, err)
	}
	return last
}

// nodeIs answers, for Operators.Live, whether a node is live: all are
// but those listed.
func nodeIs(down ...uint64) func(uint64) bool {
	return func(id uint64) bool { return !slices.Contains(down, id) }
}

// Fault 3 of issue 41, with shard 1's voter on node 3 down. A move of
// node 1's live replica is refused up front, naming node 3: adding a
// fourth voter before removing the third would leave the shard with no
// quorum should one more node fail. Node 3's own replica moves (the
// repair), node 3's removed before node 4's replica is promoted, so the
// shard keeps a quorum of live voters (nodes 1 and 2) at every step.
func TestMoveWithVoterDown(t *testing.T) {
	o := moveRig(t, "az1", &fakeShards{}, nodeIs(3))
	_, err := o.BeginMove(context.Background(), 1, 1, 4, "")
	var refused *RefusedError
	if !errors.As(err, &refused) || !strings.Contains(refused.Reason, "voter on node 3 does not answer") {
		t.Fatalf("moving node 1's replica with node 3 down: %v, want refused naming node 3", err)
	}
	if st, _ := o.Meta.Read(context.Background()); len(st.GetOperators()) != 0 {
		t.Fatalf("the refused move left operators %v", st.GetOperators())
	}

	shards := &fakeShards{}
	o = moveRig(t, "az3", shards, nodeIs(3))
	if last := o.runMove(t, 1, 3, 4); last.GetMove().GetRollingBack() {
		t.Fatalf("moving node 3's replica rolled back: %v", last)
	}
	want := []string{
		"shard 1: MEMBERSHIP_CHANGE_ADD_NON_VOTING 4",
		"shard 1: MEMBERSHIP_CHANGE_REMOVE 3",
		"shard 1: MEMBERSHIP_CHANGE_ADD_VOTING 4",
	}
	st, _ := o.Meta.Read(context.Background())
	if fmt.Sprint(shards.log) != fmt.Sprint(want) || fmt.Sprint(replicaNodes(st, 1)) != "[1 2 4]" {
		t.Fatalf("membership changes %v (want %v), replicas on %v", shards.log, want, replicaNodes(st, 1))
	}
}

// A driver that resumes a move whose down source is already out of the
// group (the driver before it removed it, then failed) promotes the new
// replica without waiting for it, even though it has stopped: rolling
// back would leave the map listing a replica the group removed.
func TestMoveResumedAfterSourceRemoved(t *testing.T) {
	shards := &fakeShards{stopped: map[uint64]bool{4: true}}
	o := moveRig(t, "az3", shards, nodeIs(3, 4))
	o.TargetWait = time.Minute
	op, err := o.BeginMove(context.Background(), 1, 3, 4, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shards.Membership(context.Background(), &placementv1.MembershipRequest{ShardId: 1, Change: placementv1.MembershipChange_MEMBERSHIP_CHANGE_NONE}); err != nil {
		t.Fatal(err)
	}
	shards.apply(1, placementv1.MembershipChange_MEMBERSHIP_CHANGE_ADD_NON_VOTING, 4)
	shards.apply(1, placementv1.MembershipChange_MEMBERSHIP_CHANGE_REMOVE, 3)
	if err := o.advanceMove(context.Background(), op.GetId(), placementv1.MoveStep_MOVE_STEP_ADDED); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	last, err := o.Run(ctx, op.GetId())
	st, _ := o.Meta.Read(context.Background())
	if err != nil || last.GetMove().GetRollingBack() || fmt.Sprint(replicaNodes(st, 1)) != "[1 2 4]" {
		t.Fatalf("resumed move: %v %v, replicas on %v (changes %v)", last, err, replicaNodes(st, 1), shards.log)
	}
}

// A move whose new replica's node stops answering while it catches up
// rolls back once the node has been silent for targetDownWait, not
// after the whole TargetWait, though each of its AppliedIndex calls
// hangs (a stopped process takes the connection and answers nothing).
func TestMoveRollsBackWhenTargetStops(t *testing.T) {
	shards := &fakeShards{stopped: map[uint64]bool{4: true}}
	var stopped atomic.Bool
	o := moveRig(t, "az1", shards, func(id uint64) bool { return id != 4 || !stopped.Load() })
	o.TargetWait = time.Minute
	op, err := o.BeginMove(context.Background(), 1, 1, 4, "")
	if err != nil {
		t.Fatal(err)
	}
	stopped.Store(true)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	last, err := o.Run(ctx, op.GetId())
	took := time.Since(start)
	st, _ := o.Meta.Read(context.Background())
	if err != nil || !last.GetMove().GetRollingBack() || fmt.Sprint(replicaNodes(st, 1)) != "[1 2 3]" {
		t.Fatalf("move to a stopped node: %v %v, replicas on %v", last, err, replicaNodes(st, 1))
	}
	if took > targetDownWait+5*time.Second {
		t.Fatalf("the move rolled back after %v, want about %v", took, targetDownWait)
	}
}

// Every step of a move names the config change id of the membership it
// read: when another driver's change lands between the read and the
// step (an old placement leader adding the same replica), the step is
// refused rather than made on a stale view, and the driver reads again
// and finds the step done. Passing no id (or a stale one) would have
// every step refused, and the move would never end.
func TestMoveStepsCompareAndSet(t *testing.T) {
	shards := &fakeShards{interfere: func(f *fakeShards) { f.apply(1, placementv1.MembershipChange_MEMBERSHIP_CHANGE_ADD_NON_VOTING, 4) }}
	moveReplica(t, shards)
	want := []string{
		"shard 1: MEMBERSHIP_CHANGE_ADD_NON_VOTING 4", // the other driver's
		"refused MEMBERSHIP_CHANGE_ADD_NON_VOTING 4 at 3, now 4",
		"shard 1: MEMBERSHIP_CHANGE_ADD_VOTING 4",
		"shard 1: MEMBERSHIP_CHANGE_REMOVE 1",
	}
	if fmt.Sprint(shards.log) != fmt.Sprint(want) {
		t.Fatalf("membership changes %v, want %v", shards.log, want)
	}
}

// progressShards is fakeShards that, when a split activates its new
// shard (after the last import), records how much its driver says it
// copied.
type progressShards struct {
	*fakeShards
	o    *Operators
	seen []Copied
}

func (p *progressShards) Propose(ctx context.Context, shardID uint64, env *shardv1.Envelope) (*shardv1.Result, error) {
	if a := env.GetActivateRange(); a != nil {
		p.seen = append(p.seen, p.o.Copied(a.GetOperatorId()))
	}
	return p.fakeShards.Propose(ctx, shardID, env)
}

// The driver of a split counts the records and bytes it copied while it
// copies (GetOperation shows them), and forgets them once the copy ends.
func TestSplitCopyProgress(t *testing.T) {
	meta := bootstrapped(t)
	shards := &progressShards{fakeShards: &fakeShards{}}
	o := &Operators{Meta: meta, Shards: shards, Alloc: NewAllocator(meta)}
	shards.o = o
	op, err := o.BeginSplit(context.Background(), 1, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := o.Run(ctx, op.GetId()); err != nil {
		t.Fatal(err)
	}
	if len(shards.seen) != 1 || shards.seen[0].Records != 1 || shards.seen[0].Bytes == 0 {
		t.Fatalf("copied as the new shard activated: %v, want 1 record", shards.seen)
	}
	if c := o.Copied(op.GetId()); c != (Copied{}) {
		t.Fatalf("after the split the driver still counts %v", c)
	}
}

// A split's new shard gets a replica in every zone the source has, a
// node that missed its last clock reading (just started, say) included
// when its zone has no other: a shard a replica short stops with its
// next node down (CI found splits made right after a start with two).
func TestPickNodesKeepsEveryZone(t *testing.T) {
	st := &placementv1.State{Nodes: []*placementv1.Node{
		{Id: 1, Zone: "az1"}, {Id: 2, Zone: "az2"}, {Id: 3, Zone: "az3"}, {Id: 4, Zone: "az2"}}}
	live := func(id uint64) bool { return id != 1 && id != 2 }
	got := pickNodes(st, 3, live)
	slices.Sort(got)
	if !slices.Equal(got, []uint64{1, 3, 4}) {
		t.Fatalf("pickNodes with nodes 1 and 2 silent: %v, want [1 3 4] (the live node 4 in az2, node 1 for az1)", got)
	}
	if got := pickNodes(st, 3, nil); len(got) != 3 {
		t.Fatalf("pickNodes without liveness: %v", got)
	}
}
