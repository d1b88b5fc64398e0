package shard

import (
	"bytes"
	"io"

	"github.com/cockroachdb/pebble"
)

// valueCache is the Update side's write-through cache of stored values,
// so that applying a command reads its records from memory instead of
// through Pebble's memtables and levels (which was 40 % of a follower's
// apply time under the reference load). Update is the only writer of the
// database, and every write of a batch goes through writeBatch, so the
// cache always equals the committed state plus the open batch. It also
// remembers keys that are absent. A failed Update stops the replica, and
// a new database (Open, RecoverFromSnapshot) gets a new cache.
type valueCache struct {
	values map[string][]byte // nil value: the key is absent
}

// maxCachedValues bounds the cache; past it the cache starts over empty
// (about 300 bytes an entry: 200,000 entries are some 60 MB).
const maxCachedValues = 200_000

func newValueCache() *valueCache { return &valueCache{values: map[string][]byte{}} }

func (c *valueCache) put(key, value []byte) {
	if len(c.values) >= maxCachedValues {
		clear(c.values)
	}
	if value == nil {
		value = []byte{} // present, empty
	}
	c.values[string(key)] = bytes.Clone(value)
}

func (c *valueCache) forget(key []byte) {
	if len(c.values) >= maxCachedValues {
		clear(c.values)
	}
	c.values[string(key)] = nil
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
		b.cache.forget(key)
		return nil, nil, err
	case err != nil:
		return nil, nil, err
	}
	b.cache.put(key, v)
	return v, closer, nil
}

// Set writes key through the cache.
func (b writeBatch) Set(key, value []byte, o *pebble.WriteOptions) error {
	b.cache.put(key, value)
	return b.Batch.Set(key, value, o)
}

// Delete deletes key through the cache.
func (b writeBatch) Delete(key []byte, o *pebble.WriteOptions) error {
	b.cache.forget(key)
	return b.Batch.Delete(key, o)
}
