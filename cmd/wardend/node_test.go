package main

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// nodeUp waits until node i's ListNodes shows node id up (want) or down.
func (c *procCluster) nodeUp(i int, id uint64, want bool) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := rpcCtx()
		resp, err := c.nodes[i].admin.ListNodes(ctx, connect.NewRequest(&wardenv1.ListNodesRequest{}))
		cancel()
		if err == nil {
			for _, n := range resp.Msg.GetNodes() {
				if n.GetId() == id && n.GetUp() == want {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node %d never saw node %d up=%v: %v %v", i+1, id, want, resp, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// replicaNodes lists the nodes that host a replica of shard id.
func (c *procCluster) replicaNodes(id uint64) []uint64 {
	c.t.Helper()
	var out []uint64
	for _, s := range c.checkShards() {
		if s.GetId() == id {
			for _, r := range s.GetReplicas() {
				out = append(out, r.GetNodeId())
			}
		}
	}
	return out
}

// placementVoters lists the nodes that warden admin nodes output shows
// voting in the placement group (PLACEMENT voter, or leader), in order.
func placementVoters(out string) string {
	var ids []string
	for _, m := range regexp.MustCompile(`(?m)^(\d+) .* (voter|leader) `).FindAllStringSubmatch(out, -1) {
		ids = append(ids, m[1])
	}
	return strings.Join(ids, " ")
}

// warden runs the CLI against node i.
func (c *procCluster) warden(i int, args ...string) (string, error) {
	out, err := exec.Command(cliBinary, append([]string{"--addr", "http://" + c.nodes[i].listen}, args...)...).CombinedOutput()
	return string(out), err
}

// wardenRetried runs the CLI against node i again while it exits 3
// (unavailable: a leader changing on a loaded machine), as a script
// would, for up to 30 s.
func (c *procCluster) wardenRetried(i int, args ...string) (string, error) {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, err := c.warden(i, args...)
		if exitCode(err) != 3 || time.Now().After(deadline) {
			return out, err
		}
	}
}

// Node removal on four processes. Node 4 joins in az1 and takes shard
// 1's az1 replica, and a lease is renewed every 200 ms through nodes 2
// and 3 all along. With node 1 down, removing node 4 is refused naming
// the shard (no other live node in az1) and nothing moves. With node 1
// back, warden admin node
// remove 4 moves the replica to node 1 and takes node 4 out of the map:
// every renewal succeeded and the token never changed (renew p99
// reported), 200 other held leases are intact, node 4 is gone from
// ListNodes, and its process, started again, is refused for its removed
// id.
func TestClusterRemoveNode(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	held := c.holdMany("node-held", 200, 5*time.Minute)
	four := c.join("az1")
	if out, err := c.warden(0, "admin", "nodes"); err != nil || placementVoters(out) != "1 2 3" || !regexp.MustCompile(`(?m)^4 .* - `).MatchString(out) {
		t.Fatalf("warden admin nodes: want nodes 1 to 3 voters of the placement group, node 4 none: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := c.nodes[1].admin.MoveReplica(ctx, connect.NewRequest(&wardenv1.MoveReplicaRequest{ShardId: 1, FromNodeId: 1, ToNodeId: 4})); err != nil {
		t.Fatalf("move to node 4: %v", err)
	}
	lease, err := c.nodes[1].acquire("renewed-throughout", "renewed", 10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	var took []time.Duration
	var failures []error
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			start := time.Now()
			err := c.nodes[1+i%2].renew("renewed-throughout", lease.GetLeaseId())
			mu.Lock()
			took = append(took, time.Since(start))
			if err != nil {
				failures = append(failures, err)
			}
			mu.Unlock()
			time.Sleep(200 * time.Millisecond)
		}
	})
	defer func() { stop.Store(true); wg.Wait() }()

	c.kill(0)
	// The placement leader (node 2 or 3) plans the removal with its own
	// view of liveness, so both must see node 1 down.
	c.nodeUp(1, 1, false)
	c.nodeUp(2, 1, false)
	if out, err := c.warden(1, "admin", "node", "remove", "4"); err == nil || !strings.Contains(out, "shard 1 would be left below three replicas in three zones") || !strings.Contains(out, `"az1"`) {
		t.Fatalf("removing node 4 with node 1 down: %v\n%s", err, out)
	}
	if reps := c.replicaNodes(1); !slices.Contains(reps, 4) {
		t.Fatalf("a refused removal moved something: shard 1 on nodes %v", reps)
	}
	c.start(0)
	c.waitServing(0)
	c.nodeUp(1, 1, true)
	c.nodeUp(2, 1, true)

	out, err := c.warden(2, "admin", "node", "remove", "4")
	if err != nil || !strings.Contains(out, "replica moved from node 4 to node 1") {
		t.Fatalf("warden admin node remove 4: %v\n%s", err, out)
	}
	t.Logf("warden admin node remove 4:\n%s", out)
	if out, err := c.wardenRetried(0, "admin", "node", "remove", "4"); err != nil || strings.Contains(out, "replica moved") || !strings.Contains(out, "node 4 is not in the cluster") {
		t.Fatalf("removing node 4 again (a retry): %v\n%s", err, out)
	}
	stop.Store(true)
	wg.Wait()
	mu.Lock()
	if len(failures) > 0 {
		t.Fatalf("%d of %d renewals failed, the first: %v", len(failures), len(took), failures[0])
	}
	slices.Sort(took)
	t.Logf("%d renewals through the removal, p50 %v, p99 %v, max %v", len(took), took[len(took)/2], took[len(took)*99/100], took[len(took)-1])
	mu.Unlock()
	if d, err := c.nodes[2].describe("renewed-throughout"); err != nil || !d.GetHeld() || d.GetFencingToken() != lease.GetFencingToken() {
		t.Fatalf("the renewed lease after the removal: %v %v, want token %#x", d, err, lease.GetFencingToken())
	}
	if reps := c.replicaNodes(1); slices.Contains(reps, 4) || !slices.Contains(reps, 1) || len(reps) != 3 {
		t.Fatalf("after the removal shard 1 is on nodes %v", reps)
	}
	resp, err := c.nodes[0].admin.ListNodes(ctx, connect.NewRequest(&wardenv1.ListNodesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range resp.Msg.GetNodes() {
		if n.GetId() == 4 {
			t.Fatalf("node 4 is still listed: %v", n)
		}
	}
	c.nodes[four].up.Store(false) // no longer the cluster's: checkLeases asks the others
	c.checkLeases(held)

	// The removed node's process, started again, is refused.
	c.kill(four)
	c.start(four)
	n := c.nodes[four]
	n.up.Store(false)
	select {
	case err := <-n.exited:
		n.cmd = nil // exited: nothing for the cleanup to stop
		if err == nil || !strings.Contains(n.log.String(), "was removed from the cluster") {
			t.Fatalf("node 4 started again: %v\n%s", err, n.log.Tail(10))
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("node 4, removed, still runs:\n%s", n.log.Tail(10))
	}
}

// Replacing a placement-group member that died for good, on four
// processes. Node 4 joins in az3. While it is down, removing node 3 is
// refused before anything moves: nothing else in az3 could take its
// vote. Then node 3 is SIGKILLed for good and warden admin node remove 3
// moves its replica to node 4 and makes node 4 a voter in its place
// (non-voting first, caught up, promoted, node 3 removed). The placement
// group then commits without node 1 as well ({2, 4} is a quorum): node
// 4, SIGKILLed and started again with node 1 down, restarts its
// placement replica and registers. A lease held throughout keeps its
// token, 200 others are intact, and the placement replicas agree.
func TestClusterReplacePlacementMember(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	held := c.holdMany("replace-held", 200, 5*time.Minute)
	lease, err := c.nodes[0].acquire("held-throughout", "held", 5*time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	four := c.join("az3")

	// Whichever node leads the placement group plans with its own view
	// of liveness (a node it has not read yet counts as live), so each
	// must have seen node 4 up and then down.
	for i := range 3 {
		c.nodeUp(i, 4, true)
	}
	c.kill(four)
	for i := range 3 {
		c.nodeUp(i, 4, false)
	}
	if out, err := c.warden(0, "admin", "node", "remove", "3"); err == nil || !strings.Contains(out, "node 3 votes in the placement group") || !strings.Contains(out, `"az3"`) {
		t.Fatalf("removing node 3 with node 4 down: %v\n%s", err, out)
	}
	c.start(four)
	c.waitServing(four)

	c.kill(2) // for good
	for _, i := range []int{0, 1, four} {
		c.nodeUp(i, 3, false)
		c.nodeUp(i, 4, true)
	}
	out, err := c.warden(0, "admin", "node", "remove", "3")
	if err != nil || !strings.Contains(out, "replica moved from node 3 to node 4") || !strings.Contains(out, "placement group: node 4 votes in place of node 3") {
		t.Fatalf("warden admin node remove 3: %v\n%s", err, out)
	}
	t.Logf("warden admin node remove 3:\n%s", out)
	out, err = c.warden(0, "admin", "nodes")
	if err != nil || placementVoters(out) != "1 2 4" || regexp.MustCompile(`(?m)^3 `).MatchString(out) {
		t.Fatalf("warden admin nodes after the replacement: want nodes 1, 2 and 4 voters and node 3 gone: %v\n%s", err, out)
	}

	// {2, 4} is a quorum of the placement group: node 4's registration
	// after its restart commits with node 1 down.
	c.kill(0)
	c.nodeUp(1, 1, false)
	c.kill(four)
	c.start(four)
	c.waitServing(four)
	// ListNodes reads the roles through the node's own placement
	// replica: node 4 restarted it. With only two nodes up, a leader
	// change (a slow clock reading makes one hand its leaderships away)
	// answers unavailable for a moment: retried, as a client would.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, err := c.warden(four, "admin", "nodes")
		if err == nil && strings.Contains(" "+placementVoters(out)+" ", " 4 ") {
			break
		}
		if (err == nil || !strings.Contains(out, "unavailable")) || time.Now().After(deadline) {
			t.Fatalf("warden admin nodes at node 4 after its restart: %v\n%s", err, out)
		}
	}
	c.start(0)
	c.waitServing(0)

	if d, err := c.nodes[four].describe("held-throughout"); err != nil || !d.GetHeld() || d.GetFencingToken() != lease.GetFencingToken() {
		t.Fatalf("the held lease after the replacement: %v %v, want token %#x", d, err, lease.GetFencingToken())
	}
	c.checkLeases(held)
	sum, st := c.placementDigest()
	if slices.ContainsFunc(st.GetNodes(), func(n *placementv1.Node) bool { return n.GetId() == 3 }) {
		t.Fatalf("node 3 is still in the map")
	}
	t.Logf("placement replicas of nodes 1, 2 and 4 agree: %s…", sum[:16])

	// Node 3, removed, started again on its directory: refused at once
	// (its peers know it removed), not after waiting out the bootstrap
	// for a placement group that no longer answers it.
	c.expectRemoved(2, 3, 20*time.Second)
}

// expectRemoved starts node i (id), removed from the cluster, on its
// directory, and waits up to within for it to exit refusing, naming the
// removal.
func (c *procCluster) expectRemoved(i int, id uint64, within time.Duration) {
	c.t.Helper()
	began := time.Now()
	c.start(i)
	n := c.nodes[i]
	n.up.Store(false)
	select {
	case err := <-n.exited:
		n.cmd = nil // exited: nothing for the cleanup to stop
		if err == nil || !strings.Contains(n.log.String(), fmt.Sprintf("node %d was removed from the cluster", id)) {
			c.t.Fatalf("node %d, removed, started again: %v\n%s", id, err, n.log.Tail(10))
		}
		c.t.Logf("node %d, removed, refused to start in %v", id, time.Since(began).Round(time.Millisecond))
	case <-time.After(within):
		c.t.Fatalf("node %d, removed, still runs %v after its start:\n%s", id, within, n.log.Tail(10))
	}
}

// Once no initial member is left, the placement group runs on nodes that
// joined it at run time, five processes. Node 4 joins in az3 and node 5
// in az1; node 3 is removed (node 4 takes its vote), then node 1 (node 5
// takes its), neither restarted since: the voters are 2, 4 and 5. Node 2
// is SIGKILLed for good. Nodes 4 and 5, a quorum, still read and change
// the placement state through their own replicas (each asking the other
// would go in circles): warden admin nodes answers at both, and node 2
// is removed with --force (the placement group and shard 1 shrink to
// nodes 4 and 5). A lease held throughout keeps its token. Node 1,
// removed while it ran, is refused when it starts again.
func TestClusterJoinedVotersServe(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	lease, err := c.nodes[1].acquire("joined-voters", "held", 5*time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	four, five := c.join("az3"), c.join("az1")
	for _, r := range []struct {
		node uint64
		by   int
	}{{3, four}, {1, five}} {
		for i := range c.nodes {
			if c.nodes[i].up.Load() {
				c.nodeUp(i, uint64(r.by+1), true)
			}
		}
		out, err := c.wardenRetried(1, "admin", "node", "remove", fmt.Sprint(r.node))
		if err != nil || !strings.Contains(out, fmt.Sprintf("node %d votes in place of node %d", r.by+1, r.node)) {
			t.Fatalf("warden admin node remove %d: %v\n%s", r.node, err, out)
		}
		c.kill(int(r.node - 1))
	}
	c.kill(1) // node 2, for good
	for _, i := range []int{four, five} {
		c.nodeUp(i, 2, false)
	}
	for _, i := range []int{four, five} {
		out, err := c.wardenRetried(i, "admin", "nodes")
		if err != nil || placementVoters(out) != "2 4 5" {
			t.Fatalf("warden admin nodes at node %d, with nodes 4 and 5 the placement group's quorum: %v\n%s", i+1, err, out)
		}
	}
	c.short = true
	out, err := c.wardenRetried(four, "admin", "node", "remove", "2", "--force")
	if err != nil || !strings.Contains(out, "node 2 removed") {
		t.Fatalf("warden admin node remove 2 --force with only joined voters left: %v\n%s", err, out)
	}
	if out, err := c.wardenRetried(five, "admin", "nodes"); err != nil || placementVoters(out) != "4 5" {
		t.Fatalf("warden admin nodes after removing node 2: %v\n%s", err, out)
	}
	if reps := c.replicaNodes(1); !slices.Equal(reps, []uint64{4, 5}) && !slices.Equal(reps, []uint64{5, 4}) {
		t.Fatalf("shard 1 after the removals is on nodes %v, want 4 and 5", reps)
	}
	if d, err := c.nodes[four].describe("joined-voters"); err != nil || !d.GetHeld() || d.GetFencingToken() != lease.GetFencingToken() {
		t.Fatalf("the held lease: %v %v, want token %#x", d, err, lease.GetFencingToken())
	}
	c.expectRemoved(0, 1, 20*time.Second)
}

// A forced removal and its repair, on four processes. Shard 1 is split
// in two and a lease is held. Node 3, the only node of az3, is SIGKILLed
// for good: removing it is refused (naming its zone and force), and
// warden admin node remove 3 --force --no-wait, under a request id,
// begins the removal as an operation, followed to its end: each shard's
// az3 replica is dropped (two replicas left, still a quorum), node 3's
// placement vote is removed, node 3 leaves the map, and
// warden_shard_replicas says 2. The same command again answers the same
// removal. Node 4 then joins in az3 and warden
// admin rebalance adds it as a placement voter and each shard's third
// replica there. The lease keeps its token throughout, 100 others are
// intact, and the placement replicas agree.
func TestClusterForcedRemoval(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	if out, err := c.warden(0, "admin", "split", "1"); err != nil {
		t.Fatalf("split: %v\n%s", err, out)
	}
	held := c.holdMany("forced-held", 100, 5*time.Minute)
	lease, err := c.nodes[0].acquire("held-throughout", "held", 5*time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	c.kill(2) // for good
	c.nodeUp(0, 3, false)
	c.nodeUp(1, 3, false)
	c.short = true
	if out, err := c.warden(0, "admin", "node", "remove", "3"); err == nil || !strings.Contains(out, `no other live node in zone "az3"`) || !strings.Contains(out, "force the removal") {
		t.Fatalf("removing node 3, the only node of az3, unforced: %v\n%s", err, out)
	}
	if reps := c.replicaNodes(1); len(reps) != 3 {
		t.Fatalf("a refused removal changed shard 1: %v", reps)
	}
	out, err := c.warden(1, "admin", "node", "remove", "3", "--force", "--request-id", "drain-3", "--no-wait")
	m := regexp.MustCompile(`operation (\d+): follow it`).FindStringSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("node remove --no-wait: %v\n%s", err, out)
	}
	out = c.waitOperation(0, m[1], "removed (step 4 of 4), 2 of 2 planned steps done, done")
	if strings.Count(out, "drop_replica of shard") != 2 {
		t.Fatalf("the removal's steps:\n%s", out)
	}
	t.Logf("warden admin operation %s:\n%s", m[1], out)
	again, err := c.warden(0, "admin", "node", "remove", "3", "--force", "--request-id", "drain-3")
	if err != nil || strings.Count(again, "dropped; the shard is one replica short") != 2 || !strings.Contains(again, "node 3 removed") {
		t.Fatalf("the same removal again under its request id: %v\n%s", err, again)
	}
	for _, id := range []uint64{1, 2} {
		if reps := c.replicaNodes(id); slices.Contains(reps, 3) || len(reps) != 2 {
			t.Fatalf("after the forced removal shard %d is on nodes %v", id, reps)
		}
	}
	if out, err := c.warden(0, "admin", "nodes"); err != nil || placementVoters(out) != "1 2" || regexp.MustCompile(`(?m)^3 `).MatchString(out) {
		t.Fatalf("warden admin nodes after the forced removal: %v\n%s", err, out)
	}
	// The map refreshes every 200 ms; the gauge follows it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if v, ok := c.nodes[0].metric(`warden_shard_replicas{node="1",shard="1"}`); ok && v == 2 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("warden_shard_replicas of shard 1 at node 1: %v (exported %v), want 2", v, ok)
		}
	}
	if _, err := c.nodes[1].acquire("after-the-drop", "w", time.Minute, 0); err != nil {
		t.Fatalf("an acquire with two replicas a shard: %v", err)
	}

	four := c.join("az3")
	for i := range 2 {
		c.nodeUp(i, uint64(four+1), true)
	}
	out, err = c.warden(0, "admin", "rebalance", "--dry-run")
	if err != nil || !strings.Contains(out, "add_placement_voter") || strings.Count(out, "add_replica") != 2 || !strings.Contains(out, "→ node 4  planned") {
		t.Fatalf("warden admin rebalance --dry-run: %v\n%s", err, out)
	}
	out, err = c.warden(0, "admin", "rebalance")
	if err != nil || !strings.Contains(out, "add_placement_voter") || strings.Count(out, "add_replica") != 2 || strings.Contains(out, "failed") {
		t.Fatalf("warden admin rebalance: %v\n%s", err, out)
	}
	t.Logf("warden admin rebalance:\n%s", out)
	for _, id := range []uint64{1, 2} {
		if reps := c.replicaNodes(id); !slices.Contains(reps, 4) || len(reps) != 3 {
			t.Fatalf("after the rebalance shard %d is on nodes %v", id, reps)
		}
	}
	if out, err := c.warden(four, "admin", "nodes"); err != nil || placementVoters(out) != "1 2 4" {
		t.Fatalf("warden admin nodes after the rebalance: %v\n%s", err, out)
	}
	if d, err := c.nodes[four].describe("held-throughout"); err != nil || !d.GetHeld() || d.GetFencingToken() != lease.GetFencingToken() {
		t.Fatalf("the held lease after the removal and repair: %v %v, want token %#x", d, err, lease.GetFencingToken())
	}
	c.checkLeases(held)
	sum, _ := c.placementDigest()
	t.Logf("placement replicas of nodes 1, 2 and 4 agree: %s…", sum[:16])
}
