package placement

import (
	"fmt"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// FirstDataShard is the id of the data shard a new deployment starts with.
const FirstDataShard = shard.FirstShard

// Map is a placement map: which shard owns which hash range. Routers cache
// it and send its Generation with every proposal; a shard refuses a
// proposal routed by an older generation than its own range's.
type Map struct {
	Generation uint64
	Ranges     []*shardv1.RangeDescriptor // sorted by Start, covering 0..2^64
}

// SingleShard is the map of a new deployment: FirstDataShard owns the whole
// hash range at generation 1 (the initial range a shard state machine
// assumes, see shard.initialMeta).
func SingleShard() *Map {
	return &Map{Generation: 1, Ranges: []*shardv1.RangeDescriptor{{ShardId: FirstDataShard, Generation: 1}}}
}

// ShardFor returns the shard that owns key's hash.
func (m *Map) ShardFor(key string) (uint64, error) {
	h := shard.KeyHash(key)
	for _, r := range m.Ranges {
		if shard.InRange(r, h) {
			return r.GetShardId(), nil
		}
	}
	return 0, fmt.Errorf("placement: no shard owns hash %#x (generation %d)", h, m.Generation)
}
