package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// replicaState is node i's ListShards state of node i's replica of
// shard 1 ("" when it cannot tell).
func (c *procCluster) replicaState(i int) string {
	resp, err := c.nodes[i].shards()
	if err != nil {
		return ""
	}
	for _, r := range resp.GetShards()[0].GetReplicas() {
		if r.GetNodeId() == c.nodes[i].id {
			return r.GetState()
		}
	}
	return ""
}

// A replica whose state machine directory went back in time (fault 6 of
// issue 41: Dragonboat panicked with "ss.OnDiskIndex (2428) >
// s.onDiskInitIndex (2125)", taking every replica of the node, at every
// start) is left stopped with an error naming it and the repair, while
// its node serves the placement group and writes through it;
// ListShards shows it failed and /readyz says why. The repair is a move
// away (which deletes it) and back: the new replica catches up by a
// snapshot.
func TestReplicaRolledBack(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	n3 := c.nodes[2]
	for i := range 20 {
		if _, err := c.nodes[0].acquire(fmt.Sprintf("rollback/a-%d", i), "a", time.Minute, 0); err != nil {
			t.Fatal(err)
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(n3.dir, "sm", "shard-1-replica-*"))
	if len(dirs) != 1 {
		t.Fatalf("premise: node 3's state machine directories of shard 1: %v", dirs)
	}
	smDir := dirs[0]
	old := filepath.Join(t.TempDir(), "old")
	c.kill(2)
	if out, err := exec.Command("cp", "-a", smDir, old).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	c.start(2)
	c.waitServing(2)
	// More entries, applied by node 3 and recorded by a snapshot on it.
	for i := range 50 {
		if err := retryUnavailable(func() error {
			_, err := c.nodes[0].acquire(fmt.Sprintf("rollback/b-%d", i), "b", time.Minute, 0)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	applied := func(i int) uint64 {
		ctx, cancel := rpcCtx()
		defer cancel()
		resp, err := c.nodes[i].node().AppliedIndex(ctx, connect.NewRequest(&placementv1.AppliedIndexRequest{ShardId: 1}))
		if err != nil {
			return 0
		}
		return resp.Msg.GetIndex()
	}
	waitFor(t, 30*time.Second, "node 3's replica to apply the writes", func() bool { return applied(2) >= applied(0) })
	waitFor(t, 30*time.Second, "a snapshot of every replica of shard 1", func() bool {
		ctx, cancel := rpcCtx()
		defer cancel()
		_, err := c.nodes[0].admin.Snapshot(ctx, connect.NewRequest(&wardenv1.SnapshotRequest{ShardId: 1}))
		return err == nil
	})

	c.kill(2)
	if err := os.RemoveAll(smDir); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", old, smDir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	c.start(2)
	waitFor(t, 60*time.Second, "node 3 to report its replica of shard 1 failed", func() bool {
		if err := nodeAlive(n3); err != nil {
			t.Fatal(err)
		}
		return c.replicaState(2) == "failed"
	})
	if code, body := n3.probe(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "warden admin move --shard 1 --from 3") {
		t.Errorf("/readyz of node 3 with its replica failed: %d %s, want 503 naming the repair", code, body)
	}
	if err := retryUnavailable(func() error {
		_, err := n3.acquire("rollback/c", "c", time.Minute, 0)
		return err
	}); err != nil {
		t.Errorf("a write through node 3 with its replica failed: %v", err)
	}
	if err := nodeAlive(n3); err != nil {
		t.Fatal(err)
	}
	if k := strings.Count(n3.log.String(), "replica not started"); k != 1 {
		t.Errorf("node 3 logged its failed replica %d times, want once:\n%s", k, n3.log.Tail(10))
	}

	// The repair: move the replica to another node of the zone, which
	// deletes it on node 3, and back, under a new replica id that
	// catches up by a snapshot.
	four := c.join("az3")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := c.nodes[four].admin.MoveReplica(ctx, connect.NewRequest(&wardenv1.MoveReplicaRequest{ShardId: 1, FromNodeId: 3, ToNodeId: 4})); err != nil {
		t.Fatalf("moving the failed replica away: %v", err)
	}
	waitFor(t, 30*time.Second, "node 3 to delete its failed replica", func() bool {
		_, err := os.Stat(smDir)
		return os.IsNotExist(err) && strings.Contains(n3.log.String(), "failed replica removed")
	})
	// A move is refused while node 1 has not heard node 3 answer its last
	// clock reading (one a second), which a loaded machine can miss.
	var back *connect.Response[wardenv1.MoveReplicaResponse]
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; {
		back, err = c.nodes[0].admin.MoveReplica(ctx, connect.NewRequest(&wardenv1.MoveReplicaRequest{ShardId: 1, FromNodeId: 4, ToNodeId: 3}))
		if err == nil || !strings.Contains(err.Error(), "does not answer") || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("moving the replica back: %v", err)
	}
	t.Logf("node 3 hosts replica %d of shard 1", back.Msg.GetReplicaId())
	c.waitSnapshotInstalled(2)
	waitFor(t, 60*time.Second, "node 3's replica to serve again", func() bool {
		code, _ := n3.probe(t, "/readyz")
		s := c.replicaState(2)
		return code == http.StatusOK && (s == "follower" || s == "leader")
	})
	c.agree("after the repair")
}
