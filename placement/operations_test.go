package placement

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// movesState is backedUpState with node 4 in az1, every node at this
// binary's placement command version.
func movesState(t testing.TB) *placementv1.State {
	t.Helper()
	st := backedUpState()
	for _, n := range st.Nodes {
		n.MetaCommandVersion = MetaCommandVersion
	}
	st, res := ApplyMeta(st, &placementv1.Command{Command: &placementv1.Command_RegisterNode{RegisterNode: &placementv1.RegisterNodeCmd{
		Node: &placementv1.Node{Id: 4, Zone: "az1", RaftAddr: "r4", ListenAddr: "l4", MetaCommandVersion: MetaCommandVersion}}}})
	if res.GetError() != "" {
		t.Fatal(res.GetError())
	}
	return st
}

func beginMoveCmd(v uint32, requestID string, from, to uint64) *placementv1.Command {
	return &placementv1.Command{Version: v, Command: &placementv1.Command_BeginMove{BeginMove: &placementv1.BeginMoveCmd{Shard: 1, FromNode: from, ToNode: to, RequestId: requestID}}}
}

// endMove walks move op through its steps and ends it at version v.
func endMove(t *testing.T, st *placementv1.State, op uint64, v uint32) *placementv1.State {
	t.Helper()
	for to := placementv1.MoveStep_MOVE_STEP_ADDED; to <= placementv1.MoveStep_MOVE_STEP_REMOVED; to++ {
		var res *placementv1.Result
		if st, res = ApplyMeta(st, &placementv1.Command{Version: v, Command: &placementv1.Command_AdvanceMove{AdvanceMove: &placementv1.AdvanceMoveCmd{OperatorId: op, To: to}}}); res.GetError() != "" {
			t.Fatal(res.GetError())
		}
	}
	st, res := ApplyMeta(st, &placementv1.Command{Version: v, Command: &placementv1.Command_EndOperator{EndOperator: &placementv1.EndOperatorCmd{OperatorId: op}}})
	if res.GetError() != "" {
		t.Fatal(res.GetError())
	}
	return st
}

// Version 6: a begin with a request id that an operator in progress or
// ended has returns that operator and changes nothing (a retry after a
// lost answer does not move twice); the same id for another operation
// is refused naming the field; ended operators are kept, the last 64.
func TestOperationRequestID(t *testing.T) {
	st := movesState(t)
	st, res := ApplyMeta(st, beginMoveCmd(6, "move-a", 1, 4))
	op := res.GetOperator()
	if res.GetError() != "" || op.GetRequestId() != "move-a" {
		t.Fatalf("begin: %v", res)
	}
	again, res := ApplyMeta(st, beginMoveCmd(6, "move-a", 1, 4))
	if res.GetError() != "" || res.GetOperator().GetId() != op.GetId() || !proto.Equal(again, st) {
		t.Fatalf("the same begin again: %v, state changed: %v", res, !proto.Equal(again, st))
	}
	if _, res := ApplyMeta(st, beginMoveCmd(6, "move-a", 2, 4)); !strings.HasPrefix(res.GetError(), "request_id: ") {
		t.Fatalf("the id for another move: %v", res)
	}
	for _, bad := range []string{strings.Repeat("x", MaxRequestID+1), "\x1b[31mred", "tab\there", "\xff\xfe"} {
		if _, res := ApplyMeta(st, beginMoveCmd(6, bad, 1, 4)); !strings.HasPrefix(res.GetError(), "request_id: ") {
			t.Fatalf("request id %q: %v", bad, res)
		}
	}
	ended := endMove(t, st, op.GetId(), 6)
	if len(ended.GetOperators()) != 0 || len(ended.GetFinishedOperators()) != 1 || ended.GetFinishedOperators()[0].GetMove().GetStep() != placementv1.MoveStep_MOVE_STEP_REMOVED {
		t.Fatalf("after the end: running %v, kept %v", ended.GetOperators(), ended.GetFinishedOperators())
	}
	after, res := ApplyMeta(ended, beginMoveCmd(6, "move-a", 1, 4))
	if res.GetError() != "" || res.GetOperator().GetId() != op.GetId() || !proto.Equal(after, ended) {
		t.Fatalf("the begin again after the end: %v", res)
	}
	if got, running := FindOperator(ended, 0, "move-a"); got.GetId() != op.GetId() || running {
		t.Fatalf("FindOperator by request id: %v running %v", got, running)
	}

	// Ended operators beyond 64 drop the oldest.
	for i := range finishedKept {
		from, to := uint64(4), uint64(1)
		if i%2 == 1 {
			from, to = 1, 4
		}
		var res *placementv1.Result
		if ended, res = ApplyMeta(ended, beginMoveCmd(6, fmt.Sprintf("m%d", i), from, to)); res.GetError() != "" {
			t.Fatal(res.GetError())
		}
		ended = endMove(t, ended, res.GetOperator().GetId(), 6)
	}
	if kept := ended.GetFinishedOperators(); len(kept) != finishedKept || kept[0].GetRequestId() != "m0" {
		t.Fatalf("kept %d, the oldest %q: want %d from m0", len(kept), kept[0].GetRequestId(), finishedKept)
	}
}

// Before version 6 the old rules hold for the entries that carry an
// older version: an ended operator is not kept, and a request id (which
// no proposer sends below 6) is ignored; a request id is not proposed
// while a node runs a version-5 binary.
func TestOperationsBeforeVersion6(t *testing.T) {
	st := movesState(t)
	st, res := ApplyMeta(st, beginMoveCmd(5, "move-a", 1, 4))
	if res.GetError() != "" || res.GetOperator().GetRequestId() != "" {
		t.Fatalf("a version 5 begin: %v", res)
	}
	if ended := endMove(t, st, res.GetOperator().GetId(), 5); len(ended.GetFinishedOperators()) != 0 {
		t.Fatalf("a version 5 end kept %v", ended.GetFinishedOperators())
	}
	old := movesState(t)
	old.Nodes[2].MetaCommandVersion = 5
	if err := Proposable(old, beginMoveCmd(0, "move-a", 1, 4)); !errors.Is(err, ErrMetaVersion) {
		t.Fatalf("a request id beside a version 5 node: %v", err)
	}
	if err := Proposable(old, beginMoveCmd(0, "", 1, 4)); err != nil {
		t.Fatalf("a move without one: %v", err)
	}
}
