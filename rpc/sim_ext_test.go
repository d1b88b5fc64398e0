package rpc_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/anishathalye/porcupine"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
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
	routertest.Happened(t, total, len(seeds), 2, "leader change", "dropped", "answer lost", "hung", "forwarded", "wait granted", "ended", "given up")
}

// runAPISimulation runs one seed and returns its history: the group's
// leader changes for 6 s of virtual time while the clients call.
func runAPISimulation(t *testing.T, seed uint64) ([]porcupine.Operation, map[string]int) {
	g := routertest.NewGroup(t, shard.FirstShard, 3, seed, routertest.Faults{Drop: 0.04, LoseAnswer: 0.04, Hang: 0.03, DropRead: 0.04})
	c := routertest.NewCluster(g)
	s := &spreadLocks{spread: spread[wardenv1connect.LockServiceClient]{rng: rand.New(rand.NewPCG(seed, 1))}}
	for id, r := range c.Routers {
		c.Serve(id, rpc.NewHandler(r))
		s.nodes = append(s.nodes, wardenv1connect.NewLockServiceClient(c.Client(), "http://"+routertest.Addr(id)))
	}
	g.Elect()
	before := forwards(t, c)
	h := runLinClients(t, &cluster{t: t, locks: s}, []string{"sim/a", "sim/b"}, 4, 0.1, 3*time.Second)
	g.ChangeLeaders(6 * time.Second)
	ops := h.end()
	counts := g.Counts()
	maps.Copy(counts, h.waits.Snapshot())
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

// TestSimulatedQuotaAPI runs the oversell test's 200 reservers
// (checkNeverOversold: three levels of small limits, retries with the
// same reservation ids, commits and releases; then the ledger replayed
// against what was acknowledged and what Query reports) against three
// nodes' API layer over routertest's group while its leader changes
// again and again, in virtual time, each call sent to a node drawn at
// random. After every entry, on the first replica to apply it, no level
// of the pool may be oversold (DESIGN.md §1 rule 7). -api.seed replays
// a seed's faults.
func TestSimulatedQuotaAPI(t *testing.T) {
	seeds := routertest.Seeds(*apiSeed, *apiSeeds/2)
	total := routertest.Run(t, seeds, runQuotaSimulation, func(*testing.T, uint64, struct{}) {})
	routertest.Happened(t, total, len(seeds), 2, "leader change", "dropped", "answer lost", "hung", "forwarded")
}

func runQuotaSimulation(t *testing.T, seed uint64) (struct{}, map[string]int) {
	g := routertest.NewGroup(t, shard.FirstShard, 3, seed, routertest.Faults{Drop: 0.04, LoseAnswer: 0.04, Hang: 0.03, DropRead: 0.04})
	g.AfterApply(func(index uint64, lookup func(*shardv1.Query) (*shardv1.QueryResult, error)) {
		for i := range 4 {
			for j := range 3 {
				key := fmt.Sprintf("o/t%d/p%d", i, j)
				out, err := lookup(&shardv1.Query{NowUnixNano: time.Now().UnixNano(), Query: &shardv1.Query_Quota{Quota: &shardv1.QuotaQuery{Key: key}}})
				if err != nil {
					t.Errorf("entry %d: query %s: %v", index, key, err)
					return
				}
				for _, lv := range out.GetLevels() {
					if q := lv.GetRecord(); q.GetHasLimit() && q.GetCommitted()+q.GetReserved() > q.GetLimit() {
						t.Errorf("entry %d: level %s oversold: committed %d + reserved %d > limit %d", index, q.GetKey(), q.GetCommitted(), q.GetReserved(), q.GetLimit())
					}
				}
			}
		}
	})
	c := routertest.NewCluster(g)
	s := &spreadQuota{spread: spread[wardenv1connect.QuotaServiceClient]{rng: rand.New(rand.NewPCG(seed, 2))}}
	for id, r := range c.Routers {
		c.Serve(id, rpc.NewHandler(r))
		s.nodes = append(s.nodes, wardenv1connect.NewQuotaServiceClient(c.Client(), "http://"+routertest.Addr(id)))
	}
	g.Elect()
	before := forwards(t, c)
	checkNeverOversold(t, s, func() { g.ChangeLeaders(3 * time.Second) })
	counts := g.Counts()
	counts["forwarded"] = int(forwards(t, c) - before)
	return struct{}{}, counts
}

// spreadQuota is a QuotaService client that sends each call to a node
// drawn at random.
type spreadQuota struct {
	wardenv1connect.QuotaServiceClient // the calls the reservers do not make
	spread[wardenv1connect.QuotaServiceClient]
}

// spread draws, for each call, one of the nodes' clients of type C.
type spread[C any] struct {
	mu    sync.Mutex
	rng   *rand.Rand
	nodes []C
}

func (s *spread[C]) pick() C {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodes[s.rng.IntN(len(s.nodes))]
}

func (s *spreadQuota) SetLimit(ctx context.Context, req *connect.Request[wardenv1.SetLimitRequest]) (*connect.Response[wardenv1.SetLimitResponse], error) {
	return s.pick().SetLimit(ctx, req)
}

func (s *spreadQuota) Reserve(ctx context.Context, req *connect.Request[wardenv1.ReserveRequest]) (*connect.Response[wardenv1.ReserveResponse], error) {
	return s.pick().Reserve(ctx, req)
}

func (s *spreadQuota) Commit(ctx context.Context, req *connect.Request[wardenv1.CommitRequest]) (*connect.Response[wardenv1.CommitResponse], error) {
	return s.pick().Commit(ctx, req)
}

func (s *spreadQuota) Release(ctx context.Context, req *connect.Request[wardenv1.QuotaServiceReleaseRequest]) (*connect.Response[wardenv1.QuotaServiceReleaseResponse], error) {
	return s.pick().Release(ctx, req)
}

func (s *spreadQuota) Query(ctx context.Context, req *connect.Request[wardenv1.QueryRequest]) (*connect.Response[wardenv1.QueryResponse], error) {
	return s.pick().Query(ctx, req)
}

func (s *spreadQuota) ListLedger(ctx context.Context, req *connect.Request[wardenv1.ListLedgerRequest]) (*connect.Response[wardenv1.ListLedgerResponse], error) {
	return s.pick().ListLedger(ctx, req)
}

// spreadLocks is a LockService client that sends each call to a node
// drawn at random, as a client behind a load balancer does.
type spreadLocks struct {
	wardenv1connect.LockServiceClient // the calls the clients do not make
	spread[wardenv1connect.LockServiceClient]
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
