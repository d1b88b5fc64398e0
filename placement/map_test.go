package placement

import (
	"testing"

	"github.com/warden-dev/warden/keyspace"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

func TestShardFor(t *testing.T) {
	h := keyspace.Hash("orders/42")
	split := NewMap(&placementv1.State{Generation: 2, Ranges: []*shardv1.RangeDescriptor{
		{ShardId: 1, Start: 0, End: h},
		{ShardId: 2, Start: h, End: h + 1},
		{ShardId: 3, Start: h + 1},
	}})
	if r, err := split.ShardFor("orders/42"); err != nil || r.GetShardId() != 2 {
		t.Fatalf("orders/42: shard %d (%v), want 2", r.GetShardId(), err)
	}
	gap := NewMap(&placementv1.State{Generation: 3, Ranges: []*shardv1.RangeDescriptor{{ShardId: 1, Start: 0, End: h}}})
	if _, err := gap.ShardFor("orders/42"); err == nil {
		t.Fatal("a hash outside every range was routed")
	}
}
