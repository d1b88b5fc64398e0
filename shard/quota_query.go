package shard

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cockroachdb/pebble"
	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/keyspace"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// quotaLevels answers a QuotaQuery: every level of key's path at time
// now, root first, with reservations past their ttl counted as
// expired_pending and not as reserved (DESIGN.md §4).
func (s *records) quotaLevels(key string, now int64) ([]*shardv1.QuotaLevel, error) {
	exp, err := s.Expired(keyspace.Pool(key), now)
	if err != nil {
		return nil, err
	}
	var out []*shardv1.QuotaLevel
	for _, l := range Levels(key) {
		q, err := s.Quota(l)
		if err != nil {
			return nil, err
		}
		if q == nil {
			q = &shardv1.QuotaRecord{Key: l, Weight: 1}
		}
		lv := &shardv1.QuotaLevel{Record: q}
		for _, r := range exp {
			if Under(r.GetKey(), l) {
				lv.ExpiredPending += r.GetAmount()
			}
		}
		lv.Reserved = q.GetReserved() - lv.GetExpiredPending()
		if q.GetHasLimit() {
			lv.Remaining = max(0, q.GetLimit()-q.GetCommitted()-lv.GetReserved())
		}
		out = append(out, lv)
	}
	return out, nil
}

// openReservations answers a ReservationsQuery: open, unexpired
// reservations at or under key, in key order.
func (s *records) openReservations(q *shardv1.ReservationsQuery, now int64) ([]*shardv1.ReservationRecord, error) {
	prefix := quotaPrefix(keyspace.Pool(q.GetKey()), kindReservation)
	lower := append(bytes.Clone(prefix), q.GetKey()...)
	if q.GetAfterKey() != "" {
		lower = append(reservationKey(q.GetAfterKey(), q.GetAfterId()), 0)
	}
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(prefix)})
	defer it.Close()
	limit := int(max(q.GetLimit(), 1))
	var out []*shardv1.ReservationRecord
	for ok := it.First(); ok && len(out) < limit; ok = it.Next() {
		r := &shardv1.ReservationRecord{}
		if err := proto.Unmarshal(it.Value(), r); err != nil {
			return nil, fmt.Errorf("%w: reservation %q: %v", ErrCorruptRecord, it.Key(), err)
		}
		if !bytes.HasPrefix(it.Key(), append(bytes.Clone(prefix), q.GetKey()...)) {
			break // past every key that starts with key
		}
		if Under(r.GetKey(), q.GetKey()) && r.GetState() == shardv1.ReservationState_RESERVATION_STATE_OPEN && now < r.GetExpiresAtUnixNano() {
			out = append(out, r)
		}
	}
	return out, it.Error()
}

// maxLedgerScan bounds the events one LedgerQuery reads.
const maxLedgerScan = 10_000

// ledgerEvents answers a LedgerQuery: events of key's subtree with seq >
// after_seq, in sequence order.
func (s *records) ledgerEvents(q *shardv1.LedgerQuery) ([]*shardv1.LedgerEvent, error) {
	if q.GetAfterSeq() == math.MaxUint64 {
		return nil, nil // nothing comes after the last sequence number
	}
	prefix := ledgerPrefix(keyspace.Pool(q.GetKey()))
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: binary.BigEndian.AppendUint64(bytes.Clone(prefix), q.GetAfterSeq()+1), UpperBound: prefixEnd(prefix)})
	defer it.Close()
	limit := int(max(q.GetLimit(), 1))
	var out []*shardv1.LedgerEvent
	scanned := 0
	for ok := it.First(); ok && len(out) < limit && scanned < maxLedgerScan; ok = it.Next() {
		scanned++
		e := &shardv1.LedgerEvent{}
		if err := proto.Unmarshal(it.Value(), e); err != nil {
			return nil, fmt.Errorf("%w: ledger %q: %v", ErrCorruptRecord, it.Key(), err)
		}
		if Under(e.GetKey(), q.GetKey()) {
			out = append(out, e)
		}
	}
	return out, it.Error()
}

// checkpoints answers the checkpoint part of a LedgerQuery: those of the
// keys at or under key.
func (s *records) checkpoints(key string) ([]*shardv1.LedgerCheckpoint, error) {
	prefix := checkpointKey(key)
	it := s.g.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(quotaPrefix(keyspace.Pool(key), kindCheckpoint))})
	defer it.Close()
	var out []*shardv1.LedgerCheckpoint
	for ok := it.First(); ok && bytes.HasPrefix(it.Key(), prefix); ok = it.Next() {
		k := &shardv1.LedgerCheckpoint{}
		if err := proto.Unmarshal(it.Value(), k); err != nil {
			return nil, fmt.Errorf("%w: checkpoint %q: %v", ErrCorruptRecord, it.Key(), err)
		}
		if Under(k.GetKey(), key) {
			out = append(out, k)
		}
	}
	return out, it.Error()
}
