package shard

import (
	"hash/maphash"
	"io"

	"github.com/cockroachdb/pebble"
)

// valueCache is the Update side's write-through cache of stored values,
// so that applying a command reads its records from memory instead of
// through Pebble's memtables and levels (which was 40 % of a follower's
// apply time under the reference load). Update is the only writer of the
// database, and every write of a batch goes through writeBatch, so the
// cache always equals the committed state plus the open batch. It holds
// the keys Get has read, present or absent, every lock and dedup record
// written (a release reads the records its acquire wrote, seconds
// later), and the later writes of all of them. A failed Update stops the
// replica, and a new database (Open, RecoverFromSnapshot) gets a new
// cache.
//
// The cache keeps two generations: a key found in the older one moves to
// the recent one, and when the recent one is full it becomes the older
// one and the oldest is dropped, a cheap approximation of
// least-recently-used.
//
// In front of it, stored counts the lock and dedup keys the database and
// the open batch hold, by a 32-bit fingerprint of the key. A Get of such
// a key whose fingerprint counts none is answered "absent" without a
// read: that is every new request id's dedup key and every first acquire
// of a resource, which were most of the reads left to Pebble (see
// docs/perf/README.md for their share of CPU). A fingerprint shared by another
// key only costs the read. The counts are exact, never an estimate: a
// key is counted when a Set makes it present and uncounted when a Delete
// makes it absent, so "none" always means absent. About 10 bytes a key
// (24 MB for the 2.4 million dedup records of ten minutes of the
// reference load).
//
// A Delete drops its key from the cache rather than caching it absent
// (the filter answers for a lock or dedup record), and when deletes have
// emptied the maps, shrink rebuilds them: Go maps never give back the
// room they grew to. After 200,000 one-second leases on a dev cluster
// (three replicas in one process), all forgotten, the caches still held
// 70 MB of heap (57 MB of absent keys, 13 MB of an empty filter) until
// new writes displaced them; with drop and shrink, 4 MB.
type valueCache struct {
	recent, older map[string][]byte // nil value: the key is absent
	stored        map[uint32]uint32
	// storedPeak is the most fingerprints stored has counted since it
	// was built; dropped counts the entries Deletes removed from the
	// generations since they were. Both only drive shrink.
	storedPeak, dropped int
	// deleted counts the lock and dedup records deleted, and
	// recordsPeak the most such records the filter counted, since the
	// replica last asked its database to compact (compactDue).
	deleted, recordsPeak int
	// limit is the size of a generation, maxCachedValues (tests make it
	// small); fingerprint is the filter's hash of a key (tests make it
	// collide).
	limit       int
	fingerprint func(key []byte) uint32
}

// maxCachedValues bounds a generation of the cache (about 300 bytes an
// entry: two generations of 100,000 are some 60 MB). The filter is
// never cleared.
const maxCachedValues = 100_000

// newValueCache returns an empty cache whose filter counts the lock and
// dedup keys g holds, read with one scan of the range records.
func newValueCache(g getter) (*valueCache, error) {
	return newValueCacheWith(g, seededFingerprint())
}

// seededFingerprint returns a fingerprint for the filter with a seed of
// its own.
func seededFingerprint() func(key []byte) uint32 {
	seed := maphash.MakeSeed()
	return func(key []byte) uint32 { return uint32(maphash.Bytes(seed, key)) }
}

// newValueCacheWith is newValueCache with the filter's fingerprint.
func newValueCacheWith(g getter, fingerprint func(key []byte) uint32) (*valueCache, error) {
	c := emptyValueCache(fingerprint)
	it := g.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixRange}, UpperBound: []byte{prefixRange + 1}})
	for it.First(); it.Valid(); it.Next() {
		c.noteStored(it.Key())
	}
	if err := it.Error(); err != nil {
		it.Close()
		return nil, err
	}
	return c, it.Close()
}

// emptyValueCache returns a cache that holds no values and whose filter
// counts no keys yet: the caller passes every key of its database to
// noteStored before the cache is used.
func emptyValueCache(fingerprint func(key []byte) uint32) *valueCache {
	return &valueCache{recent: map[string][]byte{}, stored: map[uint32]uint32{}, limit: maxCachedValues, fingerprint: fingerprint}
}

// noteStored counts key, which the database holds, in the filter if the
// filter covers it.
func (c *valueCache) noteStored(key []byte) {
	if filtered(key) {
		c.countStored(c.fingerprint(key))
	}
}

// countStored counts one more stored key of fingerprint f.
func (c *valueCache) countStored(f uint32) {
	c.stored[f]++
	c.storedPeak = max(c.storedPeak, len(c.stored))
	c.recordsPeak = max(c.recordsPeak, len(c.stored))
}

// compactDue reports, once, that the database has shrunk enough since
// it was last compacted to compact it again: at least
// compactAfterDeletes deletes of lock and dedup records, and those
// records down to half their peak or less, by at least half as many.
// Deletes of other keys (indexes, waiters, quota records) do not count:
// a shard that holds few records must not compact for them. A steady load deletes as many records as it
// writes (every dedup record is forgotten after the window) and never
// shrinks, so it never compacts this way, only through Pebble's own
// level-size compactions; a burst that expired and was forgotten does.
func (c *valueCache) compactDue() bool {
	n := len(c.stored)
	if c.deleted < compactAfterDeletes || n > c.recordsPeak/2 || c.recordsPeak-n < compactAfterDeletes/2 {
		return false
	}
	c.deleted, c.recordsPeak = 0, len(c.stored)
	return true
}

// filtered reports whether the filter covers key: a lock or dedup record
// ('r', the 8-byte hash, the kind).
func filtered(key []byte) bool {
	return len(key) > 9 && key[0] == prefixRange && (key[9] == kindLock || key[9] == kindDedup)
}

// lookup returns the cached value of key (nil: absent) and whether it
// is cached.
func (c *valueCache) lookup(key []byte) ([]byte, bool) {
	if v, ok := c.recent[string(key)]; ok {
		return v, true
	}
	v, ok := c.older[string(key)]
	if ok {
		c.put(key, v)
	}
	return v, ok
}

// put caches value for key, nil when the key is absent; value is owned
// by the cache from then on.
func (c *valueCache) put(key, value []byte) {
	if len(c.recent) >= c.limit {
		c.older, c.recent = c.recent, make(map[string][]byte, c.limit)
	}
	c.recent[string(key)] = value
}

// write records a write of key, present with value or absent. A lock or
// dedup record is cached whether or not it was; other keys (the indexes,
// which are only scanned) only if they are, so that they do not crowd
// out the records. A deleted key is dropped (drop).
func (c *valueCache) write(key, value []byte, present bool) {
	if !present {
		c.drop(key)
		return
	}
	if !filtered(key) {
		if _, ok := c.recent[string(key)]; !ok {
			if _, ok := c.older[string(key)]; !ok {
				return
			}
		}
	}
	c.put(key, append([]byte{}, value...)) // never nil, so an empty value stays present
}

// drop removes key, which a Delete makes absent, from the cache: the
// filter, already uncounted (writeBatch.count), answers for a lock or
// dedup record, and other keys are only scanned. A mass expiry's
// forgets then leave the cache empty instead of full of absent keys.
func (c *valueCache) drop(key []byte) {
	n := len(c.recent) + len(c.older)
	delete(c.recent, string(key))
	delete(c.older, string(key))
	if len(c.recent)+len(c.older) < n {
		c.dropped++
	}
	c.shrink()
}

// shrink rebuilds the generations once Deletes have removed a quarter of
// a generation's worth of entries and less than that is left, and the
// filter once it counts under a quarter of its peak: each rebuild copies
// at most a quarter of what was deleted since the last, so it costs O(1)
// a Delete.
func (c *valueCache) shrink() {
	if c.dropped >= c.limit/4 && len(c.recent)+len(c.older) < c.limit/4 {
		c.recent, c.older, c.dropped = rebuilt(c.recent), rebuilt(c.older), 0
	}
	if len(c.stored) < c.storedPeak/4 {
		c.stored = rebuilt(c.stored)
		c.storedPeak = len(c.stored)
	}
}

// rebuilt returns a copy of m sized for its entries.
func rebuilt[K comparable, V any](m map[K]V) map[K]V {
	r := make(map[K]V, len(m))
	for k, v := range m {
		r[k] = v
	}
	return r
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
	if v, ok := b.cache.lookup(key); ok {
		if v == nil {
			return nil, nil, pebble.ErrNotFound
		}
		return v, noClose{}, nil
	}
	if filtered(key) && b.cache.stored[b.cache.fingerprint(key)] == 0 {
		return nil, nil, pebble.ErrNotFound
	}
	v, closer, err := b.Batch.Get(key)
	switch {
	case err == pebble.ErrNotFound:
		b.cache.put(key, nil)
		return nil, nil, err
	case err != nil:
		return nil, nil, err
	}
	b.cache.put(key, append([]byte{}, v...))
	return v, closer, nil
}

// Set writes key through the cache and the filter.
func (b writeBatch) Set(key, value []byte, o *pebble.WriteOptions) error {
	if err := b.count(key, true); err != nil {
		return err
	}
	b.cache.write(key, value, true)
	return b.Batch.Set(key, value, o)
}

// Delete deletes key through the cache and the filter.
func (b writeBatch) Delete(key []byte, o *pebble.WriteOptions) error {
	if err := b.count(key, false); err != nil {
		return err
	}
	b.cache.write(key, nil, false)
	return b.Batch.Delete(key, o)
}

// count keeps the filter exact before key is written: a Set of an absent
// key counts it, a Delete of a present key uncounts it, and rewriting a
// present key or deleting an absent one changes nothing. Whether key is
// present comes from the cache or the filter, and from the batch only
// for a key that is neither cached nor ruled out (records.write reads a
// record before it writes it, so that is rare).
func (b writeBatch) count(key []byte, present bool) error {
	if !filtered(key) {
		return nil
	}
	_, closer, err := b.Get(key)
	was := err == nil
	switch {
	case was:
		closer.Close()
	case err != pebble.ErrNotFound:
		return err
	}
	if was == present {
		return nil
	}
	f := b.cache.fingerprint(key)
	if present {
		b.cache.countStored(f)
	} else {
		b.cache.deleted++
		if b.cache.stored[f]--; b.cache.stored[f] == 0 {
			delete(b.cache.stored, f)
		}
	}
	return nil
}
