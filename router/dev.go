package router

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/warden-dev/warden/placement"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// DevConfig describes a whole cluster in one process: three nodes on
// loopback in zones az1, az2 and az3, each hosting a replica of the one
// data shard.
type DevConfig struct {
	// DataDir holds every node's data (node-1, node-2, node-3) and the
	// cluster's Raft addresses (dev-cluster.json), so that a second start
	// on the same directory recovers the same cluster.
	DataDir string
	// RTT, SnapshotEntries and CompactionOverhead are passed to every node.
	RTT                time.Duration
	SnapshotEntries    uint64
	CompactionOverhead uint64
	Router             Config
	// Observer, if set, also sees every hand-off each replica applies
	// (tests and the load harness use it to watch grants to waiters).
	Observer shard.ApplyObserver
}

// DevNodes is the number of nodes of a dev cluster.
const DevNodes = 3

// Dev is a running dev cluster.
type Dev struct {
	cfg   DevConfig
	addrs []string
	waits *WaitRegistry
	// Router routes over the nodes; Nodes[i] has id i+1 and zone az(i+1).
	Router *Router
	Nodes  []LocalNode
}

type devLayout struct {
	RaftAddrs []string `json:"raft_addrs"`
}

// StartDev starts (or restarts) a dev cluster in cfg.DataDir.
func StartDev(cfg DevConfig) (*Dev, error) {
	addrs, err := devAddrs(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	d := &Dev{cfg: cfg, addrs: addrs, Nodes: make([]LocalNode, DevNodes), waits: NewWaitRegistry()}
	for i := range DevNodes {
		if err := d.startNode(i); err != nil {
			d.closeNodes()
			return nil, err
		}
	}
	d.Router = New(d.Nodes, placement.SingleShard(), d.waits, cfg.Router)
	d.Router.Start()
	return d, nil
}

// Members maps replica id to Raft address for the data shard.
func (d *Dev) Members() map[uint64]string {
	m := map[uint64]string{}
	for i, a := range d.addrs {
		m[uint64(i+1)] = a
	}
	return m
}

func (d *Dev) startNode(i int) error {
	lead := NewLeadership()
	n, err := placement.StartNode(placement.NodeConfig{
		ID:                 uint64(i + 1),
		Zone:               fmt.Sprintf("az%d", i+1),
		RaftAddr:           d.addrs[i],
		DataDir:            filepath.Join(d.cfg.DataDir, fmt.Sprintf("node-%d", i+1)),
		RTT:                d.cfg.RTT,
		SnapshotEntries:    d.cfg.SnapshotEntries,
		CompactionOverhead: d.cfg.CompactionOverhead,
		Listener:           lead,
		Observer:           d.observe,
	})
	if err != nil {
		return err
	}
	if err := n.StartDataShard(placement.FirstDataShard, d.Members()); err != nil {
		n.Close()
		return err
	}
	// The slice is shared with the Router, which reads each entry's
	// fields only through the pointers set here before Start.
	d.Nodes[i].Node, d.Nodes[i].Leadership = n, lead
	return nil
}

func (d *Dev) observe(shardID uint64, res *shardv1.Result) {
	d.waits.Observe(shardID, res)
	if d.cfg.Observer != nil {
		d.cfg.Observer(shardID, res)
	}
}

// Close stops the router's timers and every node.
func (d *Dev) Close() {
	d.Router.Stop()
	d.closeNodes()
}

func (d *Dev) closeNodes() {
	for _, n := range d.Nodes {
		if n.Node != nil {
			n.Node.Close()
		}
	}
}

// devAddrs returns the cluster's Raft addresses, choosing free loopback
// ports on the first start and reusing them afterwards (a NodeHost refuses
// to open its data under another address).
func devAddrs(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "dev-cluster.json")
	var l devLayout
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &l); err != nil || len(l.RaftAddrs) != DevNodes {
			return nil, fmt.Errorf("router: %s is damaged: %v", path, err)
		}
		return l.RaftAddrs, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	for range DevNodes {
		a, err := FreeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		l.RaftAddrs = append(l.RaftAddrs, a)
	}
	b, _ = json.Marshal(l)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return nil, err
	}
	return l.RaftAddrs, nil
}

// FreeLoopbackAddr returns a 127.0.0.1 address whose port was free a
// moment ago.
func FreeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
