package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warden-dev/warden/placement"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/shard"
)

// DevConfig describes a whole cluster in one process: three nodes on
// loopback in zones az1, az2 and az3, each hosting a replica of the
// placement group and of every data shard.
type DevConfig struct {
	// DataDir holds every node's data (node-1, node-2, node-3) and the
	// cluster's Raft addresses (dev-cluster.json), so that a second start
	// on the same directory recovers the same cluster.
	DataDir string
	// ListenAddr is the Connect address the process serves (shown in the
	// placement map; default 127.0.0.1:7070).
	ListenAddr string
	// RTT, SnapshotEntries and CompactionOverhead are passed to every node.
	RTT                time.Duration
	SnapshotEntries    uint64
	CompactionOverhead uint64
	Router             router.Config
	// Observer, if set, also sees every hand-off each replica applies
	// (tests and the load harness use it to watch grants to waiters).
	Observer shard.ApplyObserver
	// BuildVersion is the binary's version, registered by every node.
	BuildVersion string
}

// DevNodes is the number of nodes of a dev cluster.
const DevNodes = 3

// Dev is a running dev cluster: Nodes[i] has id i+1 and zone az(i+1).
type Dev = Cluster

type devLayout struct {
	RaftAddrs []string `json:"raft_addrs"`
}

// StartDev starts (or restarts) a dev cluster in cfg.DataDir.
func StartDev(cfg DevConfig) (*Dev, error) {
	addrs, err := devAddrs(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = "127.0.0.1:7070"
	}
	cc := ClusterConfig{ListenAddr: cfg.ListenAddr, RTT: cfg.RTT, SnapshotEntries: cfg.SnapshotEntries,
		CompactionOverhead: cfg.CompactionOverhead, Router: cfg.Router, Observer: cfg.Observer, BuildVersion: cfg.BuildVersion}
	var fresh, kept []string
	for i, a := range addrs {
		id := uint64(i + 1)
		dir := filepath.Join(cfg.DataDir, fmt.Sprintf("node-%d", i+1))
		cc.Nodes = append(cc.Nodes, NodeSpec{ID: id, Zone: fmt.Sprintf("az%d", i+1), RaftAddr: a, DataDir: dir})
		cc.Members = append(cc.Members, Member{ID: id, RaftAddr: a, ListenAddr: cfg.ListenAddr})
		if placement.HasState(dir) {
			kept = append(kept, dir)
		} else {
			fresh = append(fresh, dir)
		}
	}
	// The whole cluster lives in DataDir: with no state anywhere it is a
	// new cluster. One node's data gone while the others' is kept is a
	// node that lost what it acknowledged, refused as in production.
	if len(kept) > 0 && len(fresh) > 0 {
		return nil, fmt.Errorf("server: dev cluster: %s hold state but %s do not: a node that lost its data must not rejoin; "+
			"restore it, or delete %s to start a new dev cluster", strings.Join(kept, ", "), strings.Join(fresh, ", "), cfg.DataDir)
	}
	cc.NewCluster = len(kept) == 0
	return StartCluster(cc)
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
			return nil, fmt.Errorf("server: %s is damaged: %v", path, err)
		}
		return l.RaftAddrs, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	for len(l.RaftAddrs) < DevNodes {
		a, err := FreeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		// Each pick was free a moment ago, so two picks may be the same
		// port (1 in about 7,600 dev starts): Dragonboat panics on a
		// membership with a duplicated address.
		if !slices.Contains(l.RaftAddrs, a) {
			l.RaftAddrs = append(l.RaftAddrs, a)
		}
	}
	b, _ = json.Marshal(l)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return nil, err
	}
	return l.RaftAddrs, nil
}

// FreeLoopbackAddr returns a 127.0.0.1 address whose port was free a
// moment ago (FreeAddrOn).
func FreeLoopbackAddr() (string, error) { return FreeAddrOn("127.0.0.1") }

// FreeAddrOn returns an address on the local IP host whose port was free
// a moment ago. It picks at random below the kernel's ephemeral range
// (ip_local_port_range): a port from that range, free now, can be taken
// by any outgoing connection before the caller binds it.
func FreeAddrOn(host string) (string, error) {
	low := ephemeralLow()
	for range 100 {
		port := 10_000 + rand.IntN(low-10_000)
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			continue
		}
		l.Close()
		return l.Addr().String(), nil
	}
	return "", fmt.Errorf("server: no free port on %s below the ephemeral range", host)
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux;
// 32768 where it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 11_000 {
				return v
			}
		}
	}
	return 32768
}
