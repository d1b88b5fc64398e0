package placement

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

func removeNodeCmd(id uint64) *placementv1.Command {
	return &placementv1.Command{Command: &placementv1.Command_RemoveNode{RemoveNode: &placementv1.RemoveNodeCmd{NodeId: id}}}
}

// A node leaves the map only without replicas and operators, and its id
// is never registered again; the command needs version 5, which is not
// proposed while a node runs an older binary.
func TestRemoveNode(t *testing.T) {
	st := backedUpState()
	for _, n := range st.Nodes {
		n.MetaCommandVersion = MetaCommandVersion
	}
	four := &placementv1.Node{Id: 4, Zone: "az1", RaftAddr: "r4", ListenAddr: "l4", MetaCommandVersion: MetaCommandVersion}
	st, res := ApplyMeta(st, &placementv1.Command{Command: &placementv1.Command_RegisterNode{RegisterNode: &placementv1.RegisterNodeCmd{Node: four}}})
	if res.GetError() != "" {
		t.Fatal(res.GetError())
	}
	if _, res := ApplyMeta(st, removeNodeCmd(1)); !strings.Contains(res.GetError(), "still hosts replica 1 of shard 1") {
		t.Fatalf("removing a node with replicas: %v", res)
	}
	if _, res := ApplyMeta(st, removeNodeCmd(9)); !strings.Contains(res.GetError(), "not in the map") {
		t.Fatalf("removing an unknown node: %v", res)
	}
	moving := proto.CloneOf(st)
	moving.Operators = []*placementv1.Operator{{Id: 7, Kind: &placementv1.Operator_Move{Move: &placementv1.MoveOp{Shard: 1, FromNode: 1, ToNode: 4}}}}
	if _, res := ApplyMeta(moving, removeNodeCmd(4)); !strings.Contains(res.GetError(), "operator 7") {
		t.Fatalf("removing a node a move names: %v", res)
	}
	cmd, err := stampVersion(removeNodeCmd(4), clusterMetaVersion(st))
	if err != nil || cmd.GetVersion() != MetaCommandVersion {
		t.Fatalf("stamped %v, %v", cmd.GetVersion(), err)
	}
	after, res := ApplyMeta(st, cmd)
	if res.GetError() != "" || nodeByID(after, 4) != nil || len(after.GetRemovedNodeIds()) != 1 || after.GetRemovedNodeIds()[0] != 4 {
		t.Fatalf("removal: %v, state nodes %v removed %v", res, after.GetNodes(), after.GetRemovedNodeIds())
	}
	if _, res := ApplyMeta(after, &placementv1.Command{Command: &placementv1.Command_RegisterNode{RegisterNode: &placementv1.RegisterNodeCmd{Node: four}}}); !strings.Contains(res.GetError(), "never used again") {
		t.Fatalf("a removed node registering again: %v", res)
	}
	old := proto.CloneOf(st)
	old.Nodes[0].MetaCommandVersion = 4
	if err := Proposable(old, removeNodeCmd(4)); !errors.Is(err, ErrMetaVersion) {
		t.Fatalf("a removal beside a version 4 node: %v", err)
	}
}
