package placement

import (
	"fmt"
	"testing"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// Four shards on nodes 1..3 (one per zone) all led from node 1, and a
// fourth node in az1 holding nothing: the plan moves two replicas from
// node 1 to node 4 (within az1) and spreads the leaders so that no node
// leads more than one of the four shards.
func TestPlanRebalance(t *testing.T) {
	st := &placementv1.State{}
	for i, z := range []string{"az1", "az2", "az3", "az1"} {
		st.Nodes = append(st.Nodes, &placementv1.Node{Id: uint64(i + 1), Zone: z})
	}
	leaders := map[uint64]uint64{}
	for s := uint64(1); s <= 4; s++ {
		sh := &placementv1.Shard{Id: s}
		for n := uint64(1); n <= 3; n++ {
			sh.Replicas = append(sh.Replicas, &placementv1.Replica{ReplicaId: n, NodeId: n})
		}
		st.Shards = append(st.Shards, sh)
		st.Ranges = append(st.Ranges, &shardv1.RangeDescriptor{ShardId: s})
		leaders[s] = 1
	}
	plan := PlanRebalance(st, leaders, nil)
	replicas := map[uint64]int{1: 4, 2: 4, 3: 4, 4: 0}
	led := map[uint64]int{1: 4}
	for _, a := range plan {
		switch a.Kind {
		case "move_replica":
			if a.From != 1 || a.To != 4 {
				t.Fatalf("move across zones or from the wrong node: %+v", a)
			}
			replicas[a.From]--
			replicas[a.To]++
			if leaders[a.Shard] == a.From {
				led[a.From]--
				leaders[a.Shard] = 0
			}
		case "transfer_leader":
			led[a.From]--
			led[a.To]++
		}
	}
	if replicas[1] != 2 || replicas[4] != 2 {
		t.Fatalf("replicas after the plan %v:\n%v", replicas, fmt.Sprint(plan))
	}
	for n, k := range led {
		if k > 1 {
			t.Fatalf("node %d leads %d shards after the plan %v", n, k, plan)
		}
	}
	if again := PlanRebalance(st, map[uint64]uint64{1: 1, 2: 2, 3: 3, 4: 4}, nil); len(again) != 2 {
		t.Fatalf("with leaders spread, only the two replica moves remain: %v", again)
	}
}
