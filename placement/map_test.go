package placement

import (
	"testing"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

func TestShardFor(t *testing.T) {
	if id, err := SingleShard().ShardFor("anything"); err != nil || id != FirstDataShard {
		t.Fatalf("single shard: %d %v", id, err)
	}
	h := shard.KeyHash("orders/42")
	split := &Map{Generation: 2, Ranges: []*shardv1.RangeDescriptor{
		{ShardId: 1, Start: 0, End: h},
		{ShardId: 2, Start: h, End: h + 1},
		{ShardId: 3, Start: h + 1},
	}}
	for _, tc := range []struct {
		key  string
		want uint64
	}{{"orders/42", 2}} {
		if id, err := split.ShardFor(tc.key); err != nil || id != tc.want {
			t.Fatalf("%s: shard %d (%v), want %d", tc.key, id, err, tc.want)
		}
	}
	gap := &Map{Generation: 3, Ranges: []*shardv1.RangeDescriptor{{ShardId: 1, Start: 0, End: h}}}
	if _, err := gap.ShardFor("orders/42"); err == nil {
		t.Fatal("a hash outside every range was routed")
	}
}
