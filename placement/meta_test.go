package placement

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// TestMetaKeepsTheMapWhole applies random placement commands, valid and
// not, and checks after every one that: the ranges cover the hash space
// exactly once, each owned by an active shard; a refused command changed
// nothing; the generation and the epoch limit never go down; every new
// shard's epoch is above every earlier shard's and below the limit; a
// pending shard owns no range; and ids are never reused.
func TestMetaKeepsTheMapWhole(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		st := &placementv1.State{}
		zones := []string{"az1", "az2", "az3"}
		boot := &placementv1.BootstrapCmd{}
		for i := range 3 {
			boot.Nodes = append(boot.Nodes, &placementv1.Node{Id: uint64(i + 1), Zone: zones[i], RaftAddr: "r", ListenAddr: "l"})
		}
		st, res := ApplyMeta(st, &placementv1.Command{Command: &placementv1.Command_Bootstrap{Bootstrap: boot}})
		if res.GetError() != "" || CheckMap(st) != nil {
			rt.Fatalf("bootstrap: %s %v", res.GetError(), CheckMap(st))
		}
		seenShards := map[uint64]bool{FirstDataShard: true}
		maxEpoch := uint64(1)
		for range rapid.IntRange(1, 80).Draw(rt, "steps") {
			var cmd *placementv1.Command
			opID := func() uint64 {
				if len(st.GetOperators()) > 0 && rapid.Bool().Draw(rt, "current op") {
					return st.GetOperators()[0].GetId()
				}
				return rapid.Uint64Range(0, 5).Draw(rt, "op")
			}
			switch rapid.IntRange(0, 8).Draw(rt, "kind") {
			case 6:
				cmd = &placementv1.Command{Command: &placementv1.Command_BeginMove{BeginMove: &placementv1.BeginMoveCmd{
					Shard: rapid.Uint64Range(1, 4).Draw(rt, "move shard"), FromNode: rapid.Uint64Range(1, 5).Draw(rt, "from"), ToNode: rapid.Uint64Range(1, 5).Draw(rt, "to")}}}
			case 7:
				cmd = &placementv1.Command{Command: &placementv1.Command_AdvanceMove{AdvanceMove: &placementv1.AdvanceMoveCmd{
					OperatorId: opID(), To: placementv1.MoveStep(rapid.IntRange(0, 5).Draw(rt, "move to"))}}}
			case 8:
				cmd = &placementv1.Command{Command: &placementv1.Command_EndOperator{EndOperator: &placementv1.EndOperatorCmd{
					OperatorId: opID(), Rollback: rapid.Bool().Draw(rt, "rollback")}}}
			case 0:
				cmd = &placementv1.Command{Command: &placementv1.Command_RegisterNode{RegisterNode: &placementv1.RegisterNodeCmd{Node: &placementv1.Node{
					Id: rapid.Uint64Range(1, 5).Draw(rt, "node"), Zone: rapid.SampledFrom(zones).Draw(rt, "zone"), RaftAddr: "r", ListenAddr: "l"}}}}
			case 1:
				expected := st.GetEpochLimit()
				if rapid.Bool().Draw(rt, "stale limit") {
					expected = rapid.Uint64Range(0, 200).Draw(rt, "expected")
				}
				cmd = &placementv1.Command{Command: &placementv1.Command_ReserveEpochs{ReserveEpochs: &placementv1.ReserveEpochsCmd{
					ExpectedLimit: expected, Count: rapid.Uint64Range(0, 40).Draw(rt, "count")}}}
			case 2:
				var nodes []uint64
				for range rapid.IntRange(0, 4).Draw(rt, "replicas") {
					nodes = append(nodes, rapid.Uint64Range(1, 5).Draw(rt, "replica node"))
				}
				var at uint64
				if rapid.Bool().Draw(rt, "explicit split") {
					at = rapid.Uint64().Draw(rt, "split at")
				}
				cmd = &placementv1.Command{Command: &placementv1.Command_BeginSplit{BeginSplit: &placementv1.BeginSplitCmd{
					Source: rapid.Uint64Range(1, 6).Draw(rt, "source"), SplitAt: at,
					Epoch: rapid.Uint64Range(0, st.GetEpochLimit()+1).Draw(rt, "epoch"), Nodes: nodes}}}
			case 3, 4:
				cmd = &placementv1.Command{Command: &placementv1.Command_AdvanceSplit{AdvanceSplit: &placementv1.AdvanceSplitCmd{
					OperatorId: opID(), To: placementv1.SplitStep(rapid.IntRange(0, 5).Draw(rt, "to"))}}}
			case 5:
				cmd = &placementv1.Command{Command: &placementv1.Command_EndOperator{EndOperator: &placementv1.EndOperatorCmd{
					OperatorId: opID(), Rollback: rapid.Bool().Draw(rt, "rollback")}}}
			}
			next, res := ApplyMeta(st, cmd)
			if res.GetError() != "" && next != st {
				rt.Fatalf("refused %v (%s) but changed the state", cmd, res.GetError())
			}
			if err := CheckMap(next); err != nil {
				rt.Fatalf("after %v: %v\n%v", cmd, err, next)
			}
			if next.GetGeneration() < st.GetGeneration() || next.GetEpochLimit() < st.GetEpochLimit() {
				rt.Fatalf("after %v: generation %d→%d, epoch limit %d→%d", cmd, st.GetGeneration(), next.GetGeneration(), st.GetEpochLimit(), next.GetEpochLimit())
			}
			for _, s := range next.GetShards() {
				if !seenShards[s.GetId()] {
					if s.GetEpoch() <= maxEpoch || s.GetEpoch() >= next.GetEpochLimit() {
						rt.Fatalf("new shard %d has epoch %d; earlier shards reached %d, limit %d", s.GetId(), s.GetEpoch(), maxEpoch, next.GetEpochLimit())
					}
					seenShards[s.GetId()] = true
					maxEpoch = s.GetEpoch()
				}
				if s.GetState() == placementv1.ShardState_SHARD_STATE_PENDING && rangeOf(next, s.GetId()) >= 0 {
					rt.Fatalf("pending shard %d owns a range", s.GetId())
				}
				zones, ids := map[string]bool{}, map[uint64]bool{}
				for _, r := range s.GetReplicas() {
					z := nodeByID(next, r.GetNodeId()).GetZone()
					for _, op := range next.GetOperators() {
						if m := op.GetMove(); m.GetShard() == s.GetId() && m.GetToReplica() == r.GetReplicaId() {
							z = "" // a move within a zone has two replicas there until it ends
						}
					}
					if (z != "" && zones[z]) || ids[r.GetReplicaId()] || r.GetReplicaId() >= s.GetNextReplicaId() {
						rt.Fatalf("shard %d: replica %d on node %d (zone %q) repeats a zone or an id, or is not below next id %d: %v",
							s.GetId(), r.GetReplicaId(), r.GetNodeId(), z, s.GetNextReplicaId(), s)
					}
					zones[z], ids[r.GetReplicaId()] = true, true
				}
				if len(s.GetReplicas()) == 0 {
					rt.Fatalf("shard %d has no replica", s.GetId())
				}
			}
			if next.GetNextShardId() <= maxShardID(next) {
				rt.Fatalf("next shard id %d is not above every shard's", next.GetNextShardId())
			}
			st = next
		}
	})
}

func maxShardID(st *placementv1.State) uint64 {
	var m uint64
	for _, s := range st.GetShards() {
		m = max(m, s.GetId())
	}
	return m
}

// TestSplitOperatorCommits walks one split through its steps and checks
// the map it commits.
func TestSplitOperatorCommits(t *testing.T) {
	st := &placementv1.State{}
	apply := func(c *placementv1.Command) *placementv1.Result {
		t.Helper()
		var res *placementv1.Result
		st, res = ApplyMeta(st, c)
		if res.GetError() != "" {
			t.Fatalf("%v: %s", c, res.GetError())
		}
		if err := CheckMap(st); err != nil {
			t.Fatal(err)
		}
		return res
	}
	var nodes []*placementv1.Node
	for i := range 3 {
		nodes = append(nodes, &placementv1.Node{Id: uint64(i + 1), Zone: fmt.Sprintf("az%d", i+1), RaftAddr: "r", ListenAddr: "l"})
	}
	apply(&placementv1.Command{Command: &placementv1.Command_Bootstrap{Bootstrap: &placementv1.BootstrapCmd{Nodes: nodes}}})
	w := apply(&placementv1.Command{Command: &placementv1.Command_ReserveEpochs{ReserveEpochs: &placementv1.ReserveEpochsCmd{ExpectedLimit: 2, Count: EpochWindow}}})
	op := apply(&placementv1.Command{Command: &placementv1.Command_BeginSplit{BeginSplit: &placementv1.BeginSplitCmd{
		Source: 1, Epoch: w.GetEpochStart(), Nodes: []uint64{1, 2, 3}}}}).GetOperator()
	for to := placementv1.SplitStep_SPLIT_STEP_FENCED; to <= placementv1.SplitStep_SPLIT_STEP_COMMITTED; to++ {
		apply(&placementv1.Command{Command: &placementv1.Command_AdvanceSplit{AdvanceSplit: &placementv1.AdvanceSplitCmd{OperatorId: op.GetId(), To: to}}})
	}
	apply(&placementv1.Command{Command: &placementv1.Command_EndOperator{EndOperator: &placementv1.EndOperatorCmd{OperatorId: op.GetId()}}})
	if st.GetGeneration() != 2 || len(st.GetRanges()) != 2 || st.GetRanges()[1].GetStart() != 1<<63 || st.GetRanges()[1].GetShardId() != 2 || len(st.GetOperators()) != 0 {
		t.Fatalf("after the split: %v", st)
	}
}

// A replica whose binary applies an older placement command version than
// an entry needs stops on it (Update fails) and keeps its state as it
// was, rather than refuse it while newer replicas apply it.
func TestMetaEntryOfANewerVersionStopsTheReplica(t *testing.T) {
	m := NewMetaStateMachine(MetaShardID, 1)
	boot, _ := proto.Marshal(&placementv1.Command{Command: &placementv1.Command_Bootstrap{Bootstrap: &placementv1.BootstrapCmd{
		Nodes: []*placementv1.Node{{Id: 1, Zone: "a", RaftAddr: "r1", ListenAddr: "l1"}}}}})
	if _, err := m.Update(sm.Entry{Index: 1, Cmd: boot}); err != nil {
		t.Fatal(err)
	}
	before, _ := m.Lookup(nil)
	newer, _ := proto.Marshal(&placementv1.Command{Version: MetaCommandVersion + 1, Command: &placementv1.Command_RegisterNode{RegisterNode: &placementv1.RegisterNodeCmd{
		Node: &placementv1.Node{Id: 2, Zone: "b", RaftAddr: "r2", ListenAddr: "l2"}}}})
	if _, err := m.Update(sm.Entry{Index: 2, Cmd: newer}); !errors.Is(err, ErrMetaVersion) {
		t.Fatalf("an entry of version %d: %v, want ErrMetaVersion", MetaCommandVersion+1, err)
	}
	after, _ := m.Lookup(nil)
	if !proto.Equal(before.(*placementv1.State), after.(*placementv1.State)) {
		t.Fatal("the state changed on an entry this binary cannot apply")
	}
	current, _ := proto.Marshal(&placementv1.Command{Version: MetaCommandVersion, Command: &placementv1.Command_RegisterNode{RegisterNode: &placementv1.RegisterNodeCmd{
		Node: &placementv1.Node{Id: 2, Zone: "b", RaftAddr: "r2", ListenAddr: "l2"}}}})
	if _, err := m.Update(sm.Entry{Index: 2, Cmd: current}); err != nil {
		t.Fatalf("an entry of this binary's version: %v", err)
	}
}

// A command kind of a newer version needs that version, and is proposed
// only once every node registered a binary that applies it (a node that
// registered no version applies version 1).
func TestMetaVersionGate(t *testing.T) {
	move := &placementv1.Command{Command: &placementv1.Command_BeginMove{BeginMove: &placementv1.BeginMoveCmd{}}}
	split := &placementv1.Command{Command: &placementv1.Command_BeginSplit{BeginSplit: &placementv1.BeginSplitCmd{}}}
	if MetaVersionOf(move) != 1 || MetaVersionOf(split) != 1 || MetaVersionOf(&placementv1.Command{}) != 1 {
		t.Fatal("today every kind needs version 1")
	}
	metaKindVersions[7] = 2 // as if BeginMoveCmd (field 7) had appeared in version 2
	defer delete(metaKindVersions, 7)
	if MetaVersionOf(move) != 2 || MetaVersionOf(split) != 1 {
		t.Fatalf("versions %d and %d, want 2 for the move and 1 for the split", MetaVersionOf(move), MetaVersionOf(split))
	}
	st := &placementv1.State{Nodes: []*placementv1.Node{{Id: 1, MetaCommandVersion: 2}, {Id: 2, MetaCommandVersion: 2}, {Id: 3}}}
	if v := clusterMetaVersion(st); v != 1 {
		t.Fatalf("cluster version %d: node 3, which registered no version, counts as version 1", v)
	}
	if _, err := stampVersion(move, clusterMetaVersion(st)); !errors.Is(err, ErrMetaVersion) {
		t.Fatalf("a version-2 kind proposed while node 3 applies 1: %v, want ErrMetaVersion", err)
	}
	st.Nodes[2].MetaCommandVersion = 2
	if v := clusterMetaVersion(st); v != 2 {
		t.Fatalf("every node applies version 2, cluster version %d", v)
	}
	if got, err := stampVersion(split, clusterMetaVersion(st)); err != nil || got.GetVersion() != 2 {
		t.Fatalf("a version-1 kind in a version-2 cluster stamped %d, %v: want 2, so its newest rule decides", got.GetVersion(), err)
	}
	st.Nodes[0].MetaCommandVersion = MetaCommandVersion + 5
	for _, n := range st.Nodes[1:] {
		n.MetaCommandVersion = MetaCommandVersion + 5
	}
	if v := clusterMetaVersion(st); v != MetaCommandVersion {
		t.Fatalf("newer nodes: cluster version %d, want this binary's %d", v, MetaCommandVersion)
	}
	if v := clusterMetaVersion(&placementv1.State{}); v != 1 {
		t.Fatalf("before the bootstrap: version %d, want 1 (no node has said what it runs)", v)
	}
}

// A split proposed at version 2 creates a shard whose membership changes
// compare-and-set; at version 1 (a node still runs the binary before),
// the old rule creates it without, as the old binary's replicas do. A
// version-2 entry applied to a state where some node registered an older
// binary since the proposer looked is refused, on every replica alike.
func TestSplitOrderedConfigChangeByVersion(t *testing.T) {
	for _, tc := range []struct {
		version, node3 uint32
		ordered        bool
		refused        bool
	}{
		{version: 1, node3: 1, ordered: false},
		{version: 0, node3: 2, ordered: false}, // an entry from before versions
		{version: 1, node3: 2, ordered: false},
		{version: 2, node3: 2, ordered: true},
		{version: 2, node3: 1, refused: true},
	} {
		st := bootstrapped(t).st
		for _, n := range st.Nodes {
			n.MetaCommandVersion = 2
		}
		st.Nodes[2].MetaCommandVersion = tc.node3
		st.EpochLimit = 10
		next, res := ApplyMeta(st, &placementv1.Command{Version: tc.version, Command: &placementv1.Command_BeginSplit{
			BeginSplit: &placementv1.BeginSplitCmd{Source: FirstDataShard, Epoch: 2, Nodes: []uint64{1, 2, 3}}}})
		if tc.refused {
			if res.GetError() == "" || !strings.HasPrefix(res.GetError(), "version:") {
				t.Fatalf("%+v: %q, want a refusal naming the version", tc, res.GetError())
			}
			continue
		}
		if res.GetError() != "" {
			t.Fatalf("%+v: %s", tc, res.GetError())
		}
		target := shardByID(next, res.GetOperator().GetSplit().GetTarget())
		if target.GetOrderedConfigChange() != tc.ordered {
			t.Fatalf("%+v: ordered_config_change %v", tc, target.GetOrderedConfigChange())
		}
		if shardByID(next, FirstDataShard).GetOrderedConfigChange() {
			t.Fatal("the bootstrap's shard is never ordered: its replicas started before any version was known")
		}
	}
}

// FuzzMetaUpdate feeds arbitrary entries to the placement state machine:
// it never panics, and fails (stops) only on an entry of a newer version.
func FuzzMetaUpdate(f *testing.F) {
	for _, c := range []*placementv1.Command{
		{Command: &placementv1.Command_Bootstrap{Bootstrap: &placementv1.BootstrapCmd{Nodes: []*placementv1.Node{{Id: 1, Zone: "a", RaftAddr: "r", ListenAddr: "l"}}}}},
		{Version: 2, Command: &placementv1.Command_ReserveEpochs{ReserveEpochs: &placementv1.ReserveEpochsCmd{}}},
		{Command: &placementv1.Command_BeginSplit{BeginSplit: &placementv1.BeginSplitCmd{}}},
		{Version: 3, Command: &placementv1.Command_Auth{Auth: &placementv1.AuthCmd{Op: &placementv1.AuthCmd_PutRole{PutRole: &placementv1.Role{Name: "r", Grants: []*placementv1.Grant{{Permission: "lock"}}}}}}},
	} {
		b, _ := proto.Marshal(c)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m := NewMetaStateMachine(MetaShardID, 1)
		if _, err := m.Update(sm.Entry{Index: 1, Cmd: b}); err != nil && !errors.Is(err, ErrMetaVersion) {
			t.Fatalf("Update: %v", err)
		}
	})
}

// A node passing on a command from a newer one keeps the version it
// carries, never lowers it; a command of a kind this binary does not
// know (its field unknown here) is neither proposed nor applied: the
// proposer refuses it and a replica stops on it, where refusing it as
// "unknown" while newer replicas apply it would diverge.
func TestCommandsOfANewerBinary(t *testing.T) {
	move := &placementv1.Command{Version: 2, Command: &placementv1.Command_BeginMove{BeginMove: &placementv1.BeginMoveCmd{}}}
	if got, err := stampVersion(move, 2); err != nil || got.GetVersion() != 2 {
		t.Fatalf("a version-2 command stamped %v, %v: want 2 kept", got.GetVersion(), err)
	}
	if _, err := stampVersion(move, 1); !errors.Is(err, ErrMetaVersion) {
		t.Fatalf("a version-2 command where every node applies 1: %v, want it never lowered but refused", err)
	}
	if got, _ := stampVersion(&placementv1.Command{Command: &placementv1.Command_BeginMove{BeginMove: &placementv1.BeginMoveCmd{}}}, 1); got.GetVersion() != 1 {
		t.Fatalf("stamped %d, want 1", got.GetVersion())
	}
	b, _ := proto.Marshal(&placementv1.Command{Version: 1})
	b = protowire.AppendTag(b, 99, protowire.BytesType) // a future command kind
	b = protowire.AppendBytes(b, []byte{8, 1})
	newer := &placementv1.Command{}
	if err := proto.Unmarshal(b, newer); err != nil {
		t.Fatal(err)
	}
	if _, err := stampVersion(newer, MetaCommandVersion); !errors.Is(err, ErrMetaVersion) {
		t.Fatalf("proposing a kind this binary does not know: %v, want ErrMetaVersion", err)
	}
	m := NewMetaStateMachine(MetaShardID, 1)
	if _, err := m.Update(sm.Entry{Index: 1, Cmd: b}); !errors.Is(err, ErrMetaVersion) {
		t.Fatalf("applying it: %v, want the replica to stop (ErrMetaVersion)", err)
	}
	empty, _ := proto.Marshal(&placementv1.Command{})
	if res, err := m.Update(sm.Entry{Index: 1, Cmd: empty}); err != nil || res.Data == nil {
		t.Fatalf("an empty command is refused as before, not a stop: %v", err)
	}
}
