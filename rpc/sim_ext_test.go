package rpc_test

import (
	"context"
	"flag"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/anishathalye/porcupine"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router/routertest"
	"github.com/warden-dev/warden/rpc"
	"github.com/warden-dev/warden/shard"
)

// TestSimulatedAPI runs the lock clients of the real-cluster histories
// (runLinClients: Acquire alone and as a Batch op, Release, stale
// Releases, Describe, answers thrown away and retried with the same ids)
// against the whole API layer of three nodes, each over its own router,
// over routertest's modelled Raft group, in a synctest bubble: virtual
// time, faults drawn from a seed (leader changes with late reports, the
// deposed leader believing it leads for up to a second; dropped, hung
// and answer-lost proposals; dropped reads). Each call goes to a node
// drawn at random, which serves or forwards it through the routing
// interceptor as over the network, in memory. Porcupine checks every
// history with the lock model. Each run prints its seed; -api.seed
// replays its faults.
var (
	apiSeed  = flag.Uint64("api.seed", 0, "TestSimulatedAPI: run this seed only (0: -api.seeds seeds drawn at random)")
	apiSeeds = flag.Int("api.seeds", 4, "TestSimulatedAPI: how many random seeds to run")
)

func TestSimulatedAPI(t *testing.T) {
	seeds := routertest.Seeds(*apiSeed, *apiSeeds)
	total := routertest.Run(t, seeds, runAPISimulation, func(t *testing.T, seed uint64, ops []porcupine.Operation) {
		t.Logf("%d operations", len(ops))
		checkLinearizable(t, ops)
	})
	// The premises: the faults happened in the runs.
	routertest.Happened(t, total, len(seeds), 2, "leader change", "dropped", "answer lost", "hung", "forwarded")
}

// runAPISimulation runs one seed and returns its history: the group's
// leader changes for 6 s of virtual time while the clients call.
func runAPISimulation(t *testing.T, seed uint64) ([]porcupine.Operation, map[string]int) {
	g := routertest.NewGroup(t, shard.FirstShard, 3, seed, routertest.Faults{Drop: 0.04, LoseAnswer: 0.04, Hang: 0.03, DropRead: 0.04})
	c := routertest.NewCluster(g)
	s := &spreadLocks{rng: rand.New(rand.NewPCG(seed, 1))}
	for id, r := range c.Routers {
		c.Serve(id, rpc.NewHandler(r))
		s.nodes = append(s.nodes, wardenv1connect.NewLockServiceClient(c.Client(), "http://"+routertest.Addr(id)))
	}
	g.Elect()
	before := forwards(t, c)
	h := runLinClients(t, &cluster{t: t, locks: s}, []string{"sim/a", "sim/b"}, 4, 0.1)
	g.ChangeLeaders(6 * time.Second)
	ops := h.end()
	counts := g.Counts()
	counts["forwarded"] = int(forwards(t, c) - before)
	return ops, counts
}

// forwards reads the count of client calls the nodes forwarded from
// node 1's /metrics (one registry for every node of the process).
func forwards(t *testing.T, c *routertest.Cluster) float64 {
	resp, err := c.Client().Get("http://" + routertest.Addr(1) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "warden_forwarded_requests_total "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return 0
}

// spreadLocks is a LockService client that sends each call to a node
// drawn at random, as a client behind a load balancer does.
type spreadLocks struct {
	wardenv1connect.LockServiceClient // the calls the clients do not make
	mu                                sync.Mutex
	rng                               *rand.Rand
	nodes                             []wardenv1connect.LockServiceClient
}

func (s *spreadLocks) pick() wardenv1connect.LockServiceClient {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodes[s.rng.IntN(len(s.nodes))]
}

func (s *spreadLocks) Acquire(ctx context.Context, req *connect.Request[wardenv1.AcquireRequest]) (*connect.Response[wardenv1.AcquireResponse], error) {
	return s.pick().Acquire(ctx, req)
}

func (s *spreadLocks) Release(ctx context.Context, req *connect.Request[wardenv1.ReleaseRequest]) (*connect.Response[wardenv1.ReleaseResponse], error) {
	return s.pick().Release(ctx, req)
}

func (s *spreadLocks) Describe(ctx context.Context, req *connect.Request[wardenv1.DescribeRequest]) (*connect.Response[wardenv1.DescribeResponse], error) {
	return s.pick().Describe(ctx, req)
}

func (s *spreadLocks) Batch(ctx context.Context, req *connect.Request[wardenv1.BatchRequest]) (*connect.Response[wardenv1.BatchResponse], error) {
	return s.pick().Batch(ctx, req)
}
