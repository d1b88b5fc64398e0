package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// restartEach restarts the running nodes in turn (SIGKILL, start, wait
// until it serves), then all of them at once, checking the leases after
// each step.
func (c *procCluster) restartEach(leases map[string]*wardenv1.AcquireResponse, label string) {
	c.t.Helper()
	var running []int
	for i, n := range c.nodes {
		if n.up.Load() {
			running = append(running, i)
		}
	}
	for _, i := range running {
		c.kill(i)
		c.start(i)
		c.waitServing(i)
		c.checkLeases(leases)
		c.t.Logf("%s: node %d restarted, %d leases intact", label, i+1, len(leases))
	}
	for _, i := range running {
		c.kill(i)
	}
	for _, i := range running {
		c.start(i)
	}
	for _, i := range running {
		c.waitServing(i)
	}
	c.checkLeases(leases)
	c.t.Logf("%s: all %d nodes restarted at once, %d leases intact", label, len(running), len(leases))
}

// After a replica move, every node restarts, one at a time and all at
// once: on four processes right after the move (node 1 kept no replica
// of shard 1, nodes 2 and 3 kept theirs while its member list changed),
// and on three after moving back and stopping node 4 (node 1 hosts a new
// replica id, and the members differ from the initial ones). A replica
// with state restarts as Dragonboat expects, from its own log, not with
// a member list rebuilt from today's map (which made Dragonboat refuse:
// "inconsistent node list"). Leases are held throughout.
func TestClusterRestartAfterMove(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	leases := c.holdMany("held", 50, 10*time.Minute)
	four := c.join("az1")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := c.nodes[four].admin.MoveReplica(ctx, connect.NewRequest(&wardenv1.MoveReplicaRequest{ShardId: 1, FromNodeId: 1, ToNodeId: 4})); err != nil {
		t.Fatalf("move 1 -> 4: %v", err)
	}
	c.restartEach(leases, "four nodes after a move")

	if _, err := c.nodes[1].admin.MoveReplica(ctx, connect.NewRequest(&wardenv1.MoveReplicaRequest{ShardId: 1, FromNodeId: 4, ToNodeId: 1})); err != nil {
		t.Fatalf("move 4 -> 1: %v", err)
	}
	for _, s := range c.checkShards() {
		for _, r := range s.GetReplicas() {
			if r.GetNodeId() == 4 {
				t.Fatalf("shard %d still has a replica on node 4 after moving back: %v", s.GetId(), s)
			}
		}
	}
	c.kill(four)
	c.restartEach(leases, "three nodes after moving back")
	c.checkNextTokens(leases)
}

// A member whose data directory is lost must never vote again under its
// id (Raft assumes a voter never forgets what it acknowledged). The
// stale-quorum timing: node 3 is paused, 12 leases are acknowledged by
// nodes 1 and 2, both are SIGKILLed, node 2's data directory is deleted.
// Restarted as before (no --initial-cluster-state new), node 2 refuses
// to start and names the flag; nodes 1 and 3 then form the quorum, and
// every lease is still held with its token, and the next tokens are
// higher. Before the guard, node 2 came back empty, formed a quorum with
// node 3 (which had never seen the leases), and all 12 tokens were
// issued again to new holders.
//
// The other timings: with the others up, node 2 wiped and restarted
// without the flag refuses too (before, it panicked or rejoined by
// snapshot); restarted with --initial-cluster-state new, its new
// incarnation is not the one the placement group registered (the other
// members say so before it starts a replica), and it refuses as well. The
// cluster keeps serving on nodes 1 and 3 throughout. Last, node 1 loses
// only its write-ahead log, and is refused too.
func TestClusterWipedNodeRefusesToRejoin(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	base := c.holdMany("before", 4, 10*time.Minute) // registered: every node has started and served

	paused := c.nodes[2]
	if err := paused.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused.up.Store(false)
	c.waitLeaderNot(2)
	leases := c.holdMany("acked", 12, 10*time.Minute)
	c.kill(0)
	c.kill(1)
	if err := os.RemoveAll(c.nodes[1].dir); err != nil {
		t.Fatal(err)
	}
	c.expectRefusal(1, "--initial-cluster-state new")
	// Node 1 comes back on its data, node 3 resumes: the quorum that
	// acknowledged the leases still has one member who remembers them.
	c.start(0)
	if err := paused.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	paused.up.Store(true)
	c.waitServing(0)
	c.waitServing(2)
	for r, a := range base {
		leases[r] = a
	}
	c.checkLeases(leases)

	// Wiped with the others up: refused without the flag, and with it.
	c.expectRefusal(1, "--initial-cluster-state new")
	c.expectRefusal(1, "incarnation", "--initial-cluster-state", "new")
	c.checkLeases(leases)
	c.checkNextTokens(leases)

	// Only the write-ahead log lost (an attack found it: the node came
	// back with an empty log under its identity, voted, and two leases
	// were lost and their tokens issued again): refused as well.
	c.kill(0)
	if err := os.RemoveAll(filepath.Join(c.nodes[0].dir, "wal")); err != nil {
		t.Fatal(err)
	}
	c.expectRefusal(0, "Raft log is gone")
}

// expectRefusal starts node i with extra flags and requires it to exit
// non-zero within 60 s with want in its log.
func (c *procCluster) expectRefusal(i int, want string, extra ...string) {
	c.t.Helper()
	n := c.nodes[i]
	saved := c.extra[i]
	if c.extra == nil {
		c.extra = map[int][]string{}
	}
	c.extra[i] = append(append([]string(nil), saved...), extra...)
	c.start(i)
	c.extra[i] = saved
	select {
	case err := <-n.exited:
		n.cmd, n.exited = nil, nil
		n.up.Store(false)
		if err == nil {
			c.t.Fatalf("node %d exited 0 on a lost data directory", i+1)
		}
		if !strings.Contains(n.log.String(), want) {
			c.t.Fatalf("node %d refused, but its log does not say %q:\n%s", i+1, want, n.log.Tail(10))
		}
		c.t.Logf("node %d refused to start: %s", i+1, n.log.Tail(1))
	case <-time.After(60 * time.Second):
		c.t.Fatalf("node %d started on a lost data directory:\n%s", i+1, n.log.Tail(20))
	}
}

// waitLeaderNot waits until a running node sees every shard led by a
// node other than node i (an election after i was paused or killed).
func (c *procCluster) waitLeaderNot(i int) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.any().shards()
		ok := err == nil
		for _, s := range resp.GetShards() {
			ok = ok && s.GetLeaderNodeId() != 0 && s.GetLeaderNodeId() != c.nodes[i].id
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("shards still led by node %d or by none: %v %v", i+1, resp, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Case L19's full-restart half (its restore half comes with backups):
// tokens and lease ids never repeat across a SIGKILL of every node. After
// 1,000 acquire/release cycles on r1…r10 and a lease held on r1, all
// three nodes are killed and started again: the held lease renews and
// Describe shows it, every new grant's token is above its resource's
// recorded highest, and no new lease id matches one from before.
func TestClusterCaseL19FullRestart(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	highest := map[string]uint64{}
	leaseIDs := map[string]bool{}
	for i := range 1000 {
		r := fmt.Sprintf("r%d", i%10+1)
		n := c.nodes[i%3]
		a, err := n.acquire(r, fmt.Sprintf("cycle-%d", i), 10*time.Second, 0)
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		highest[r] = max(highest[r], a.GetFencingToken())
		leaseIDs[a.GetLeaseId()] = true
		if ok, err := n.release(r, a.GetLeaseId()); err != nil || !ok {
			t.Fatalf("cycle %d: release %v %v", i, ok, err)
		}
	}
	held, err := c.nodes[0].acquire("r1", "held", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	highest["r1"], leaseIDs[held.GetLeaseId()] = held.GetFencingToken(), true
	for i := range c.nodes {
		c.kill(i)
	}
	for i := range c.nodes {
		c.start(i)
	}
	for i := range c.nodes {
		c.waitServing(i)
	}
	if err := retryUnavailable(func() error { return c.any().renew("r1", held.GetLeaseId()) }); err != nil {
		t.Fatalf("the held lease after the restart: %v", err)
	}
	if d, err := c.any().describe("r1"); err != nil || !d.GetHeld() || d.GetFencingToken() != held.GetFencingToken() {
		t.Fatalf("r1 after the restart: %v %v, want held with token %#x", d, err, held.GetFencingToken())
	}
	for i := 2; i <= 10; i++ {
		r := fmt.Sprintf("r%d", i)
		var a *wardenv1.AcquireResponse
		if err := retryUnavailable(func() (err error) { a, err = c.any().acquire(r, "after-restart", 10*time.Second, 0); return err }); err != nil {
			t.Fatalf("%s after the restart: %v", r, err)
		}
		if a.GetFencingToken() <= highest[r] {
			t.Fatalf("%s after the restart: token %#x, not above the highest before, %#x", r, a.GetFencingToken(), highest[r])
		}
		if leaseIDs[a.GetLeaseId()] {
			t.Fatalf("%s after the restart: lease id %s was issued before", r, a.GetLeaseId())
		}
	}
}

// A wiped member started with --initial-cluster-state new while the two
// other members are paused (SIGSTOP) for longer than a probe's 3 s must
// not start Raft on the timeout: it waits, saying why, with no Raft state
// in its directory. Resumed, the others answer with the placement state,
// which knows node 3 under its old incarnation, and node 3 exits naming
// it; the cluster serves every lease. Before, node 3 gave up on the
// probe after 3 s and started its empty placement replica, a voter that
// forgot what it acknowledged.
func TestClusterWipedNodeWaitsForPausedPeers(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	leases := c.holdMany("held", 8, 10*time.Minute)
	wiped := c.nodes[2]
	c.kill(2)
	if err := os.RemoveAll(wiped.dir); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.nodes[:2] {
		if err := n.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		n.up.Store(false)
	}
	c.extra[2] = []string{"--initial-cluster-state", "new"}
	c.start(2)
	c.extra[2] = nil
	// Real time must pass: longer than a probe's timeout, twice.
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-wiped.exited:
			t.Fatalf("node 3 exited (%v) while the others were paused:\n%s", err, wiped.log.Tail(20))
		case <-time.After(200 * time.Millisecond):
		}
		for _, sub := range []string{"nodehost", "wal"} {
			if _, err := os.Stat(filepath.Join(wiped.dir, sub)); err == nil {
				t.Fatalf("node 3 started Raft (%s/ exists) without the cluster's confirmation:\n%s", sub, wiped.log.Tail(20))
			}
		}
	}
	if !strings.Contains(wiped.log.String(), "waiting for the cluster to confirm") {
		t.Fatalf("node 3 does not say why it waits:\n%s", wiped.log.Tail(20))
	}
	for _, n := range c.nodes[:2] {
		if err := n.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		n.up.Store(true)
	}
	select {
	case err := <-wiped.exited:
		wiped.cmd, wiped.exited = nil, nil
		wiped.up.Store(false)
		if err == nil || !strings.Contains(wiped.log.String(), "incarnation") {
			t.Fatalf("node 3 exited (%v) without naming its incarnation:\n%s", err, wiped.log.Tail(20))
		}
		t.Logf("node 3 refused once the others resumed: %s", wiped.log.Tail(1))
	case <-time.After(90 * time.Second):
		t.Fatalf("node 3 neither refused nor stopped waiting after the others resumed:\n%s", wiped.log.Tail(20))
	}
	c.waitServing(0)
	c.waitServing(1)
	c.checkLeases(leases)
	c.checkNextTokens(leases)
}
