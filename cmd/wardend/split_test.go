package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/keyspace"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// traffic runs acquire/renew/release loops through random nodes until
// stop, and reports what it saw: every error must be Unavailable (the
// retryable code), every resource's tokens must increase, and no token
// (an epoch and a revision) may be granted twice, on any resource.
type traffic struct {
	ops, unavailable atomic.Int64
	mu               sync.Mutex
	last             map[string]uint64
	granted          map[uint64]string // token → the resource it was granted on
	errs             []error
	stop             atomic.Bool
	wg               sync.WaitGroup
}

func (c *procCluster) runTraffic(workers int) *traffic {
	tr := &traffic{last: map[string]uint64{}, granted: map[uint64]string{}}
	for w := range workers {
		tr.wg.Go(func() {
			for i := 0; !tr.stop.Load(); i++ {
				n := c.any()
				r := fmt.Sprintf("traffic-%d-%d", w, i%40)
				a, err := n.acquire(r, fmt.Sprintf("t-%d-%d", w, i), 10*time.Second, 0)
				if err == nil {
					tr.mu.Lock()
					if a.GetFencingToken() <= tr.last[r] {
						tr.errs = append(tr.errs, fmt.Errorf("%s: token %#x after %#x", r, a.GetFencingToken(), tr.last[r]))
					}
					tr.last[r] = a.GetFencingToken()
					if prev, ok := tr.granted[a.GetFencingToken()]; ok {
						tr.errs = append(tr.errs, fmt.Errorf("token %#x granted twice: on %s and on %s", a.GetFencingToken(), prev, r))
					}
					tr.granted[a.GetFencingToken()] = r
					tr.mu.Unlock()
					if err = c.any().renew(r, a.GetLeaseId()); err == nil {
						_, err = c.any().release(r, a.GetLeaseId())
					}
				}
				tr.ops.Add(1)
				switch {
				case err == nil:
				case connect.CodeOf(err) == connect.CodeUnavailable:
					tr.unavailable.Add(1)
				case connect.CodeOf(err) == connect.CodeAborted || connect.CodeOf(err) == connect.CodeFailedPrecondition:
					// A retried release or an acquire racing a lease that
					// an unavailable release left behind: not an error.
				default:
					tr.mu.Lock()
					tr.errs = append(tr.errs, fmt.Errorf("traffic on %s via node %d: %v", r, n.id, err))
					tr.mu.Unlock()
				}
			}
		})
	}
	return tr
}

func (tr *traffic) finish(t *testing.T) {
	t.Helper()
	tr.stop.Store(true)
	tr.wg.Wait()
	for _, err := range tr.errs {
		t.Error(err)
	}
	t.Logf("traffic: %d operations, %d answered unavailable", tr.ops.Load(), tr.unavailable.Load())
}

// splitFenceSeconds sums warden_split_fence_seconds over the nodes'
// /metrics: the total time splits kept a moving range fenced.
func (c *procCluster) splitFenceSeconds() (sum float64, count int) {
	for _, n := range c.nodes {
		if !n.up.Load() {
			continue
		}
		resp, err := http.Get("http://" + n.listen + "/metrics")
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(body), "\n") {
			if v, ok := strings.CutPrefix(line, "warden_split_fence_seconds_sum "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				sum += f
			}
			if v, ok := strings.CutPrefix(line, "warden_split_fence_seconds_count "); ok {
				k, _ := strconv.Atoi(v)
				count += k
			}
		}
	}
	return sum, count
}

// Three processes; 1,000 locks held and 20 waiters queued; a SplitShard
// under concurrent acquire/renew/release traffic. Afterwards every lease
// is still held with its token and renews, the waiters are granted with
// larger tokens, every resource's next token is larger than its last, the
// traffic saw only retryable errors, and the two shards each have a
// replica in every zone.
func TestClusterSplitUnderTraffic(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	const held, waited = 1000, 20
	leases := c.holdMany("held", held, 3*time.Minute)
	type waitResult struct {
		resource string
		resp     *wardenv1.AcquireResponse
		err      error
	}
	waits := make(chan waitResult, waited)
	for i := range waited {
		r := fmt.Sprintf("held-%d", i)
		go func() {
			resp, err := c.any().acquire(r, "waiter-"+r, time.Minute, 90*time.Second)
			waits <- waitResult{r, resp, err}
		}()
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var q uint64
		if resp, err := c.any().shards(); err == nil {
			for _, s := range resp.GetShards() {
				q += s.GetQueuedWaiters()
			}
		}
		if q == waited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d waiters queued", q, waited)
		}
		time.Sleep(50 * time.Millisecond)
	}

	tr := c.runTraffic(6)
	defer tr.stop.Store(true) // when the test fails early too
	time.Sleep(time.Second)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := c.nodes[rand.IntN(3)].admin.SplitShard(ctx, connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: 1}))
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	took := time.Since(start)
	time.Sleep(time.Second)
	tr.finish(t)
	fence, splits := c.splitFenceSeconds()
	t.Logf("split took %v; the moving range was fenced for %.0f ms (%d split); new shard %d at %#x",
		took, fence*1000, splits, resp.Msg.GetNewShardId(), resp.Msg.GetSplitAt())
	if splits != 1 {
		t.Errorf("warden_split_fence_seconds counted %d splits, want 1", splits)
	}
	if shards := c.checkShards(); len(shards) != 2 {
		t.Fatalf("after the split: %d shards", len(shards))
	}
	c.checkLeases(leases)
	for i := range waited {
		r := fmt.Sprintf("held-%d", i)
		if ok, err := c.any().release(r, leases[r].GetLeaseId()); err != nil || !ok {
			t.Fatalf("release %s: %v %v", r, ok, err)
		}
	}
	for range waited {
		w := <-waits
		if w.err != nil {
			t.Fatalf("waiter on %s: %v", w.resource, w.err)
		}
		if w.resp.GetFencingToken() <= leases[w.resource].GetFencingToken() {
			t.Fatalf("waiter on %s: token %#x, not above %#x", w.resource, w.resp.GetFencingToken(), leases[w.resource].GetFencingToken())
		}
		leases[w.resource] = w.resp
	}
	c.checkNextTokens(leases)
}

// Case S3 on three processes: a stale route gets served, never "lease
// unknown". Leases and a quota pool whose hashes fall in the upper half
// move to a new shard by a split at 2^63; the parent's leader node is
// then SIGKILLed and restarted at once, and Renew, Describe and Reserve
// for the moved keys go to that node first. Each is served (forwarded to
// the new shard's leader) or answered unavailable (retryable): never
// failed_precondition for a live lease, never the parent's old state.
func TestClusterCaseS3StaleRouteAfterSplit(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	const at = uint64(1) << 63
	var locks, pools []string
	for i := 0; len(locks) < 20 || len(pools) < 3; i++ {
		if k := fmt.Sprintf("s3-%d", i); keyspace.Hash(k) >= at && len(locks) < 20 {
			locks = append(locks, k)
		} else if keyspace.Hash(k) >= at && len(pools) < 3 {
			pools = append(pools, k)
		}
	}
	leases := map[string]*wardenv1.AcquireResponse{}
	for _, r := range locks {
		a, err := c.any().acquire(r, "s3", 2*time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		leases[r] = a
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, p := range pools {
		if err := retryUnavailable(func() error {
			_, err := c.any().quota().SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: p, Limit: 100}))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	parent := c.shardOf(locks[0]).GetId()
	split, err := c.nodes[0].admin.SplitShard(ctx, connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: parent, SplitAt: at}))
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	if s := c.shardOf(locks[0]); s.GetId() != split.Msg.GetNewShardId() {
		t.Fatalf("premise: %s is in shard %d, not the new shard %d", locks[0], s.GetId(), split.Msg.GetNewShardId())
	}
	oldIdx := c.leaderOfShard(parent)
	old := c.nodes[oldIdx]
	c.kill(oldIdx)
	c.start(oldIdx)
	var took []time.Duration
	timed := func(f func() error) error {
		start := time.Now()
		err := retryUnavailable(f)
		took = append(took, time.Since(start))
		return err
	}
	for _, r := range locks {
		if err := timed(func() error { return old.renew(r, leases[r].GetLeaseId()) }); err != nil {
			t.Fatalf("renew %s through the parent's old leader: %v (code %v)", r, err, connect.CodeOf(err))
		}
		var d *wardenv1.DescribeResponse
		if err := timed(func() (err error) { d, err = old.describe(r); return err }); err != nil || !d.GetHeld() || d.GetFencingToken() != leases[r].GetFencingToken() {
			t.Fatalf("describe %s through the parent's old leader: %v %v, want held with token %#x", r, d, err, leases[r].GetFencingToken())
		}
	}
	for _, pool := range pools {
		if err := timed(func() error {
			_, err := old.quota().Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: pool, Amount: 60, ReservationId: "s3"}))
			return err
		}); err != nil {
			t.Fatalf("reserve in %s through the parent's old leader: %v", pool, err)
		}
		// Served by the new shard: its limit came along, so a second
		// reserve of 60 does not fit.
		_, err := old.quota().Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: pool, Amount: 60, ReservationId: "s3-second"}))
		if connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Fatalf("a second reserve of 60 of 100 in %s: %v, want resource_exhausted", pool, err)
		}
	}
	first, rest := took[0], took[1:]
	slices.Sort(rest)
	t.Logf("through node %d after its restart: the first request %v (it waited for the process to serve), the %d after it median %v, p99 %v, max %v (retries of unavailable included)",
		old.id, first.Round(time.Millisecond), len(rest), rest[len(rest)/2].Round(time.Millisecond), rest[len(rest)*99/100].Round(time.Millisecond), rest[len(rest)-1].Round(time.Millisecond))
}

// leaderOfShard returns the index of the node that leads shard id.
func (c *procCluster) leaderOfShard(id uint64) int {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.any().shards()
		for _, s := range resp.GetShards() {
			if s.GetId() == id && s.GetLeaderNodeId() != 0 {
				return int(s.GetLeaderNodeId()) - 1
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no leader known for shard %d: %v %v", id, resp, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Case S1 on four processes: tokens stay monotonic through splits, moves
// and leader transfers under churn. Workers loop Acquire, Renew and
// Release on 240 resources while a split, a leader transfer and a replica
// move (between the two nodes of zone az1) follow one another. Every
// resource's tokens increase, no token is granted twice, and each new
// shard's epoch is above its parent's. make test runs 20 s; WARDEN_SOAK=1
// (make soak) five minutes, as the case has it.
func TestClusterCaseS1TokensThroughChurn(t *testing.T) {
	t.Parallel()
	run := 20 * time.Second
	if os.Getenv("WARDEN_SOAK") != "" {
		run = 5 * time.Minute
	}
	c := startProcCluster(t)
	four := c.join("az1")
	tr := c.runTraffic(6)
	defer tr.stop.Store(true) // when the test fails early too
	admin := func() wardenv1connect.AdminServiceClient { return c.any().admin }
	var splits, transfers, moves int
	for end, k := time.Now().Add(run), 0; time.Now().Before(end); k++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		shards := c.checkShards()
		s := shards[rand.IntN(len(shards))]
		switch k % 3 {
		case 0:
			if len(shards) >= 8 {
				break // enough shards: the rest of the churn is moves and transfers
			}
			resp, err := admin().SplitShard(ctx, connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: s.GetId()}))
			if err != nil {
				cancel()
				t.Fatalf("split shard %d: %v", s.GetId(), err)
			}
			for _, n := range c.checkShards() {
				if n.GetId() == resp.Msg.GetNewShardId() && n.GetEpoch() <= s.GetEpoch() {
					cancel()
					t.Fatalf("new shard %d has epoch %d, not above its parent %d's %d", n.GetId(), n.GetEpoch(), s.GetId(), s.GetEpoch())
				}
			}
			splits++
		case 1:
			reps := s.GetReplicas()
			to := reps[rand.IntN(len(reps))].GetNodeId()
			if _, err := admin().TransferLeader(ctx, connect.NewRequest(&wardenv1.TransferLeaderRequest{ShardId: s.GetId(), NodeId: to})); err != nil {
				cancel()
				t.Fatalf("transfer shard %d to node %d: %v", s.GetId(), to, err)
			}
			transfers++
		case 2:
			from, to := c.nodes[0].id, c.nodes[four].id
			for _, r := range s.GetReplicas() {
				if r.GetNodeId() == to {
					from, to = to, from
				}
			}
			if _, err := admin().MoveReplica(ctx, connect.NewRequest(&wardenv1.MoveReplicaRequest{ShardId: s.GetId(), FromNodeId: from, ToNodeId: to})); err != nil {
				cancel()
				t.Fatalf("move shard %d from node %d to node %d: %v", s.GetId(), from, to, err)
			}
			moves++
		}
		cancel()
	}
	tr.finish(t)
	if splits == 0 || transfers == 0 || moves == 0 {
		t.Fatalf("premise: %d splits, %d transfers, %d moves", splits, transfers, moves)
	}
	t.Logf("%d splits, %d leader transfers, %d replica moves; %d distinct tokens granted", splits, transfers, moves, len(tr.granted))
}
