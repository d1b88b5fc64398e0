package router

import (
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// The replicas' Raft state, read at each scrape from every running
// router's local replicas (a process runs one router; a test process may
// run several): whether each has a leader and is it, its term, its
// applied index, and how many replicas the map gives its shard. A
// replica's lag is a query away:
//
//	max by (shard) (warden_shard_applied_index) - warden_shard_applied_index
//
// Labels are bounded by the replicas a process hosts: shard (the shard
// id, "placement" for the placement group) and node.
var (
	hasLeaderDesc = prometheus.NewDesc("warden_shard_has_leader",
		"1 if this node's replica of the shard knows a leader, else 0.", []string{"shard", "node"}, nil)
	isLeaderDesc = prometheus.NewDesc("warden_shard_is_leader",
		"1 if this node's replica of the shard is its leader, else 0.", []string{"shard", "node"}, nil)
	termDesc = prometheus.NewDesc("warden_shard_term",
		"The Raft term this node's replica of the shard knows.", []string{"shard", "node"}, nil)
	appliedDesc = prometheus.NewDesc("warden_shard_applied_index",
		"The last Raft log index this node's replica of a data shard applied.", []string{"shard", "node"}, nil)
	replicasDesc = prometheus.NewDesc("warden_shard_replicas",
		"How many replicas the placement map gives a data shard (three, one per zone; two after a forced node removal until a rebalance adds one), as the node hosting this replica of it reads the map.", []string{"shard", "node"}, nil)
	diskUsedDesc = prometheus.NewDesc("warden_disk_used_bytes",
		"Bytes a node's data take on disk, by kind: raft_log (Dragonboat's NodeHost and WAL) or state_machine (the replicas' Pebble stores).", []string{"node", "kind"}, nil)
	diskSizeDesc = prometheus.NewDesc("warden_disk_size_bytes",
		"Size of the filesystem holding a node's data directory.", []string{"node"}, nil)
	diskFreeDesc = prometheus.NewDesc("warden_disk_free_bytes",
		"Bytes free (to an unprivileged user) on the filesystem holding a node's data directory.", []string{"node"}, nil)
	diskLowDesc = prometheus.NewDesc("warden_disk_low",
		"1 while a node's data directory has less free space than its reserve (wardend --disk-reserve) and the node refuses writes, else 0.", []string{"node"}, nil)
)

// replicaCollector collects the replica metrics of the routers running
// in this process (Start adds one, Stop removes it).
type replicaCollector struct {
	mu      sync.Mutex
	routers map[*Router]bool
}

var replicas = &replicaCollector{routers: map[*Router]bool{}}

func init() { prometheus.MustRegister(replicas) }

func (c *replicaCollector) add(r *Router) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.routers[r] = true
}

func (c *replicaCollector) remove(r *Router) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.routers, r)
}

func (c *replicaCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{hasLeaderDesc, isLeaderDesc, termDesc, appliedDesc, replicasDesc, diskUsedDesc, diskSizeDesc, diskFreeDesc, diskLowDesc} {
		ch <- d
	}
}

func (c *replicaCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	routers := make([]*Router, 0, len(c.routers))
	for r := range c.routers {
		routers = append(routers, r)
	}
	c.mu.Unlock()
	for _, r := range routers {
		r.collectReplicas(ch)
	}
}

// collectReplicas sends the metrics of r's local replicas.
func (r *Router) collectReplicas(ch chan<- prometheus.Metric) {
	m := r.Map()
	gauge := func(d *prometheus.Desc, v float64, shard, node string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, shard, node)
	}
	for i := range r.nodes {
		n := &r.nodes[i]
		node := strconv.FormatUint(n.ID, 10)
		raftStateOf(n, placement.MetaShardID, n.ID, "placement", node, gauge) // meta replica id = node id
		if n.Node != nil {
			raftLog, sm := n.Node.DiskUsage()
			ch <- prometheus.MustNewConstMetric(diskUsedDesc, prometheus.GaugeValue, float64(raftLog), node, "raft_log")
			ch <- prometheus.MustNewConstMetric(diskUsedDesc, prometheus.GaugeValue, float64(sm), node, "state_machine")
			if size, free, err := n.Node.DiskSpace(); err == nil {
				ch <- prometheus.MustNewConstMetric(diskSizeDesc, prometheus.GaugeValue, float64(size), node)
				ch <- prometheus.MustNewConstMetric(diskFreeDesc, prometheus.GaugeValue, float64(free), node)
			}
			low := 0.0
			if n.Node.WritesRefused() != nil {
				low = 1
			}
			ch <- prometheus.MustNewConstMetric(diskLowDesc, prometheus.GaugeValue, low, node)
		}
		for _, id := range m.DataShards() {
			reps := m.Shard(id).GetReplicas()
			at := slices.IndexFunc(reps, func(rep *placementv1.Replica) bool { return rep.GetNodeId() == n.ID })
			if at < 0 {
				continue
			}
			shard := strconv.FormatUint(id, 10)
			if !raftStateOf(n, id, reps[at].GetReplicaId(), shard, node, gauge) {
				continue
			}
			gauge(replicasDesc, float64(len(reps)), shard, node)
			if out, err := n.Raft.StaleRead(id, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}}); err == nil {
				gauge(appliedDesc, float64(out.GetAppliedIndex()), shard, node)
			}
		}
	}
}

// raftStateOf sends the leader and term gauges of node n's replica
// replicaID of shardID, and reports whether it runs here.
func raftStateOf(n *LocalNode, shardID, replicaID uint64, shard, node string, gauge func(*prometheus.Desc, float64, string, string)) bool {
	leader, term, valid, err := n.Raft.LeaderOf(shardID)
	if err != nil {
		return false
	}
	has, is := 0.0, 0.0
	if valid && leader != 0 {
		has = 1
		if leader == replicaID {
			is = 1
		}
	}
	gauge(hasLeaderDesc, has, shard, node)
	gauge(isLeaderDesc, is, shard, node)
	gauge(termDesc, float64(term), shard, node)
	return true
}
