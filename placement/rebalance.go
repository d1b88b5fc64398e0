package placement

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// Action is one step of a rebalance or removal plan: add a replica of
// shard on node To (From 0), move it from node From to node To, drop it
// from node From (To 0), or move its leadership from node From to node
// To.
type Action struct {
	Kind     string // "add_replica", "move_replica", "drop_replica" or "transfer_leader"
	Shard    uint64
	From, To uint64
}

// PlanRebalance plans the steps that even out the cluster st, given
// which node leads each shard (leaders: shard id → node id, 0 unknown)
// and which nodes are live (nil: all):
//
//  0. A replica for each active shard with fewer than Replicas, in a
//     zone it has none in, on the live node of that zone holding fewest
//     (a forced removal left it short).
//  1. Replicas between the live nodes of one zone, so that within a zone
//     no node holds more than one replica above another (a move never
//     leaves its zone, so every shard keeps one replica per zone).
//  2. Leaders across nodes, so that no node leads more than
//     ceil(shards / nodes) shards, moving leadership to a replica on the
//     node leading fewest.
//
// It is pure; the plan applies to st as it was.
func PlanRebalance(st *placementv1.State, leaders map[uint64]uint64, live func(uint64) bool) []Action {
	leaders = maps.Clone(leaders)
	isLive := func(id uint64) bool { return live == nil || live(id) }
	hosts := replicaHosts(st)
	plan := planAddReplicas(st, hosts, isLive)
	plan = append(plan, planMoveReplicas(st, hosts, leaders, isLive)...)
	return append(plan, planTransferLeaders(st, hosts, leaders)...)
}

// replicaHosts maps each node of st, and each node a replica names, to
// the shards it hosts a replica of (none: a nil entry), in st's order.
func replicaHosts(st *placementv1.State) map[uint64][]uint64 {
	hosts := map[uint64][]uint64{}
	for _, n := range st.GetNodes() {
		hosts[n.GetId()] = nil
	}
	for _, s := range st.GetShards() {
		for _, r := range s.GetReplicas() {
			hosts[r.GetNodeId()] = append(hosts[r.GetNodeId()], s.GetId())
		}
	}
	return hosts
}

// planAddReplicas plans PlanRebalance's step 0, the replicas of active
// shards left short, and adds each to hosts as if made.
func planAddReplicas(st *placementv1.State, hosts map[uint64][]uint64, isLive func(uint64) bool) []Action {
	var plan []Action
	zoneOf := map[uint64]string{}
	for _, n := range st.GetNodes() {
		zoneOf[n.GetId()] = n.GetZone()
	}
	for _, s := range st.GetShards() {
		if s.GetState() != placementv1.ShardState_SHARD_STATE_ACTIVE {
			continue
		}
		has := map[string]bool{}
		for _, r := range s.GetReplicas() {
			has[zoneOf[r.GetNodeId()]] = true
		}
		for n := len(s.GetReplicas()); n < Replicas; n++ {
			to := uint64(0)
			for _, nd := range st.GetNodes() {
				if !has[nd.GetZone()] && isLive(nd.GetId()) && (to == 0 || len(hosts[nd.GetId()]) < len(hosts[to])) {
					to = nd.GetId()
				}
			}
			if to == 0 {
				break // no live node in a zone it lacks
			}
			plan = append(plan, Action{Kind: "add_replica", Shard: s.GetId(), To: to})
			has[zoneOf[to]] = true
			hosts[to] = append(hosts[to], s.GetId())
		}
	}
	return plan
}

// planMoveReplicas plans PlanRebalance's step 1, the moves within each
// zone (in zone order) from its most to its least loaded live node, and
// updates hosts as if made and leaders with the moved replicas'
// leaderships unknown (0).
func planMoveReplicas(st *placementv1.State, hosts map[uint64][]uint64, leaders map[uint64]uint64, isLive func(uint64) bool) []Action {
	var plan []Action
	zones := map[string][]uint64{}
	for _, n := range st.GetNodes() {
		if isLive(n.GetId()) {
			zones[n.GetZone()] = append(zones[n.GetZone()], n.GetId())
		}
	}
	for _, zone := range sortedKeys(zones) {
		nodes := zones[zone]
		for {
			slices.SortFunc(nodes, func(a, b uint64) int {
				return cmp.Or(cmp.Compare(len(hosts[a]), len(hosts[b])), cmp.Compare(a, b))
			})
			least, most := nodes[0], nodes[len(nodes)-1]
			if len(hosts[most])-len(hosts[least]) <= 1 {
				break
			}
			// Move a shard the least loaded node does not host yet.
			i := slices.IndexFunc(hosts[most], func(s uint64) bool { return !slices.Contains(hosts[least], s) })
			if i < 0 {
				break
			}
			s := hosts[most][i]
			plan = append(plan, Action{Kind: "move_replica", Shard: s, From: most, To: least})
			hosts[most] = slices.Delete(hosts[most], i, i+1)
			hosts[least] = append(hosts[least], s)
			if leaders[s] == most {
				leaders[s] = 0 // the moved replica's leadership goes elsewhere
			}
		}
	}
	return plan
}

// planTransferLeaders plans PlanRebalance's step 2 on hosts and leaders
// as steps 0 and 1 left them: each node (by id) leading more than its
// share hands its shards, the last in range order first, to the node
// hosting the shard that leads fewest; it stops within its share, or at
// the first shard no node can take within its own.
func planTransferLeaders(st *placementv1.State, hosts map[uint64][]uint64, leaders map[uint64]uint64) []Action {
	var plan []Action
	led := map[uint64][]uint64{} // node → shards it leads
	var shards []uint64
	for _, r := range st.GetRanges() {
		shards = append(shards, r.GetShardId())
		if l := leaders[r.GetShardId()]; l != 0 {
			led[l] = append(led[l], r.GetShardId())
		}
	}
	var nodes []uint64
	for id, hs := range hosts {
		if len(hs) > 0 {
			nodes = append(nodes, id)
		}
	}
	if len(nodes) == 0 {
		return plan
	}
	slices.Sort(nodes)
	share := (len(shards) + len(nodes) - 1) / len(nodes)
	for _, from := range nodes {
		for len(led[from]) > share {
			s := led[from][len(led[from])-1]
			// The node hosting s that leads fewest.
			to := uint64(0)
			for _, n := range nodes {
				if n != from && slices.Contains(hosts[n], s) && (to == 0 || len(led[n]) < len(led[to])) {
					to = n
				}
			}
			if to == 0 || len(led[to])+1 > share {
				break
			}
			plan = append(plan, Action{Kind: "transfer_leader", Shard: s, From: from, To: to})
			led[from] = led[from][:len(led[from])-1]
			led[to] = append(led[to], s)
		}
	}
	return plan
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// PlanRemoval plans the moves that take every replica off node id: each
// to the live node (live nil: every node) of id's zone that hosts no
// replica of the shard and holds fewest, counting the moves planned
// before it. A replica with no such node is dropped ("drop_replica", To
// 0) when force allows it (never leaving its shard below two replicas),
// and otherwise the plan is refused, naming the first shard that would
// be left below three replicas in three zones. It is pure.
func PlanRemoval(st *placementv1.State, id uint64, live func(uint64) bool, force bool) ([]Action, error) {
	node := nodeByID(st, id)
	if node == nil {
		return nil, fmt.Errorf("node_id: node %d is not in the map", id)
	}
	load := ReplicaLoad(st)
	var plan []Action
	for _, sh := range st.GetShards() {
		hosts := func(n uint64) bool {
			return slices.ContainsFunc(sh.GetReplicas(), func(r *placementv1.Replica) bool { return r.GetNodeId() == n })
		}
		if !hosts(id) {
			continue
		}
		var to uint64
		for _, n := range st.GetNodes() {
			if n.GetId() == id || hosts(n.GetId()) || n.GetZone() != node.GetZone() || (live != nil && !live(n.GetId())) {
				continue
			}
			if to == 0 || load[n.GetId()] < load[to] {
				to = n.GetId()
			}
		}
		switch {
		case to != 0:
			load[to]++
			plan = append(plan, Action{Kind: "move_replica", Shard: sh.GetId(), From: id, To: to})
		case force && len(sh.GetReplicas()) > minReplicas:
			plan = append(plan, Action{Kind: "drop_replica", Shard: sh.GetId(), From: id})
		case force:
			return nil, fmt.Errorf("shard %d has %d replicas: dropping node %d's would leave it below %d, even forced; add a node in zone %q first",
				sh.GetId(), len(sh.GetReplicas()), id, minReplicas, node.GetZone())
		default:
			return nil, fmt.Errorf("shard %d would be left below three replicas in three zones: no other live node in zone %q to take node %d's replica; add one first, or force the removal",
				sh.GetId(), node.GetZone(), id)
		}
	}
	return plan, nil
}

// PlanPlacementVoter returns the node to add as a voter of the placement
// group whose membership is m, or 0: while the group has fewer than
// Replicas voters (a forced removal took one without a replacement), the
// live node (live nil: every node) of a zone without a voter that hosts
// fewest data replicas, its lowest id on a tie. It is pure.
func PlanPlacementVoter(st *placementv1.State, m *placementv1.MembershipResponse, live func(uint64) bool) uint64 {
	zones := map[string]bool{}
	voters := 0
	for v := range m.GetVoting() {
		if n := nodeByID(st, v); n != nil {
			zones[n.GetZone()] = true
			voters++
		}
	}
	if voters >= Replicas {
		return 0
	}
	load := ReplicaLoad(st)
	var to uint64
	for _, n := range st.GetNodes() { // sorted by id
		if zones[n.GetZone()] || (live != nil && !live(n.GetId())) || removing(st, n.GetId()) != nil {
			continue
		}
		if to == 0 || load[n.GetId()] < load[to] {
			to = n.GetId()
		}
	}
	return to
}

// ReplicaLoad counts the data replicas each node of st hosts.
func ReplicaLoad(st *placementv1.State) map[uint64]int {
	load := map[uint64]int{}
	for _, sh := range st.GetShards() {
		for _, r := range sh.GetReplicas() {
			load[r.GetNodeId()]++
		}
	}
	return load
}
