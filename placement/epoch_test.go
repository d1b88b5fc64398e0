package placement

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// metaGroup is three nodes in this process hosting the placement group,
// on free loopback ports, each started from cfg with its identity filled
// in; Close closes those still running.
type metaGroup struct {
	t       *testing.T
	dir     string
	cfg     NodeConfig
	members map[uint64]string
	nodes   map[uint64]*Node
}

// startMetaGroup starts and bootstraps a metaGroup, closed at the test's
// end.
func startMetaGroup(t *testing.T, ctx context.Context, cfg NodeConfig) *metaGroup {
	g := &metaGroup{t: t, dir: t.TempDir(), cfg: cfg, members: map[uint64]string{}, nodes: map[uint64]*Node{}}
	for id := uint64(1); id <= 3; id++ {
		g.members[id] = freeAddr(t)
	}
	t.Cleanup(func() {
		for _, n := range g.nodes {
			n.Close()
		}
	})
	for id := range g.members {
		g.start(id)
	}
	var initial []*placementv1.Node
	for id, a := range g.members {
		initial = append(initial, &placementv1.Node{Id: id, Zone: fmt.Sprintf("az%d", id), RaftAddr: a, ListenAddr: a})
	}
	if _, err := Bootstrap(ctx, g.nodes[1].Meta(), BootstrapCommand(initial), initial[0], Identity{NodeID: initial[0].GetId()}); err != nil {
		t.Fatal(err)
	}
	return g
}

// start starts node id (again), with its replica of the placement group.
func (g *metaGroup) start(id uint64) {
	cfg := g.cfg
	cfg.ID, cfg.Zone, cfg.RaftAddr, cfg.DataDir = id, fmt.Sprintf("az%d", id), g.members[id], filepath.Join(g.dir, fmt.Sprint(id))
	n, err := StartNode(cfg)
	if err != nil {
		g.t.Fatal(err)
	}
	if err := n.StartMeta(g.members, false); err != nil {
		g.t.Fatal(err)
	}
	g.nodes[id] = n
}

// The epoch allocator across placement leader failures: three nodes host
// the placement group; a fresh allocator on the current leader hands out
// epochs, then the leader is stopped (its window is lost with it) and
// restarted, five times over. Every epoch handed out is above every
// earlier one.
func TestEpochsIncreaseAcrossLeaderKills(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g := startMetaGroup(t, ctx, NodeConfig{})
	nodes := g.nodes
	leader := func() uint64 {
		for ctx.Err() == nil {
			for _, n := range nodes {
				if id, _, ok, err := n.NodeHost().GetLeaderID(MetaShardID); err == nil && ok && id != 0 && nodes[id] != nil {
					return id
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatal("no placement leader")
		return 0
	}
	var last uint64
	for round := range 5 {
		id := leader()
		alloc := NewAllocator(nodes[id].Meta())
		for range 1 + round*10 { // some rounds use part of a window, some more than one
			var e uint64
			var err error
			for e == 0 && ctx.Err() == nil {
				if e, err = alloc.Next(ctx); err != nil {
					t.Logf("round %d: %v", round, err)
					time.Sleep(20 * time.Millisecond) // an election after the last stop
				}
			}
			if e <= last {
				t.Fatalf("round %d: epoch %d after %d", round, e, last)
			}
			last = e
		}
		nodes[id].Close()
		delete(nodes, id)
		g.start(id)
	}
	t.Logf("last epoch %d after 5 leader stops", last)
}
