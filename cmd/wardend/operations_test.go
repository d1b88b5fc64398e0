package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// waitOperation polls warden admin operation id at node i until it says
// want (", done"), for at most a minute.
func (c *procCluster) waitOperation(i int, id, want string) string {
	c.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := c.warden(i, "admin", "operation", id)
		if err == nil && strings.Contains(out, want) {
			return out
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("operation %s never %q: %v\n%s", id, want, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Splits and moves are operations with ids, through the CLI on three
// processes (and a fourth for the move). A split begun with --no-wait
// under a request id is followed to its end with warden admin
// operation; the same split asked again under the same id (a retry
// after an unknown outcome) answers the same split and splits nothing
// more; the id for another operation is refused naming request_id; a
// move shows its steps while it runs; warden admin operations lists
// both, ended, with their ids.
func TestClusterOperations(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	out, err := c.warden(0, "admin", "split", "1", "--request-id", "split-a", "--no-wait")
	m := regexp.MustCompile(`operation (\d+): follow it`).FindStringSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("split --no-wait: %v\n%s", err, out)
	}
	t.Logf("%s", c.waitOperation(1, m[1], ", done"))

	out, err = c.warden(2, "admin", "split", "1", "--request-id", "split-a")
	if err != nil || !strings.Contains(out, "the upper part is shard 2") {
		t.Fatalf("the split again under its request id: %v\n%s", err, out)
	}
	if shards := c.checkShards(); len(shards) != 2 {
		t.Fatalf("after a split and its retry: %d shards, want 2", len(shards))
	}
	if out, err := c.warden(0, "admin", "split", "2", "--request-id", "split-a"); err == nil || !strings.Contains(out, "request_id") {
		t.Fatalf("the id of a split of shard 1 for one of shard 2: %v\n%s", err, out)
	}
	if out, err := c.warden(0, "admin", "operation", "--request-id", "split-a"); err != nil || !strings.Contains(out, "split "+m[1]+": committed (step 4 of 4), done") {
		t.Fatalf("warden admin operation --request-id split-a: %v\n%s", err, out)
	}
	if out, err := c.warden(0, "admin", "operation", "99"); err == nil || !strings.Contains(out, "not_found") {
		t.Fatalf("an operation that never was: %v\n%s", err, out)
	}
	if out, err := c.warden(0, "admin", "operation", m[1], "--request-id", "other"); err == nil || !strings.Contains(out, "not both") {
		t.Fatalf("an id and a request id: %v\n%s", err, out)
	}
	if out, err := c.warden(0, "admin", "split", "2", "--request-id", "\x1b[31mred"); err == nil || !strings.Contains(out, "invalid_argument") || !strings.Contains(out, "request_id") {
		t.Fatalf("a request id with a control character: %v\n%s", err, out)
	}

	c.holdMany("op-held", 300, 5*time.Minute)
	c.join("az1")
	out, err = c.warden(1, "admin", "move", "1", "1", "4", "--request-id", "move-a")
	if err != nil || !strings.Contains(out, "replica moved from node 1 to node 4") {
		t.Fatalf("warden admin move: %v\n%s", err, out)
	}
	t.Logf("warden admin move:\n%s", out)
	out, err = c.warden(0, "admin", "operations")
	if err != nil || !regexp.MustCompile(`(?m)^\d+ +move +done +removed \(4/4\) +1 +node 1 → node 4 +move-a$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^`+m[1]+` +split +done +committed \(4/4\) +1 .* split-a$`).MatchString(out) {
		t.Fatalf("warden admin operations: %v\n%s", err, out)
	}
	t.Logf("warden admin operations:\n%s", out)
}

// A rolling upgrade across placement command version 6 (operations kept
// and named). Nodes 1 and 2 run this binary, node 3 the one before. A
// request id is refused at every new node before anything is begun
// (node 3, if it leads the placement group, would ignore it); a split
// without one runs, is not kept once ended, and the placement replicas
// agree, and a forced node removal (version 7) is refused naming the
// upgrade. Node 3 upgraded in place, a split under a request id runs
// and is kept on every placement replica alike, and so is a rebalance,
// now an operation of its own.
func TestClusterMixedOperations(t *testing.T) {
	t.Parallel()
	old := buildBefore(t, "placement/meta.go", "MetaCommandVersion uint32 = 6")
	c := newProcCluster(t)
	c.bins = map[int]string{2: old}
	c.boot()
	for _, i := range []int{0, 1} {
		if out, err := c.warden(i, "admin", "split", "1", "--request-id", "mixed"); err == nil || !strings.Contains(out, "version") {
			t.Fatalf("a request id at node %d beside a version 5 binary: %v\n%s", i+1, err, out)
		}
	}
	if out, err := c.warden(0, "admin", "split", "1"); err != nil || !strings.Contains(out, "the upper part is shard 2") {
		t.Fatalf("a split without a request id: %v\n%s", err, out)
	}
	if out, err := c.warden(0, "admin", "node", "remove", "3", "--force"); err == nil || !strings.Contains(out, "need every node upgraded first") {
		t.Fatalf("a forced removal beside a version 5 binary: %v\n%s", err, out)
	}
	sum, st := c.placementDigest()
	if len(st.GetFinishedOperators()) != 0 {
		t.Fatalf("a version 5 cluster kept ended operators: %v", st.GetFinishedOperators())
	}
	t.Logf("mixed binaries: digest %s…", sum[:16])

	c.upgradeNode3(6)
	var out string
	if err := retryUnavailable(func() (err error) {
		out, err = c.warden(0, "admin", "split", "2", "--request-id", "upgraded")
		if err != nil && strings.Contains(out, "unavailable") {
			return connect.NewError(connect.CodeUnavailable, err)
		}
		return err
	}); err != nil || !strings.Contains(out, "the upper part is shard 3") {
		t.Fatalf("a split under a request id once every node runs version 6: %v\n%s", err, out)
	}
	sum, st = c.placementDigest()
	if kept := st.GetFinishedOperators(); len(kept) != 1 || kept[0].GetRequestId() != "upgraded" {
		t.Fatalf("after the upgrade the placement replicas keep %v", kept)
	}
	t.Logf("upgraded: the split kept on every placement replica, digest %s…", sum[:16])

	// Version 7: a rebalance is an operation (a job), kept alike on every
	// placement replica.
	if err := retryUnavailable(func() (err error) {
		out, err = c.warden(0, "admin", "rebalance", "--request-id", "rebalance-a")
		if err != nil && strings.Contains(out, "unavailable") {
			return connect.NewError(connect.CodeUnavailable, err)
		}
		return err
	}); err != nil {
		t.Fatalf("a rebalance once every node runs version 7: %v\n%s", err, out)
	}
	sum, st = c.placementDigest()
	// Kept: the split, the rebalance last, and between them the moves the
	// rebalance ran as its steps (when a split left a shard short of a
	// replica, its node being upgraded then), each naming it as parent.
	kept := st.GetFinishedOperators()
	if len(kept) < 2 {
		t.Fatalf("after the rebalance the placement replicas keep %v", kept)
	}
	last := kept[len(kept)-1]
	if kept[0].GetSplit() == nil || last.GetRebalance() == nil || last.GetRequestId() != "rebalance-a" {
		t.Fatalf("after the rebalance the placement replicas keep %v", kept)
	}
	for _, op := range kept[1 : len(kept)-1] {
		if op.GetMove() == nil || op.GetParent() != last.GetId() {
			t.Fatalf("after the rebalance the placement replicas keep %v: %v is not one of the rebalance's steps", kept, op)
		}
	}
	t.Logf("upgraded: the rebalance kept on every placement replica, digest %s…", sum[:16])
}
