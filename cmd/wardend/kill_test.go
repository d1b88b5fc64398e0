package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// DESIGN.md §5 "one replica down" and "two replicas down": with one of
// three processes SIGKILLed during traffic, every shard keeps serving
// (through the surviving nodes) and the restarted node catches up; with
// two killed, every write answers Unavailable and nothing is granted;
// after a restart service resumes without manual repair and no
// acknowledged lease is lost.
func TestClusterSurvivesKills(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	leases := c.holdMany("kept", 100, 5*time.Minute)
	split, err := c.nodes[0].admin.SplitShard(context.Background(), connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: 1}))
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	t.Logf("two shards: new shard %d", split.Msg.GetNewShardId())

	// One down, under traffic, whichever shards it led.
	tr := c.runTraffic(4)
	defer tr.stop.Store(true) // when the test fails early too
	time.Sleep(500 * time.Millisecond)
	victim := 2
	c.kill(victim)
	before := tr.ops.Load()
	time.Sleep(3 * time.Second)
	during := map[string]*wardenv1.AcquireResponse{}
	for i := range 20 {
		r := fmt.Sprintf("during-%d", i)
		a, err := c.any().acquire(r, "d-"+r, 5*time.Minute, 0)
		if err != nil {
			t.Fatalf("acquire %s with node %d down: %v", r, victim+1, err)
		}
		during[r] = a
	}
	tr.finish(t)
	if tr.ops.Load()-before < 20 {
		t.Fatalf("only %d operations completed with one node down", tr.ops.Load()-before)
	}
	c.checkLeases(leases)

	// A forced snapshot and compaction with the node down: the live
	// replicas compact, and each of the down node's replicas is reported
	// by shard and node with the error.
	snap, err := c.nodes[0].admin.Snapshot(context.Background(), connect.NewRequest(&wardenv1.SnapshotRequest{}))
	if err != nil {
		t.Fatalf("snapshot with node %d down: %v", victim+1, err)
	}
	down := 0
	for _, s := range snap.Msg.GetSnapshots() {
		switch {
		case s.GetNodeId() == uint64(victim+1):
			down++
			if s.GetError() == "" || s.GetShardId() == 0 {
				t.Errorf("the down node's replica: %v", s)
			}
		case s.GetShardId() == 0 || s.GetNodeId() == 0:
			t.Errorf("a replica without ids: %v", s)
		}
	}
	if down != 2 { // it hosts a replica of both shards
		t.Fatalf("%d replicas of the down node reported: %v", down, snap.Msg.GetSnapshots())
	}

	// The restarted node catches up: it answers for what happened while
	// it was down (its reads go to the leaders, so check its replicas too).
	c.start(victim)
	c.waitServing(victim)
	for r, a := range during {
		d, err := c.nodes[victim].describe(r)
		if err != nil || d.GetFencingToken() != a.GetFencingToken() {
			t.Fatalf("%s via the restarted node: %v %v", r, d, err)
		}
	}

	// Two down: no quorum anywhere. Writes answer Unavailable promptly.
	c.kill(1)
	c.kill(2)
	var granted atomic.Int64
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		start := time.Now()
		_, err := c.nodes[0].locks.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{
			Resource: fmt.Sprintf("minority-%d", i), RequestId: "m", LeaseTtl: durationpb.New(time.Minute)}))
		cancel()
		if err == nil {
			granted.Add(1)
		} else if code := connect.CodeOf(err); code != connect.CodeUnavailable {
			t.Fatalf("acquire without quorum: %v (after %v), want unavailable", err, time.Since(start))
		}
	}
	if granted.Load() > 0 {
		t.Fatalf("%d acquires were granted without a quorum", granted.Load())
	}

	// Both back: service resumes by itself, nothing acknowledged lost.
	c.start(1)
	c.start(2)
	for i := range c.nodes {
		c.waitServing(i)
	}
	c.checkLeases(leases)
	c.checkLeases(during)
	if _, err := c.any().acquire("after-recovery", "a", time.Minute, 0); err != nil {
		t.Fatalf("acquire after recovery: %v", err)
	}
}
