package shard

import (
	"encoding/binary"

	"github.com/warden-dev/warden/keyspace"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// Change is one write decided by Apply: a closed set of typed changes,
// each of which writes itself to a batch, keeping the store's indexes in
// step with the records (the store reads through the batch, so a change
// sees the ones before it). A put carries the new record; a delete, the
// record's key.
type Change interface {
	write(s *records, b writeBatch) error
}

type (
	putMeta      struct{ meta *shardv1.ShardMeta }
	putLock      struct{ lock *shardv1.LockRecord }
	deleteLock   struct{ resource string }
	putDedup     struct{ dedup *shardv1.DedupRecord }
	deleteDedup  struct{ resource, requestID string }
	putWaiter    struct{ waiter *shardv1.WaiterRecord }
	deleteWaiter struct {
		resource string
		seq      uint64
	}
	// putTenantWaiters sets a tenant's count of waiters (0 deletes it).
	putTenantWaiters struct {
		tenant string
		count  uint32
	}
	putQuota          struct{ quota *shardv1.QuotaRecord }
	deleteQuota       struct{ key string }
	putReservation    struct{ reservation *shardv1.ReservationRecord }
	deleteReservation struct{ key, id string }
	putPool           struct{ pool *shardv1.PoolRecord }
	deletePool        struct{ pool string }
	putLedger         struct{ event *shardv1.LedgerEvent }
	deleteLedger      struct {
		pool string
		seq  uint64
	}
	putCheckpoint    struct{ checkpoint *shardv1.LedgerCheckpoint }
	deleteCheckpoint struct{ key string }
	putReport        struct{ report *shardv1.UsageReport }
	deleteReport     struct{ key, id string }
)

// The meta is written once per batch (records.writeMeta).
func (c putMeta) write(s *records, _ writeBatch) error {
	s.meta, s.metaDirty = c.meta, true
	return nil
}

// A lock is indexed by its expiry while held and by its end after.
func (c putLock) write(s *records, b writeBatch) error {
	old, err := s.Lock(c.lock.GetResource())
	if err != nil {
		return err
	}
	if s.lockWritten != nil {
		s.lockWritten(old, c.lock)
	}
	if err := unindexLock(b, old); err != nil {
		return err
	}
	if err := indexLock(b, c.lock); err != nil {
		return err
	}
	return set(b, lockKey(c.lock.GetResource()), c.lock)
}

func (c deleteLock) write(s *records, b writeBatch) error {
	old, err := s.Lock(c.resource)
	if err != nil {
		return err
	}
	if s.lockWritten != nil {
		s.lockWritten(old, nil)
	}
	if err := unindexLock(b, old); err != nil {
		return err
	}
	return b.Delete(lockKey(c.resource), nil)
}

// An ended dedup record is indexed by its end, for the forgetting sweep.
func (c putDedup) write(s *records, b writeBatch) error {
	d := c.dedup
	old, err := s.Dedup(d.GetResource(), d.GetRequestId())
	if err != nil {
		return err
	}
	if err := unindexDedup(b, old); err != nil {
		return err
	}
	if d.GetEndedAtUnixNano() != 0 {
		if err := b.Set(endedDedupKey(d.GetEndedAtUnixNano(), d.GetResource(), d.GetRequestId()), nil, nil); err != nil {
			return err
		}
	}
	if d.GetReleased() {
		if err := b.Set(releasedKey(d.GetResource(), d.GetLeaseId()), []byte(d.GetRequestId()), nil); err != nil {
			return err
		}
	}
	return set(b, dedupKey(d.GetResource(), d.GetRequestId()), d)
}

func (c deleteDedup) write(s *records, b writeBatch) error {
	old, err := s.Dedup(c.resource, c.requestID)
	if err != nil || old == nil {
		return err
	}
	if err := unindexDedup(b, old); err != nil {
		return err
	}
	return b.Delete(dedupKey(c.resource, c.requestID), nil)
}

// unindexDedup removes dedup record old (nil: none) from the indexes of
// ended records and of released leases.
func unindexDedup(b writeBatch, old *shardv1.DedupRecord) error {
	if old.GetReleased() {
		if err := b.Delete(releasedKey(old.GetResource(), old.GetLeaseId()), nil); err != nil {
			return err
		}
	}
	if old.GetEndedAtUnixNano() == 0 {
		return nil
	}
	return b.Delete(endedDedupKey(old.GetEndedAtUnixNano(), old.GetResource(), old.GetRequestId()), nil)
}

// A waiter is indexed by its deadline.
func (c putWaiter) write(_ *records, b writeBatch) error {
	w := c.waiter
	if err := b.Set(waitIdxKey(w.GetDeadlineUnixNano(), w.GetResource(), w.GetSeq()), nil, nil); err != nil {
		return err
	}
	return set(b, waiterKey(w.GetResource(), w.GetSeq()), w)
}

func (c deleteWaiter) write(s *records, b writeBatch) error {
	old, err := s.Waiter(c.resource, c.seq)
	if err != nil || old == nil {
		return err
	}
	if err := b.Delete(waitIdxKey(old.GetDeadlineUnixNano(), c.resource, c.seq), nil); err != nil {
		return err
	}
	return b.Delete(waiterKey(c.resource, c.seq), nil)
}

func (c putTenantWaiters) write(_ *records, b writeBatch) error {
	if c.count == 0 {
		return b.Delete(tenantKey(c.tenant), nil)
	}
	return b.Set(tenantKey(c.tenant), binary.BigEndian.AppendUint32(nil, c.count), nil)
}

func (c putQuota) write(_ *records, b writeBatch) error {
	return set(b, quotaKey(c.quota.GetKey()), c.quota)
}

func (c deleteQuota) write(_ *records, b writeBatch) error { return b.Delete(quotaKey(c.key), nil) }

func (c putReservation) write(s *records, b writeBatch) error {
	return s.writeReservation(b, c.reservation.GetKey(), c.reservation.GetReservationId(), c.reservation)
}

func (c deleteReservation) write(s *records, b writeBatch) error {
	return s.writeReservation(b, c.key, c.id, nil)
}

// writeReservation replaces reservation (key, id) with r (nil: deletes
// it), keeping the indexes in step: an open reservation is indexed by its
// pool and expiry (the pool's expired-pending sum) and for the reclaimer,
// an ended one by its end, and each by its id in its pool.
func (s *records) writeReservation(b writeBatch, key, id string, r *shardv1.ReservationRecord) error {
	old, err := s.Reservation(key, id)
	if err != nil {
		return err
	}
	if r == nil {
		if err := b.Delete(poolIDKey(key, id), nil); err != nil {
			return err
		}
	} else if err := b.Set(poolIDKey(key, id), nil, nil); err != nil {
		return err
	}
	switch {
	case old.GetState() == shardv1.ReservationState_RESERVATION_STATE_OPEN:
		if err := b.Delete(poolExpKey(old), nil); err != nil {
			return err
		}
		if err := b.Delete(reclaimKey(old), nil); err != nil {
			return err
		}
	case old != nil:
		if err := b.Delete(endedReservationKey(old), nil); err != nil {
			return err
		}
	}
	if r == nil {
		return b.Delete(reservationKey(key, id), nil)
	}
	if r.GetState() == shardv1.ReservationState_RESERVATION_STATE_OPEN {
		if err := b.Set(poolExpKey(r), binary.BigEndian.AppendUint64(nil, uint64(r.GetAmount())), nil); err != nil {
			return err
		}
		if err := b.Set(reclaimKey(r), nil, nil); err != nil {
			return err
		}
	} else if err := b.Set(endedReservationKey(r), nil, nil); err != nil {
		return err
	}
	return set(b, reservationKey(key, id), r)
}

func (c putPool) write(_ *records, b writeBatch) error {
	return set(b, poolKey(c.pool.GetPool()), c.pool)
}

func (c deletePool) write(_ *records, b writeBatch) error { return b.Delete(poolKey(c.pool), nil) }

// A ledger event is indexed by its age, for retention.
func (c putLedger) write(_ *records, b writeBatch) error {
	if err := b.Set(ledgerAgeKey(c.event), nil, nil); err != nil {
		return err
	}
	return set(b, ledgerKey(keyspace.Pool(c.event.GetKey()), c.event.GetSeq()), c.event)
}

func (c deleteLedger) write(s *records, b writeBatch) error {
	old := &shardv1.LedgerEvent{}
	ok, err := s.get(ledgerKey(c.pool, c.seq), old)
	if err != nil {
		return err
	}
	if ok {
		if err := b.Delete(ledgerAgeKey(old), nil); err != nil {
			return err
		}
	}
	return b.Delete(ledgerKey(c.pool, c.seq), nil)
}

func (c putCheckpoint) write(_ *records, b writeBatch) error {
	return set(b, checkpointKey(c.checkpoint.GetKey()), c.checkpoint)
}

func (c deleteCheckpoint) write(_ *records, b writeBatch) error {
	return b.Delete(checkpointKey(c.key), nil)
}

func (c putReport) write(_ *records, b writeBatch) error {
	return set(b, reportKey(c.report.GetKey(), c.report.GetReportId()), c.report)
}

func (c deleteReport) write(_ *records, b writeBatch) error {
	return b.Delete(reportKey(c.key, c.id), nil)
}
