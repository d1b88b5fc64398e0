package placement

import (
	"cmp"
	"maps"
	"slices"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// Action is one step of a rebalance plan: move shard's replica, or its
// leadership, from node From to node To.
type Action struct {
	Kind     string // "move_replica" or "transfer_leader"
	Shard    uint64
	From, To uint64
}

// PlanRebalance plans the moves that even out the cluster st, given
// which node leads each shard (leaders: shard id → node id, 0 unknown):
//
//  1. Replicas between nodes of one zone, so that within a zone no node
//     holds more than one replica above another (a move never leaves its
//     zone, so every shard keeps one replica per zone).
//  2. Leaders across nodes, so that no node leads more than
//     ceil(shards / nodes) shards, moving leadership to a replica on the
//     node leading fewest.
//
// It is pure; the plan applies to st as it was.
func PlanRebalance(st *placementv1.State, leaders map[uint64]uint64) []Action {
	var plan []Action
	leaders = maps.Clone(leaders)
	hosts := map[uint64][]uint64{} // node → shards it hosts a replica of
	for _, n := range st.GetNodes() {
		hosts[n.GetId()] = nil
	}
	for _, s := range st.GetShards() {
		for _, r := range s.GetReplicas() {
			hosts[r.GetNodeId()] = append(hosts[r.GetNodeId()], s.GetId())
		}
	}
	zones := map[string][]uint64{}
	for _, n := range st.GetNodes() {
		zones[n.GetZone()] = append(zones[n.GetZone()], n.GetId())
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
