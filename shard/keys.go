package shard

import (
	"encoding/binary"

	"github.com/warden-dev/warden/keyspace"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// Storage keys. Everything a hash range owns lives under the range prefix
// 'r' followed by the key's 8-byte big-endian hash, so a split can scan,
// copy and delete one contiguous key span per range:
//
//	'm'                                   ShardMeta
//	'a'                                   applied Raft index (8 bytes BE)
//	'r' hash 'l' resource                 LockRecord
//	'r' hash 'd' resource 0x00 request_id DedupRecord
//	'r' hash 'w' resource 0x00 seq        WaiterRecord (seq: 8 bytes BE)
//
// Two secondary indexes serve the leader's timers. They are derived from
// the range records (written in the same batch) and can be rebuilt from
// them, so a range copy rebuilds rather than copies them:
//
//	'e' expires_at resource               held lock → its lease id
//	'f' ended_at 'l' resource             ended lock record
//	'f' ended_at 'd' resource 0x00 req    ended dedup record
//	'x' deadline resource 0x00 seq        queued waiter
//	'n' tenant                            the tenant's queued waiters (4 bytes BE)
//	'h' resource 0x00 lease_id            released lease → its request_id
//
// 'h' holds the dedup records that a Release ended (DedupRecord.released,
// envelope version 10 on) by their lease id, so a repeated Release finds
// its outcome: the lease id is all a Release carries.
//
// Times are int64 nanoseconds encoded with the sign bit flipped, so byte
// order is time order. Resources and request ids never contain 0x00 (no
// control characters), which makes the separator unambiguous.
const (
	prefixMeta    = 'm'
	prefixApplied = 'a'
	prefixRange   = 'r'
	prefixExpiry  = 'e'
	prefixEnded   = 'f'
	prefixWaitIdx = 'x'
	prefixTenant  = 'n'
	prefixRelease = 'h'
	kindLock      = 'l'
	kindDedup     = 'd'
	kindWaiter    = 'w'
)

var (
	keyMeta    = []byte{prefixMeta}
	keyApplied = []byte{prefixApplied}
)

func appendTime(b []byte, t int64) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(t)^(1<<63))
}

func decodeTime(b []byte) int64 { return int64(binary.BigEndian.Uint64(b) ^ (1 << 63)) }

func lockKey(resource string) []byte {
	b := make([]byte, 0, 10+len(resource))
	b = append(b, prefixRange)
	b = binary.BigEndian.AppendUint64(b, keyspace.Hash(resource))
	b = append(b, kindLock)
	return append(b, resource...)
}

func dedupKey(resource, requestID string) []byte {
	b := make([]byte, 0, 11+len(resource)+len(requestID))
	b = append(b, prefixRange)
	b = binary.BigEndian.AppendUint64(b, keyspace.Hash(resource))
	b = append(b, kindDedup)
	b = append(b, resource...)
	b = append(b, 0)
	return append(b, requestID...)
}

// waiterPrefix is the key prefix of a resource's queue; waiters sort by seq.
func waiterPrefix(resource string) []byte {
	b := make([]byte, 0, 19+len(resource))
	b = append(b, prefixRange)
	b = binary.BigEndian.AppendUint64(b, keyspace.Hash(resource))
	b = append(b, kindWaiter)
	b = append(b, resource...)
	return append(b, 0)
}

func waiterKey(resource string, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(waiterPrefix(resource), seq)
}

func waitIdxKey(deadline int64, resource string, seq uint64) []byte {
	b := make([]byte, 0, 18+len(resource))
	b = append(b, prefixWaitIdx)
	b = appendTime(b, deadline)
	b = append(b, resource...)
	b = append(b, 0)
	return binary.BigEndian.AppendUint64(b, seq)
}

func tenantKey(tenant string) []byte {
	return append([]byte{prefixTenant}, tenant...)
}

func expiryKey(expiresAt int64, resource string) []byte {
	b := make([]byte, 0, 9+len(resource))
	b = append(b, prefixExpiry)
	b = appendTime(b, expiresAt)
	return append(b, resource...)
}

func endedLockKey(endedAt int64, resource string) []byte {
	b := make([]byte, 0, 10+len(resource))
	b = append(b, prefixEnded)
	b = appendTime(b, endedAt)
	b = append(b, kindLock)
	return append(b, resource...)
}

func endedDedupKey(endedAt int64, resource, requestID string) []byte {
	b := make([]byte, 0, 11+len(resource)+len(requestID))
	b = append(b, prefixEnded)
	b = appendTime(b, endedAt)
	b = append(b, kindDedup)
	b = append(b, resource...)
	b = append(b, 0)
	return append(b, requestID...)
}

// releasedKey is the index key of a released lease: its request_id's
// dedup record is at dedupKey(resource, the value).
func releasedKey(resource string, leaseID []byte) []byte {
	b := make([]byte, 0, 2+len(resource)+len(leaseID))
	b = append(b, prefixRelease)
	b = append(b, resource...)
	b = append(b, 0)
	return append(b, leaseID...)
}

// timeBound is the first index key after every entry at or before t.
func timeBound(prefix byte, t int64) []byte {
	return appendTime([]byte{prefix}, t+1)
}

// Quota storage keys. A quota tree lives under its pool's hash (its
// key's first segment), so it moves as one with its range:
//
//	'r' hash(pool) 'q' key                       QuotaRecord
//	'r' hash(pool) 'v' key 0x00 reservation_id   ReservationRecord
//	'r' hash(pool) 'p' pool                      PoolRecord (ledger sequence)
//	'r' hash(pool) 'g' pool 0x00 seq             LedgerEvent (seq: 8 bytes BE)
//	'r' hash(pool) 'u' key 0x00 report_id        UsageReport
//	'r' hash(pool) 'k' key                       LedgerCheckpoint
//
// and two derived indexes of open reservations, by expiry:
//
//	'o' pool 0x00 expires_at key 0x00 id         → amount (8 bytes BE): per pool
//	'y' expires_at key 0x00 id                   for the leader's reclaimer
//	'l' at pool 0x00 seq                         ledger events by age, for retention
//	'i' pool 0x00 id 0x00 key                    reservations by id, per pool
//
// 'i' makes a reservation_id findable in its pool whatever the key
// (DESIGN.md §3: ids are unique per pool, envelope version 10 on). It is
// written with every reservation, and a database opened whose marker
// keyPoolIDsBuilt does not hold its applied index (one that a binary
// older than the index wrote to, one loaded from a snapshot stream, which
// never carries the marker, or one not closed cleanly) has it rebuilt
// from the reservation records first (buildPoolIDs), so it is complete on
// every replica that applies version 10.
//
// and ended reservations join the ended index, for forgetting:
//
//	'f' ended_at 'v' key 0x00 id
const (
	kindQuota       = 'q'
	kindReservation = 'v'
	kindPool        = 'p'
	kindLedger      = 'g'
	kindReport      = 'u'
	kindCheckpoint  = 'k'
	prefixLedgerAge = 'l'
	prefixPoolExp   = 'o'
	prefixReclaim   = 'y'
	prefixPoolID    = 'i'
)

// keyPoolIDsBuilt holds the applied index (8 bytes BE) at which the
// database's pool index of reservation ids ('i') was complete.
// Snapshot streams leave it out (writeStream).
var keyPoolIDsBuilt = []byte{'j'}

func quotaPrefix(pool string, kind byte) []byte {
	b := make([]byte, 0, 10+len(pool))
	b = append(b, prefixRange)
	b = binary.BigEndian.AppendUint64(b, keyspace.Hash(pool))
	return append(b, kind)
}

func quotaKey(key string) []byte { return append(quotaPrefix(keyspace.Pool(key), kindQuota), key...) }

func reservationKey(key, id string) []byte {
	b := append(quotaPrefix(keyspace.Pool(key), kindReservation), key...)
	return append(append(b, 0), id...)
}

// poolIDPrefix is the prefix of the pool index entries of reservation
// id in pool, one per key that holds a reservation with that id (before
// version 10, two keys of a pool could).
func poolIDPrefix(pool, id string) []byte {
	b := make([]byte, 0, 3+len(pool)+len(id))
	b = append(b, prefixPoolID)
	b = append(b, pool...)
	b = append(b, 0)
	b = append(b, id...)
	return append(b, 0)
}

func poolIDKey(key, id string) []byte { return append(poolIDPrefix(keyspace.Pool(key), id), key...) }

func poolKey(pool string) []byte { return append(quotaPrefix(pool, kindPool), pool...) }

func ledgerPrefix(pool string) []byte {
	return append(append(quotaPrefix(pool, kindLedger), pool...), 0)
}

func ledgerKey(pool string, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(ledgerPrefix(pool), seq)
}

func reportKey(key, reportID string) []byte {
	b := append(quotaPrefix(keyspace.Pool(key), kindReport), key...)
	return append(append(b, 0), reportID...)
}

func poolExpPrefix(pool string) []byte { return append(append([]byte{prefixPoolExp}, pool...), 0) }

func poolExpKey(r *shardv1.ReservationRecord) []byte {
	b := appendTime(poolExpPrefix(keyspace.Pool(r.GetKey())), r.GetExpiresAtUnixNano())
	b = append(append(b, r.GetKey()...), 0)
	return append(b, r.GetReservationId()...)
}

func reclaimKey(r *shardv1.ReservationRecord) []byte {
	b := appendTime([]byte{prefixReclaim}, r.GetExpiresAtUnixNano())
	b = append(append(b, r.GetKey()...), 0)
	return append(b, r.GetReservationId()...)
}

func endedReservationKey(r *shardv1.ReservationRecord) []byte {
	b := appendTime([]byte{prefixEnded}, r.GetEndedAtUnixNano())
	b = append(b, kindReservation)
	b = append(append(b, r.GetKey()...), 0)
	return append(b, r.GetReservationId()...)
}

func checkpointKey(key string) []byte {
	return append(quotaPrefix(keyspace.Pool(key), kindCheckpoint), key...)
}

func ledgerAgeKey(e *shardv1.LedgerEvent) []byte {
	b := appendTime([]byte{prefixLedgerAge}, e.GetAtUnixNano())
	b = append(append(b, keyspace.Pool(e.GetKey())...), 0)
	return binary.BigEndian.AppendUint64(b, e.GetSeq())
}
