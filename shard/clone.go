package shard

import (
	"google.golang.org/protobuf/proto"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// Records read from the state are never modified in place: Apply clones
// before it changes one, so a Reader may hand out cached records.

func cloneMeta(m *shardv1.ShardMeta) *shardv1.ShardMeta { return proto.Clone(m).(*shardv1.ShardMeta) }

func cloneLock(l *shardv1.LockRecord) *shardv1.LockRecord {
	return proto.Clone(l).(*shardv1.LockRecord)
}

func cloneDedup(d *shardv1.DedupRecord) *shardv1.DedupRecord {
	return proto.Clone(d).(*shardv1.DedupRecord)
}

func cloneConfig(c *shardv1.ShardConfig) *shardv1.ShardConfig {
	return proto.Clone(c).(*shardv1.ShardConfig)
}
