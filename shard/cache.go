package shard

import (
	"io"

	"github.com/cockroachdb/pebble"
)

// valueCache is the Update side's write-through cache of stored values,
// so that applying a command reads its records from memory instead of
// through Pebble's memtables and levels (which was 40 % of a follower's
// apply time under the reference load). Update is the only writer of the
// database, and every write of a batch goes through writeBatch, so the
// cache always equals the committed state plus the open batch. It holds
// the keys Get has read, present or absent, and their later writes. A failed Update stops the replica, and
// a new database (Open, RecoverFromSnapshot) gets a new cache.
type valueCache struct {
	values map[string][]byte // nil value: the key is absent
}

// maxCachedValues bounds the cache; past it the cache starts over empty
// (about 300 bytes an entry: 200,000 entries are some 60 MB).
const maxCachedValues = 200_000

func newValueCache() *valueCache { return &valueCache{values: map[string][]byte{}} }

// entry is a cached value: a copy of value when present (never nil, so
// an empty value stays present), nil when absent.
func entry(value []byte, present bool) []byte {
	if !present {
		return nil
	}
	return append([]byte{}, value...)
}

// load caches what the batch holds for key.
func (c *valueCache) load(key, value []byte, present bool) {
	if len(c.values) >= maxCachedValues {
		clear(c.values)
	}
	c.values[string(key)] = entry(value, present)
}

// update records a write of key if the key is cached. Keys that were
// never read (the indexes, which are only scanned) stay out: the next Get
// of such a key reads it from the batch.
func (c *valueCache) update(key, value []byte, present bool) {
	if _, ok := c.values[string(key)]; ok {
		c.values[string(key)] = entry(value, present)
	}
}

// writeBatch is an Update's indexed batch with the cache in front: Get
// reads through it, Set and Delete write through it. It implements
// getter; NewIter reads the batch and database directly.
type writeBatch struct {
	*pebble.Batch
	cache *valueCache
}

type noClose struct{}

func (noClose) Close() error { return nil }

// Get implements getter. The value returned must not be modified.
func (b writeBatch) Get(key []byte) ([]byte, io.Closer, error) {
	if v, ok := b.cache.values[string(key)]; ok {
		if v == nil {
			return nil, nil, pebble.ErrNotFound
		}
		return v, noClose{}, nil
	}
	v, closer, err := b.Batch.Get(key)
	switch {
	case err == pebble.ErrNotFound:
		b.cache.load(key, nil, false)
		return nil, nil, err
	case err != nil:
		return nil, nil, err
	}
	b.cache.load(key, v, true)
	return v, closer, nil
}

// Set writes key through the cache.
func (b writeBatch) Set(key, value []byte, o *pebble.WriteOptions) error {
	b.cache.update(key, value, true)
	return b.Batch.Set(key, value, o)
}

// Delete deletes key through the cache.
func (b writeBatch) Delete(key []byte, o *pebble.WriteOptions) error {
	b.cache.update(key, nil, false)
	return b.Batch.Delete(key, o)
}
