package rpc_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/server"
)

// Bad admin requests get the right code and, for a bad field, a
// FieldViolation naming it; none changes the map.
func TestAdminRefusals(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	admin := wardenv1connect.NewAdminServiceClient(c.srv.Client(), c.srv.URL)
	field := func(err error) string {
		var ce *connect.Error
		if !errors.As(err, &ce) {
			return ""
		}
		for _, d := range ce.Details() {
			if v, err := d.Value(); err == nil {
				if fv, ok := v.(*wardenv1.FieldViolation); ok {
					return fv.GetField()
				}
			}
		}
		return ""
	}
	_, err := admin.SplitShard(ctx(t), connect.NewRequest(&wardenv1.SplitShardRequest{}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || field(err) != "shard_id" {
		t.Errorf("split without a shard: %v (field %q)", err, field(err))
	}
	_, err = admin.SplitShard(ctx(t), connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: 99}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = admin.SplitShard(ctx(t), connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: 1, SplitAt: 0}))
	if err != nil {
		t.Fatalf("split at the middle: %v", err)
	}
	_, err = admin.SplitShard(ctx(t), connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: 1, SplitAt: 1 << 63}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || field(err) != "split_at" {
		t.Errorf("split at the end of the range: %v (field %q)", err, field(err))
	}
	_, err = admin.MoveReplica(ctx(t), connect.NewRequest(&wardenv1.MoveReplicaRequest{ShardId: 1, FromNodeId: 1, ToNodeId: 9}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = admin.MoveReplica(ctx(t), connect.NewRequest(&wardenv1.MoveReplicaRequest{ShardId: 1, FromNodeId: 9, ToNodeId: 2}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || field(err) != "from_node_id" {
		t.Errorf("move from a node without a replica: %v (field %q)", err, field(err))
	}
	_, err = admin.MoveReplica(ctx(t), connect.NewRequest(&wardenv1.MoveReplicaRequest{ShardId: 1, FromNodeId: 1, ToNodeId: 2}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || field(err) != "to_node_id" {
		t.Errorf("move onto a node that has a replica: %v (field %q)", err, field(err))
	}
	_, err = admin.TransferLeader(ctx(t), connect.NewRequest(&wardenv1.TransferLeaderRequest{ShardId: 1, NodeId: 9}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = admin.SetShardConfig(ctx(t), connect.NewRequest(&wardenv1.SetShardConfigRequest{MaxLeaseTtl: durationpb.New(1000 * 24 * time.Hour)}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || field(err) != "max_lease_ttl" {
		t.Errorf("a lease TTL of 1,000 days: %v (field %q)", err, field(err))
	}
	shards, err := admin.ListShards(ctx(t), connect.NewRequest(&wardenv1.ListShardsRequest{}))
	if err != nil || shards.Msg.GetGeneration() != 2 || len(shards.Msg.GetShards()) != 2 {
		t.Fatalf("after the refusals: %v %v", shards, err)
	}
}

// TestAdminSnapshotsAtOnce: admin snapshots of the same replicas at
// the same time meet in Dragonboat, which refuses a snapshot request
// while another of the replica is pending (ErrSystemBusy), as it does
// when an admin snapshot meets the node's snapshot of an idle replica.
// Each waits for the other and asks again: a replica reports a
// snapshot, or that there was nothing left to snapshot, never that it
// was busy.
func TestAdminSnapshotsAtOnce(t *testing.T) {
	var busy atomic.Int64
	c := startCluster(t, server.DevConfig{Router: router.Config{Knobs: router.TestingKnobs{OnSnapshotBusy: func() { busy.Add(1) }}}})
	admin := wardenv1connect.NewAdminServiceClient(c.srv.Client(), c.srv.URL)
	const rounds, callers = 10, 4
	for round := range rounds {
		if _, err := c.locks.Acquire(ctx(t), acquireReq(fmt.Sprintf("snap/%d", round))); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		resps := make([]*wardenv1.SnapshotResponse, callers)
		errs := make([]error, callers)
		for i := range callers {
			wg.Go(func() {
				r, err := admin.Snapshot(ctx(t), connect.NewRequest(&wardenv1.SnapshotRequest{}))
				if errs[i] = err; err == nil {
					resps[i] = r.Msg
				}
			})
		}
		wg.Wait()
		for i := range callers {
			if errs[i] != nil {
				t.Fatalf("round %d: snapshot: %v", round, errs[i])
			}
			for _, rs := range resps[i].GetSnapshots() {
				if e := rs.GetError(); e != "" && !strings.HasPrefix(e, "nothing to snapshot") {
					t.Errorf("round %d: shard %d on node %d: %s", round, rs.GetShardId(), rs.GetNodeId(), e)
				}
			}
		}
	}
	if busy.Load() == 0 {
		t.Fatal("no admin snapshot met another; the test did not exercise the wait")
	}
}
