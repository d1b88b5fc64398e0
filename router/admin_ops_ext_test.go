package router_test

import (
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
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
