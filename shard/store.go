package shard

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble"
	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/keyspace"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// getter is the read side shared by *pebble.DB, *pebble.Batch (indexed)
// and *pebble.Snapshot.
type getter interface {
	Get(key []byte) ([]byte, io.Closer, error)
	NewIter(o *pebble.IterOptions) *pebble.Iterator
}

// records reads and writes range records, meta and indexes on one getter.
// It implements Reader.
type records struct {
	g    getter
	meta *shardv1.ShardMeta // cached; loaded on first use
	// metaDirty: meta changed since it was last written; write stores it
	// once, when the Update's batch is complete (nearly every command moves
	// the shard's time, and meta carries it).
	metaDirty bool
	// initial is the meta of a shard that has no stored meta yet.
	initial func() *shardv1.ShardMeta
	// lockWritten, if set, hears each lock record a change replaces (old
	// is the record before it, next nil for a delete): the source of lock
	// events (applyEntry), from the read the change makes anyway.
	lockWritten func(old, next *shardv1.LockRecord)
}

// writeMeta stores meta in b if it changed since it was last stored.
func (s *records) writeMeta(b writeBatch) error {
	if !s.metaDirty {
		return nil
	}
	s.metaDirty = false
	return set(b, keyMeta, s.meta)
}

// FirstShard is the id of a deployment's first data shard, the one shard
// that starts owning a hash range: all of it.
const FirstShard uint64 = 1

// initialMeta is a new shard's meta: epoch 1, default config, and for
// FirstShard the whole hash range at generation 1 (DESIGN.md §2). Every
// other shard starts inactive, owning nothing until a move activates it
// with a range and a fresh epoch.
func initialMeta(shardID uint64) func() *shardv1.ShardMeta {
	return func() *shardv1.ShardMeta {
		m := &shardv1.ShardMeta{Epoch: 1, Config: DefaultConfig(), Range: &shardv1.RangeDescriptor{ShardId: shardID}}
		if shardID == FirstShard {
			m.Range.Generation = 1
		} else {
			m.Inactive = true
		}
		return m
	}
}

// upgradeConfig gives fields added to ShardConfig after a shard was
// created their defaults. Every replica does the same, so it stays
// deterministic.
func upgradeConfig(c *shardv1.ShardConfig) {
	d := DefaultConfig()
	if c.GetDefaultReservationTtlNanos() == 0 && c.GetMaxReservationTtlNanos() == 0 && c.GetFairnessThresholdPercent() == 0 {
		c.DefaultReservationTtlNanos, c.MaxReservationTtlNanos, c.FairnessThresholdPercent = d.DefaultReservationTtlNanos, d.MaxReservationTtlNanos, d.FairnessThresholdPercent
	}
	if c.GetMaxWaitTimeoutNanos() == 0 && c.GetMaxWaitersPerResource() == 0 && c.GetMaxWaitersPerTenant() == 0 {
		c.MaxWaitTimeoutNanos, c.MaxWaitersPerResource, c.MaxWaitersPerTenant = d.MaxWaitTimeoutNanos, d.MaxWaitersPerResource, d.MaxWaitersPerTenant
	}
}

func (s *records) get(key []byte, m proto.Message) (bool, error) {
	v, closer, err := s.g.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer closer.Close()
	if err := proto.Unmarshal(v, m); err != nil {
		return false, fmt.Errorf("%w: key %q: %v", ErrCorruptRecord, key, err)
	}
	return true, nil
}

// getAs reads the record at key into m: m, or nil when there is none.
func getAs[T proto.Message](s *records, key []byte, m T) (T, error) {
	ok, err := s.get(key, m)
	if !ok || err != nil {
		var none T
		return none, err
	}
	return m, nil
}

// Meta implements Reader.
func (s *records) Meta() (*shardv1.ShardMeta, error) {
	if s.meta != nil {
		return s.meta, nil
	}
	m := &shardv1.ShardMeta{}
	ok, err := s.get(keyMeta, m)
	if err != nil {
		return nil, err
	}
	if !ok {
		m = s.initial()
	}
	upgradeConfig(m.GetConfig())
	s.meta = m
	return m, nil
}

// Lock implements Reader.
func (s *records) Lock(resource string) (*shardv1.LockRecord, error) {
	return getAs(s, lockKey(resource), &shardv1.LockRecord{})
}

// Dedup implements Reader.
func (s *records) Dedup(resource, requestID string) (*shardv1.DedupRecord, error) {
	return getAs(s, dedupKey(resource, requestID), &shardv1.DedupRecord{})
}

// ReleasedLease implements Reader.
func (s *records) ReleasedLease(resource string, leaseID []byte) (*shardv1.DedupRecord, error) {
	v, closer, err := s.g.Get(releasedKey(resource, leaseID))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	requestID := string(v)
	closer.Close()
	d, err := s.Dedup(resource, requestID)
	if err != nil {
		return nil, err
	}
	if !d.GetReleased() || !bytes.Equal(d.GetLeaseId(), leaseID) {
		return nil, fmt.Errorf("%w: released lease index of %q names request %q, whose record does not match", ErrCorruptRecord, resource, requestID)
	}
	return d, nil
}

// Waiter implements Reader.
func (s *records) Waiter(resource string, seq uint64) (*shardv1.WaiterRecord, error) {
	return getAs(s, waiterKey(resource, seq), &shardv1.WaiterRecord{})
}

// NextWaiter implements Reader.
func (s *records) NextWaiter(resource string, from uint64) (*shardv1.WaiterRecord, error) {
	prefix := waiterPrefix(resource)
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: waiterKey(resource, from), UpperBound: prefixEnd(prefix)})
	defer it.Close()
	if !it.First() {
		return nil, it.Error()
	}
	w := &shardv1.WaiterRecord{}
	if err := proto.Unmarshal(it.Value(), w); err != nil {
		return nil, fmt.Errorf("%w: waiter %q: %v", ErrCorruptRecord, it.Key(), err)
	}
	return w, nil
}

// TenantWaiters implements Reader.
func (s *records) TenantWaiters(tenant string) (uint32, error) {
	v, closer, err := s.g.Get(tenantKey(tenant))
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer closer.Close()
	if len(v) != 4 {
		return 0, fmt.Errorf("%w: tenant count of %q is %d bytes", ErrCorruptRecord, tenant, len(v))
	}
	return binary.BigEndian.Uint32(v), nil
}

// prefixEnd is the first key after every key with the prefix.
func prefixEnd(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i]++; end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}

func appliedIndex(g getter) (uint64, error) {
	v, closer, err := g.Get(keyApplied)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: applied index is %d bytes", ErrCorruptRecord, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

func indexLock(b writeBatch, l *shardv1.LockRecord) error {
	if l.GetHeld() {
		return b.Set(expiryKey(l.GetExpiresAtUnixNano(), l.GetResource()), l.GetLeaseId(), nil)
	}
	return b.Set(endedLockKey(l.GetEndedAtUnixNano(), l.GetResource()), nil, nil)
}

func unindexLock(b writeBatch, l *shardv1.LockRecord) error {
	if l == nil {
		return nil
	}
	if l.GetHeld() {
		return b.Delete(expiryKey(l.GetExpiresAtUnixNano(), l.GetResource()), nil)
	}
	return b.Delete(endedLockKey(l.GetEndedAtUnixNano(), l.GetResource()), nil)
}

func set(b writeBatch, key []byte, m proto.Message) error {
	v, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return err
	}
	return b.Set(key, v, nil)
}

// expired lists up to limit held leases whose expires_at + max_clock_skew
// is at or before now: the candidates of a leader's Expire command. The
// locks that waiters queue for come first, so that a backlog of expired
// leases nobody waits for (a mass expiry) does not hold a waiter past
// its lock's expiry until the sweep reaches it; the rest follow in
// expiry order. Reading the waiter index costs at most 4 × limit entries.
func (s *records) expired(now int64, limit int) (*shardv1.ExpireCmd, error) {
	meta, err := s.Meta()
	if err != nil {
		return nil, err
	}
	due := now - meta.GetConfig().GetMaxClockSkewNanos()
	cmd := &shardv1.ExpireCmd{}
	seen := map[string]bool{}
	waited := s.g.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixWaitIdx}, UpperBound: []byte{prefixWaitIdx + 1}})
	scanned := 0
	for waited.First(); waited.Valid() && scanned < 4*limit && len(cmd.Items) < limit; waited.Next() {
		scanned++
		k := waited.Key() // 'x' deadline resource 0x00 seq
		if len(k) < 1+8+1+8 {
			_ = waited.Close()
			return nil, fmt.Errorf("%w: waiter index entry %q", ErrCorruptRecord, k)
		}
		resource := string(k[9 : len(k)-9])
		if seen[resource] {
			continue
		}
		seen[resource] = true
		l, err := s.Lock(resource)
		if err != nil {
			_ = waited.Close()
			return nil, err
		}
		if l.GetHeld() && l.GetExpiresAtUnixNano() <= due {
			cmd.Items = append(cmd.Items, &shardv1.ExpireItem{Resource: resource, LeaseId: l.GetLeaseId(), ExpiresAtUnixNano: l.GetExpiresAtUnixNano()})
		}
	}
	if err := waited.Close(); err != nil {
		return nil, err
	}
	hi := timeBound(prefixExpiry, due)
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixExpiry}, UpperBound: hi})
	for it.First(); it.Valid() && len(cmd.Items) < limit; it.Next() {
		k := it.Key()
		if seen[string(k[9:])] {
			continue // listed above if it is due
		}
		cmd.Items = append(cmd.Items, &shardv1.ExpireItem{
			Resource:          string(k[9:]),
			LeaseId:           bytes.Clone(it.Value()),
			ExpiresAtUnixNano: decodeTime(k[1:9]),
		})
	}
	return cmd, it.Close()
}

// forgettable lists up to limit dedup entries and idle lock records whose
// dedup window has passed at now.
func (s *records) forgettable(now int64, limit int) (*shardv1.ForgetCmd, error) {
	meta, err := s.Meta()
	if err != nil {
		return nil, err
	}
	cmd := &shardv1.ForgetCmd{}
	hi := timeBound(prefixEnded, now-meta.GetConfig().GetDedupWindowNanos())
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixEnded}, UpperBound: hi})
	for it.First(); it.Valid() && len(cmd.Dedup)+len(cmd.IdleLocks)+len(cmd.Reservations) < limit; it.Next() {
		k := it.Key()
		rest := k[10:]
		switch k[9] {
		case kindLock:
			cmd.IdleLocks = append(cmd.IdleLocks, string(rest))
		case kindDedup:
			res, req, ok := bytes.Cut(rest, []byte{0})
			if !ok {
				_ = it.Close()
				return nil, fmt.Errorf("%w: ended index key %q", ErrCorruptRecord, k)
			}
			cmd.Dedup = append(cmd.Dedup, &shardv1.DedupRef{Resource: string(res), RequestId: string(req)})
		case kindReservation:
			key, id, ok := bytes.Cut(rest, []byte{0})
			if !ok {
				_ = it.Close()
				return nil, fmt.Errorf("%w: ended index key %q", ErrCorruptRecord, k)
			}
			cmd.Reservations = append(cmd.Reservations, &shardv1.ReservationRef{Key: string(key), ReservationId: string(id)})
		}
	}
	return cmd, it.Close()
}

// timedOut lists up to limit queued waiters whose deadline is at or
// before now: the candidates of a leader's DropWaiters command.
func (s *records) timedOut(now int64, limit int) (*shardv1.DropWaitersCmd, error) {
	cmd := &shardv1.DropWaitersCmd{}
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixWaitIdx}, UpperBound: timeBound(prefixWaitIdx, now)})
	for it.First(); it.Valid() && len(cmd.Items) < limit; it.Next() {
		k := it.Key()
		rest := k[9:]
		if len(rest) < 9 || rest[len(rest)-9] != 0 {
			_ = it.Close()
			return nil, fmt.Errorf("%w: waiter index key %q", ErrCorruptRecord, k)
		}
		cmd.Items = append(cmd.Items, &shardv1.WaiterRef{
			Resource:         string(rest[:len(rest)-9]),
			Seq:              binary.BigEndian.Uint64(rest[len(rest)-8:]),
			DeadlineUnixNano: decodeTime(k[1:9]),
		})
	}
	return cmd, it.Close()
}

// hot lists up to limit lock records with the most waiters, most first
// (ties by resource name). It scans every lock record of the shard.
func (s *records) hot(limit int) ([]*shardv1.LockRecord, error) {
	var out []*shardv1.LockRecord
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixRange}, UpperBound: []byte{prefixRange + 1}})
	for it.First(); it.Valid(); it.Next() {
		if k := it.Key(); len(k) < 10 || k[9] != kindLock {
			continue
		}
		l := &shardv1.LockRecord{}
		if err := proto.Unmarshal(it.Value(), l); err != nil {
			_ = it.Close()
			return nil, fmt.Errorf("%w: lock %q: %v", ErrCorruptRecord, it.Key(), err)
		}
		if l.GetWaiters() == 0 {
			continue
		}
		out = append(out, l)
	}
	if err := it.Close(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b *shardv1.LockRecord) int {
		if a.GetWaiters() != b.GetWaiters() {
			return cmp.Compare(b.GetWaiters(), a.GetWaiters())
		}
		return strings.Compare(a.GetResource(), b.GetResource())
	})
	return out[:min(limit, len(out))], nil
}

// rangeBounds are the storage keys spanning the records with hashes in
// [start, end) (end 0: 2^64).
func rangeBounds(start, end uint64) (lower, upper []byte) {
	lower = binary.BigEndian.AppendUint64([]byte{prefixRange}, start)
	if end == 0 {
		return lower, []byte{prefixRange + 1}
	}
	return lower, binary.BigEndian.AppendUint64([]byte{prefixRange}, end)
}

// recordKinds adds a new record of each range-key kind to a page of
// RangeRecords and returns it, for the value to be decoded into.
var recordKinds = map[byte]func(*shardv1.RangeRecords) proto.Message{
	kindLock:        func(o *shardv1.RangeRecords) proto.Message { return appendNew(&o.Locks) },
	kindDedup:       func(o *shardv1.RangeRecords) proto.Message { return appendNew(&o.Dedups) },
	kindWaiter:      func(o *shardv1.RangeRecords) proto.Message { return appendNew(&o.Waiters) },
	kindQuota:       func(o *shardv1.RangeRecords) proto.Message { return appendNew(&o.Quotas) },
	kindReservation: func(o *shardv1.RangeRecords) proto.Message { return appendNew(&o.Reservations) },
	kindPool:        func(o *shardv1.RangeRecords) proto.Message { return appendNew(&o.Pools) },
	kindLedger:      func(o *shardv1.RangeRecords) proto.Message { return appendNew(&o.Ledger) },
	kindReport:      func(o *shardv1.RangeRecords) proto.Message { return appendNew(&o.Reports) },
	kindCheckpoint:  func(o *shardv1.RangeRecords) proto.Message { return appendNew(&o.Checkpoints) },
}

// appendNew appends a new, empty message to *list and returns it.
func appendNew[T any, P interface {
	*T
	proto.Message
}](list *[]P) P {
	m := P(new(T))
	*list = append(*list, m)
	return m
}

// Records implements Reader.
func (s *records) Records(start, end uint64, after []byte, limit int) (*shardv1.RangeRecords, []byte, error) {
	lower, upper := rangeBounds(start, end)
	if len(after) > 0 {
		lower = append(bytes.Clone(after), 0) // the first key after it
	}
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	defer it.Close()
	out := &shardv1.RangeRecords{}
	var last []byte
	for ok := it.First(); ok; ok = it.Next() {
		if limit > 0 && len(last) > 0 && RecordCount(out) == limit {
			return out, last, nil
		}
		k := it.Key()
		if len(k) < 10 {
			return nil, nil, fmt.Errorf("%w: range key %q is too short", ErrCorruptRecord, k)
		}
		add, ok := recordKinds[k[9]]
		if !ok {
			return nil, nil, fmt.Errorf("%w: range key %q has kind %q", ErrCorruptRecord, k, k[9])
		}
		m := add(out)
		if err := proto.Unmarshal(it.Value(), m); err != nil {
			return nil, nil, fmt.Errorf("%w: key %q: %v", ErrCorruptRecord, k, err)
		}
		last = bytes.Clone(k)
	}
	return out, nil, it.Error()
}

// Quota implements Reader.
func (s *records) Quota(key string) (*shardv1.QuotaRecord, error) {
	return getAs(s, quotaKey(key), &shardv1.QuotaRecord{})
}

// QuotaChildren implements Reader.
func (s *records) QuotaChildren(parent string) ([]*shardv1.QuotaRecord, error) {
	prefix := quotaKey(parent + "/")
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	defer it.Close()
	var out []*shardv1.QuotaRecord
	for ok := it.First(); ok; ok = it.Next() {
		if bytes.IndexByte(it.Key()[len(prefix):], '/') >= 0 {
			continue // a grandchild
		}
		q := &shardv1.QuotaRecord{}
		if err := proto.Unmarshal(it.Value(), q); err != nil {
			return nil, fmt.Errorf("%w: quota %q: %v", ErrCorruptRecord, it.Key(), err)
		}
		out = append(out, q)
	}
	return out, it.Error()
}

// Reservation implements Reader.
func (s *records) Reservation(key, id string) (*shardv1.ReservationRecord, error) {
	return getAs(s, reservationKey(key, id), &shardv1.ReservationRecord{})
}

// ReservationKeys implements Reader.
func (s *records) ReservationKeys(pool, id string) ([]string, error) {
	prefix := poolIDPrefix(pool, id)
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	defer it.Close()
	var out []string
	for ok := it.First(); ok; ok = it.Next() {
		out = append(out, string(it.Key()[len(prefix):]))
	}
	return out, it.Error()
}

// buildPoolIDs makes the pool index of reservation ids ('i') complete
// on db: unless the marker keyPoolIDsBuilt holds db's applied index (the
// index was complete at that index, markPoolIDs), it deletes the index and
// writes it anew from the reservation records. A binary older than the
// index writes reservations without it and moves the applied index on,
// not the marker; a snapshot stream never carries the marker, since its
// sender may be such a binary. The marker then holds the applied index,
// so every replica ends with the same keys.
func buildPoolIDs(db *pebble.DB) error {
	applied, err := appliedIndex(db)
	if err != nil {
		return err
	}
	switch v, closer, err := db.Get(keyPoolIDsBuilt); {
	case err == nil:
		built := len(v) == 8 && binary.BigEndian.Uint64(v) == applied
		closer.Close()
		if built {
			return nil
		}
	case !errors.Is(err, pebble.ErrNotFound):
		return err
	}
	b := db.NewBatch()
	defer b.Close()
	stale := db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixPoolID}, UpperBound: []byte{prefixPoolID + 1}})
	for stale.First(); stale.Valid(); stale.Next() {
		if err := b.Delete(stale.Key(), nil); err != nil {
			_ = stale.Close()
			return err
		}
	}
	if err := stale.Close(); err != nil {
		return err
	}
	it := db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixRange}, UpperBound: []byte{prefixRange + 1}})
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		if len(k) < 10 || k[9] != kindReservation {
			continue
		}
		key, id, ok := bytes.Cut(k[10:], []byte{0})
		if !ok {
			_ = it.Close()
			return fmt.Errorf("%w: reservation key %q", ErrCorruptRecord, k)
		}
		if err := b.Set(poolIDKey(string(key), string(id)), nil, nil); err != nil {
			_ = it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return err
	}
	if err := b.Set(keyPoolIDsBuilt, binary.BigEndian.AppendUint64(nil, applied), nil); err != nil {
		return err
	}
	return b.Commit(pebble.Sync)
}

// markPoolIDs records that db's pool index of reservation ids is complete
// at its applied index: the last write of a binary that keeps the index,
// before it closes db.
func markPoolIDs(db *pebble.DB) error {
	applied, err := appliedIndex(db)
	if err != nil {
		return err
	}
	return db.Set(keyPoolIDsBuilt, binary.BigEndian.AppendUint64(nil, applied), pebble.Sync)
}

// PoolRecord implements Reader.
func (s *records) PoolRecord(pool string) (*shardv1.PoolRecord, error) {
	return getAs(s, poolKey(pool), &shardv1.PoolRecord{})
}

// Report implements Reader.
func (s *records) Report(key, reportID string) (*shardv1.UsageReport, error) {
	return getAs(s, reportKey(key, reportID), &shardv1.UsageReport{})
}

// parsePoolExp decodes a pool expiry index entry after its prefix.
func parsePoolExp(rest, value []byte) (*shardv1.ReservationRecord, error) {
	if len(rest) < 9 || len(value) != 8 {
		return nil, fmt.Errorf("%w: pool expiry index entry %q", ErrCorruptRecord, rest)
	}
	key, id, _ := bytes.Cut(rest[8:], []byte{0})
	return &shardv1.ReservationRecord{ExpiresAtUnixNano: decodeTime(rest[:8]), Key: string(key), ReservationId: string(id),
		Amount: int64(binary.BigEndian.Uint64(value))}, nil
}

// Expired implements Reader.
func (s *records) Expired(pool string, now int64) ([]*shardv1.ReservationRecord, error) {
	prefix := poolExpPrefix(pool)
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: appendTime(bytes.Clone(prefix), now+1)})
	defer it.Close()
	var out []*shardv1.ReservationRecord
	for ok := it.First(); ok; ok = it.Next() {
		r, err := parsePoolExp(it.Key()[len(prefix):], it.Value())
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, it.Error()
}

// NextExpiry implements Reader.
func (s *records) NextExpiry(key string, now int64) (int64, error) {
	prefix := poolExpPrefix(keyspace.Pool(key))
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: appendTime(bytes.Clone(prefix), now+1), UpperBound: prefixEnd(prefix)})
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		r, err := parsePoolExp(it.Key()[len(prefix):], it.Value())
		if err != nil {
			return 0, err
		}
		if Under(r.GetKey(), key) {
			return r.GetExpiresAtUnixNano(), nil
		}
	}
	return 0, it.Error()
}

// Under reports whether quota key k is level or in its subtree.
func Under(k, level string) bool {
	return k == level || strings.HasPrefix(k, level+"/")
}

// reclaimable lists up to limit open reservations of any pool whose
// expiry passed by now, for the leader's reclaimer.
func (s *records) reclaimable(now int64, limit int) (*shardv1.ReclaimCmd, error) {
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixReclaim}, UpperBound: timeBound(prefixReclaim, now)})
	defer it.Close()
	out := &shardv1.ReclaimCmd{}
	for ok := it.First(); ok && len(out.Items) < limit; ok = it.Next() {
		k := it.Key()
		if len(k) < 10 {
			return nil, fmt.Errorf("%w: reclaim index entry %q", ErrCorruptRecord, k)
		}
		key, id, _ := bytes.Cut(k[9:], []byte{0})
		out.Items = append(out.Items, &shardv1.ReservationRef{Key: string(key), ReservationId: string(id), ExpiresAtUnixNano: decodeTime(k[1:9])})
	}
	return out, it.Error()
}

// RecordCount counts the records of every kind in r.
func RecordCount(r *shardv1.RangeRecords) int {
	return len(r.GetLocks()) + len(r.GetDedups()) + len(r.GetWaiters()) + len(r.GetQuotas()) +
		len(r.GetReservations()) + len(r.GetPools()) + len(r.GetLedger()) + len(r.GetReports()) + len(r.GetCheckpoints())
}

// Checkpoint implements Reader.
func (s *records) Checkpoint(key string) (*shardv1.LedgerCheckpoint, error) {
	return getAs(s, checkpointKey(key), &shardv1.LedgerCheckpoint{})
}

// LedgerFrom implements Reader.
func (s *records) LedgerFrom(pool string, seq uint64, limit int) ([]*shardv1.LedgerEvent, error) {
	prefix := ledgerPrefix(pool)
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: binary.BigEndian.AppendUint64(bytes.Clone(prefix), seq), UpperBound: prefixEnd(prefix)})
	defer it.Close()
	var out []*shardv1.LedgerEvent
	for ok := it.First(); ok && len(out) < limit; ok = it.Next() {
		e := &shardv1.LedgerEvent{}
		if err := proto.Unmarshal(it.Value(), e); err != nil {
			return nil, fmt.Errorf("%w: ledger %q: %v", ErrCorruptRecord, it.Key(), err)
		}
		out = append(out, e)
	}
	return out, it.Error()
}

// compactable lists, per pool, the last event older than the ledger
// retention at now, among the oldest limit events.
func (s *records) compactable(now int64, limit int) (*shardv1.CompactLedgerCmd, error) {
	meta, err := s.Meta()
	if err != nil {
		return nil, err
	}
	out := &shardv1.CompactLedgerCmd{}
	keep := meta.GetConfig().GetLedgerRetentionNanos()
	if keep == 0 {
		return out, nil
	}
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixLedgerAge}, UpperBound: timeBound(prefixLedgerAge, now-keep)})
	defer it.Close()
	through := map[string]uint64{}
	var pools []string
	for ok, n := it.First(), 0; ok && n < limit; ok, n = it.Next(), n+1 {
		k := it.Key()
		if len(k) < 18 {
			return nil, fmt.Errorf("%w: ledger age index entry %q", ErrCorruptRecord, k)
		}
		pool, seq := string(k[9:len(k)-9]), binary.BigEndian.Uint64(k[len(k)-8:])
		if _, seen := through[pool]; !seen {
			pools = append(pools, pool)
		}
		through[pool] = max(through[pool], seq)
	}
	for _, p := range pools {
		out.Items = append(out.Items, &shardv1.PoolSeq{Pool: p, ThroughSeq: through[p]})
	}
	return out, it.Error()
}
