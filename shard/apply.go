package shard

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/keyspace"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// The envelope versions, oldest first, with what each added or changed:
// the one table that both VersionOf (the version a command needs) and
// Apply (the rule an entry of a version gets) read. Apply keeps every
// older version's rule for entries of that version, so replicas of old
// and new binaries decide every entry alike. The router proposes
// max(VersionOf, the newest version every replica's node reports), so a
// rolling upgrade never stops a replica and a new rule starts only once
// every replica applies it.
const (
	// VersionRenewBatch adds RenewBatchCmd.
	VersionRenewBatch = 2
	// VersionBatch adds BatchCmd.
	VersionBatch = 3
	// VersionMaxMinShare changes what Reserve decides: a fair share is
	// max-min (waterShares) instead of weight / Σ weights × limit.
	VersionMaxMinShare = 4
	// VersionObservedSeq adds ReportUsageCmd.observed_seq (a
	// reconciliation against what was observed), which an older binary
	// would ignore: a command carrying it needs this version.
	VersionObservedSeq = 5
	// VersionNewEpoch adds NewEpochCmd.
	VersionNewEpoch = 6
	// VersionSkewRaiseOnly changes what SetConfig decides: it refuses a
	// lower max_clock_skew. A lower bound would apply at once to shard
	// time that leaders stamped under the higher one (time only moves
	// forward: max(env.now, last)), which may lead real time by up to
	// half of it, so leases would become grantable early in real time.
	VersionSkewRaiseOnly = 7
	// VersionPrincipal adds AcquireCmd.principal: the dedup record keeps
	// the principal of the Acquire that made it, and a replay of its
	// request_id by another principal is refused (CODE_PERMISSION_DENIED).
	// An older binary would ignore the field and hand the lease to the
	// replay: a command carrying it needs this version, and the router
	// drops it (StripPrincipals) while some replica applies less.
	VersionPrincipal = 8
	// VersionRevoke adds RevokeCmd (AdminService.RevokeLease).
	VersionRevoke = 9
	// VersionReleaseReplay changes what Release and Reserve decide. A
	// lease that a Release ends is remembered as released in its
	// request's dedup record (DedupRecord.released), for as long as the
	// record is kept, and a repeat of that Release (a router's retry
	// after its first attempt committed unseen) answers released=true,
	// the original outcome; before, it found the lease gone and answered
	// false. And a Reserve whose reservation_id another key of the same
	// pool holds is refused (invalid_argument, as a retry with other
	// parameters is): ids are unique per pool, not per key.
	VersionReleaseReplay = 10
	// VersionRestoredPools changes what Reserve and a correcting
	// ReportUsage decide for a pool that a restore froze
	// (PoolRecord.restored: Reserve is refused until the pool's root is
	// corrected or unfrozen) and adds UnfreezePoolCmd.
	VersionRestoredPools = 11
)

// CommandVersion is the newest envelope version this binary applies.
const CommandVersion = VersionRestoredPools

// MaxRenewBatch is the most renewals one RenewBatchCmd (and one RenewBatch
// RPC) carries.
const MaxRenewBatch = 1000

// MaxBatch is the most items one BatchCmd (and ops one LockService.Batch
// RPC) carries.
const MaxBatch = 1000

// VersionOf is the envelope version env's command needs: the oldest
// binary that applies it.
func VersionOf(env *shardv1.Envelope) uint32 {
	switch {
	case env.GetUnfreezePool() != nil:
		return VersionRestoredPools
	case env.GetRevoke() != nil:
		return VersionRevoke
	case hasPrincipal(env):
		return VersionPrincipal
	case env.GetNewEpoch() != nil:
		return VersionNewEpoch
	case env.GetReportUsage() != nil && env.GetReportUsage().ObservedSeq != nil:
		return VersionObservedSeq
	case env.GetBatch() != nil:
		return VersionBatch
	case env.GetRenewBatch() != nil:
		return VersionRenewBatch
	}
	return 1
}

// hasPrincipal reports whether an Acquire of env (alone or in a batch)
// carries a principal.
func hasPrincipal(env *shardv1.Envelope) bool {
	if env.GetAcquire().GetPrincipal() != "" {
		return true
	}
	for _, it := range env.GetBatch().GetItems() {
		if it.GetAcquire().GetPrincipal() != "" {
			return true
		}
	}
	return false
}

// StripPrincipals returns env without the principals of its Acquires (a
// copy when it had any): what the router proposes while some replica of
// the shard applies a version before VersionPrincipal, which decides a
// replay by the old rule (any caller that knows the request gets its
// lease back).
func StripPrincipals(env *shardv1.Envelope) *shardv1.Envelope {
	if !hasPrincipal(env) {
		return env
	}
	out := proto.CloneOf(env)
	out.GetAcquire().Principal = ""
	for _, it := range out.GetBatch().GetItems() {
		if a := it.GetAcquire(); a != nil {
			a.Principal = ""
		}
	}
	return out
}

// InRange reports whether hash h falls in the descriptor's [start, end)
// (keyspace.Contains on a range descriptor).
func InRange(d *shardv1.RangeDescriptor, h uint64) bool {
	return keyspace.Contains(d.GetStart(), d.GetEnd(), h)
}

// Reader is the state that Apply reads: the shard meta and the range
// records, as of the commands applied before this one.
type Reader interface {
	// Meta returns the shard meta; it is never nil.
	Meta() (*shardv1.ShardMeta, error)
	// Lock returns the resource's lock record, or nil.
	Lock(resource string) (*shardv1.LockRecord, error)
	// Dedup returns the dedup record of an Acquire request_id, or nil.
	Dedup(resource, requestID string) (*shardv1.DedupRecord, error)
	// ReleasedLease returns the dedup record of the request whose lease
	// leaseID of resource ended by a Release (DedupRecord.released), or
	// nil.
	ReleasedLease(resource string, leaseID []byte) (*shardv1.DedupRecord, error)
	// Waiter returns the resource's waiter with sequence number seq, or nil.
	Waiter(resource string, seq uint64) (*shardv1.WaiterRecord, error)
	// NextWaiter returns the resource's first waiter with seq ≥ from, or nil.
	NextWaiter(resource string, from uint64) (*shardv1.WaiterRecord, error)
	// TenantWaiters returns how many waiters the tenant has queued.
	TenantWaiters(tenant string) (uint32, error)
	// Quota returns the quota level key, or nil.
	Quota(key string) (*shardv1.QuotaRecord, error)
	// QuotaChildren returns the levels directly under parent.
	QuotaChildren(parent string) ([]*shardv1.QuotaRecord, error)
	// Reservation returns a reservation, or nil.
	Reservation(key, id string) (*shardv1.ReservationRecord, error)
	// ReservationKeys returns the keys of pool that hold a reservation
	// with id, in key order.
	ReservationKeys(pool, id string) ([]string, error)
	// PoolRecord returns the pool's ledger record, or nil.
	PoolRecord(pool string) (*shardv1.PoolRecord, error)
	// Report returns a recorded usage report, or nil.
	Report(key, reportID string) (*shardv1.UsageReport, error)
	// Checkpoint returns the ledger checkpoint of key, or nil.
	Checkpoint(key string) (*shardv1.LedgerCheckpoint, error)
	// LedgerFrom returns up to limit events of pool from seq on, in order.
	LedgerFrom(pool string, seq uint64, limit int) ([]*shardv1.LedgerEvent, error)
	// Expired returns the pool's open reservations whose expiry is at or
	// before now (key and amount set only), oldest first.
	Expired(pool string, now int64) ([]*shardv1.ReservationRecord, error)
	// NextExpiry returns the earliest expiry after now of an open
	// reservation at or under key, or 0.
	NextExpiry(key string, now int64) (int64, error)
	// Records returns up to limit (0: all) range records with hashes in
	// [start, end) (end 0: 2^64) after storage key after (nil: from the
	// start), in key order, and the key to resume after (nil at the end).
	Records(start, end uint64, after []byte, limit int) (*shardv1.RangeRecords, []byte, error)
}

// Apply decides one command against the state r and returns its result
// and the changes to write, in order. It is pure: it reads no clock, draws
// no random numbers and writes nothing; time comes from the envelope. A
// refused command is a Result with a non-OK code; it changes nothing but
// the shard's time, except that a refused Acquire may first end an expired
// lease and hand the lock to the head waiter, as any command touching the
// lock would. The error is only ever a read error of r or
// ErrUnsupportedVersion.
func Apply(r Reader, env *shardv1.Envelope) (*shardv1.Result, []Change, error) {
	if env.GetVersion() > CommandVersion {
		return nil, nil, fmt.Errorf("%w: %d (this binary applies up to %d)", ErrUnsupportedVersion, env.GetVersion(), CommandVersion)
	}
	meta, err := r.Meta()
	if err != nil {
		return nil, nil, err
	}
	a := newApplier(r, meta, env.GetVersion())
	if env.GetVersion() == 0 {
		return invalid("version", "is required"), nil, nil
	}

	if env.GetShardId() != meta.GetRange().GetShardId() {
		return wrongShard(meta, "command is for shard %d", env.GetShardId()), nil, nil
	}
	if env.GetGeneration() < meta.GetRange().GetGeneration() {
		return wrongShard(meta, "placement generation %d is stale", env.GetGeneration()), nil, nil
	}
	// Time never runs backwards inside the state machine (DESIGN.md "Time").
	a.now = max(env.GetNowUnixNano(), meta.GetLastNowUnixNano())
	if a.now != meta.GetLastNowUnixNano() {
		a.dirtyMeta()
		a.meta.LastNowUnixNano = a.now
	}
	var res *shardv1.Result
	switch c := env.GetCommand().(type) {
	case *shardv1.Envelope_Acquire:
		res, err = a.acquire(c.Acquire)
	case *shardv1.Envelope_Renew:
		res, err = a.renew(c.Renew)
	case *shardv1.Envelope_RenewBatch:
		if env.GetVersion() < VersionRenewBatch {
			// Version 1 binaries find this command unknown; so does this
			// one in a version 1 envelope, or replicas would diverge.
			res = invalid("command", "is missing or unknown (renew_batch needs envelope version 2)")
			break
		}
		res, err = a.renewBatch(c.RenewBatch)
	case *shardv1.Envelope_Batch:
		if env.GetVersion() < VersionBatch {
			res = invalid("command", "is missing or unknown (batch needs envelope version 3)")
			break
		}
		res, err = a.batch(c.Batch)
	case *shardv1.Envelope_Release:
		res, err = a.release(c.Release)
	case *shardv1.Envelope_Expire:
		res, err = a.expire(c.Expire)
	case *shardv1.Envelope_Forget:
		res, err = a.forget(c.Forget)
	case *shardv1.Envelope_SetConfig:
		res = a.setConfig(c.SetConfig)
	case *shardv1.Envelope_CancelWait:
		res, err = a.cancelWait(c.CancelWait)
	case *shardv1.Envelope_DropWaiters:
		res, err = a.dropWaiters(c.DropWaiters)
	case *shardv1.Envelope_FenceRange:
		res = a.fenceRange(c.FenceRange)
	case *shardv1.Envelope_UnfenceRange:
		res = a.unfenceRange(c.UnfenceRange)
	case *shardv1.Envelope_ImportRange:
		res, err = a.importRange(c.ImportRange)
	case *shardv1.Envelope_ActivateRange:
		res = a.activateRange(c.ActivateRange)
	case *shardv1.Envelope_ReleaseRange:
		res, err = a.releaseRange(c.ReleaseRange)
	case *shardv1.Envelope_SetLimit:
		res, err = a.setLimit(c.SetLimit)
	case *shardv1.Envelope_Reserve:
		res, err = a.reserve(c.Reserve)
	case *shardv1.Envelope_Commit:
		res, err = a.commit(c.Commit)
	case *shardv1.Envelope_ReleaseReservation:
		res, err = a.releaseReservation(c.ReleaseReservation)
	case *shardv1.Envelope_Reclaim:
		res, err = a.reclaim(c.Reclaim)
	case *shardv1.Envelope_ReportUsage:
		res, err = a.reportUsage(c.ReportUsage)
	case *shardv1.Envelope_CompactLedger:
		res, err = a.compactLedger(c.CompactLedger)
	case *shardv1.Envelope_NewEpoch:
		if env.GetVersion() < VersionNewEpoch {
			res = invalid("command", "is missing or unknown (new_epoch needs envelope version 6)")
			break
		}
		res = a.newEpoch(c.NewEpoch)
	case *shardv1.Envelope_Revoke:
		if env.GetVersion() < VersionRevoke {
			res = invalid("command", "is missing or unknown (revoke needs envelope version 9)")
			break
		}
		res, err = a.revoke(c.Revoke)
	case *shardv1.Envelope_UnfreezePool:
		if env.GetVersion() < VersionRestoredPools {
			res = invalid("command", "is missing or unknown (unfreeze_pool needs envelope version 11)")
			break
		}
		res, err = a.unfreezePool(c.UnfreezePool)
	default:
		res = invalid("command", "is missing or unknown")
	}
	if err != nil {
		return nil, nil, err
	}
	res.Granted, res.Dropped = a.granted, a.dropped
	return res, a.allChanges(), nil
}

func newApplier(r Reader, meta *shardv1.ShardMeta, version uint32) *applier {
	return &applier{r: r, meta: meta, version: version,
		locks: map[string]*shardv1.LockRecord{}, dedups: map[dedupKeyT]*shardv1.DedupRecord{},
		gone: map[waiterKeyT]bool{}, tenants: map[string]uint32{},
		quotas: map[string]*shardv1.QuotaRecord{}, pools: map[string]*shardv1.PoolRecord{},
		reservations: map[string]*shardv1.ReservationRecord{}, released: map[string]bool{}}
}

// allChanges is what the command decided to write, in order, its meta
// first when it changed.
func (a *applier) allChanges() []Change {
	if a.metaDirty {
		return append([]Change{putMeta{meta: a.meta}}, a.changes...)
	}
	return a.changes
}

type dedupKeyT struct{ resource, requestID string }

type waiterKeyT struct {
	resource string
	seq      uint64
}

// applier decides one command. Its maps overlay the Reader with this
// command's own writes, so that a command touching a record twice (end a
// lease, then grant the next waiter) reads what it wrote.
type applier struct {
	r    Reader
	meta *shardv1.ShardMeta
	// version is the envelope's: rules that changed are chosen by it.
	version   uint32
	metaDirty bool
	now       int64
	changes   []Change
	granted   []*shardv1.WaiterEvent
	dropped   []*shardv1.WaiterEvent

	locks   map[string]*shardv1.LockRecord // nil value: deleted
	dedups  map[dedupKeyT]*shardv1.DedupRecord
	gone    map[waiterKeyT]bool // waiters removed by this command
	tenants map[string]uint32
	quotas  map[string]*shardv1.QuotaRecord // levels this command wrote
	pools   map[string]*shardv1.PoolRecord
	// reservations this command wrote, by key NUL id
	reservations map[string]*shardv1.ReservationRecord
	// released are the leases this command's Releases ended, by
	// resource NUL lease id: what ReleasedLease will find once written.
	released map[string]bool
}

func (a *applier) cfg() *shardv1.ShardConfig { return a.meta.GetConfig() }

func (a *applier) put(c Change) { a.changes = append(a.changes, c) }

func (a *applier) lock(resource string) (*shardv1.LockRecord, error) {
	if l, ok := a.locks[resource]; ok {
		return l, nil
	}
	return a.r.Lock(resource)
}

func (a *applier) setLock(l *shardv1.LockRecord) {
	a.locks[l.GetResource()] = l
	a.put(putLock{lock: l})
}

func (a *applier) deleteLock(resource string) {
	a.locks[resource] = nil
	a.put(deleteLock{resource: resource})
}

func (a *applier) dedup(resource, requestID string) (*shardv1.DedupRecord, error) {
	if d, ok := a.dedups[dedupKeyT{resource, requestID}]; ok {
		return d, nil
	}
	return a.r.Dedup(resource, requestID)
}

func (a *applier) setDedup(d *shardv1.DedupRecord) {
	a.dedups[dedupKeyT{d.GetResource(), d.GetRequestId()}] = d
	a.put(putDedup{dedup: d})
}

func (a *applier) deleteDedup(resource, requestID string) {
	a.dedups[dedupKeyT{resource, requestID}] = nil
	a.put(deleteDedup{resource: resource, requestID: requestID})
}

func (a *applier) waiter(resource string, seq uint64) (*shardv1.WaiterRecord, error) {
	if a.gone[waiterKeyT{resource, seq}] {
		return nil, nil
	}
	return a.r.Waiter(resource, seq)
}

// nextWaiter returns the resource's first queued waiter with seq ≥ from.
func (a *applier) nextWaiter(resource string, from uint64) (*shardv1.WaiterRecord, error) {
	for {
		w, err := a.r.NextWaiter(resource, from)
		if w == nil || err != nil || !a.gone[waiterKeyT{resource, w.GetSeq()}] {
			return w, err
		}
		from = w.GetSeq() + 1
	}
}

func (a *applier) tenantWaiters(tenant string) (uint32, error) {
	if n, ok := a.tenants[tenant]; ok {
		return n, nil
	}
	return a.r.TenantWaiters(tenant)
}

func (a *applier) addTenantWaiters(tenant string, delta int) error {
	n, err := a.tenantWaiters(tenant)
	if err != nil {
		return err
	}
	n = uint32(int(n) + delta)
	a.tenants[tenant] = n
	a.put(putTenantWaiters{tenant: tenant, count: n})
	return nil
}

// checkKey refuses a resource that is malformed, outside the shard's
// range, or fenced by a move.
func (a *applier) checkKey(resource string) *shardv1.Result {
	if err := CheckName("resource", resource, MaxResourceBytes); err != nil {
		return invalidErr(err)
	}
	return serves(a.meta, keyspace.Hash(resource))
}

// dirtyMeta makes a.meta this command's own copy, to be written.
func (a *applier) dirtyMeta() {
	if !a.metaDirty {
		a.meta = cloneMeta(a.meta)
		a.metaDirty = true
	}
}

func invalid(field, reason string) *shardv1.Result {
	return &shardv1.Result{Code: shardv1.Code_CODE_INVALID_ARGUMENT, Field: field, Reason: reason}
}

func invalidErr(err error) *shardv1.Result {
	if fe, ok := err.(*FieldError); ok {
		return invalid(fe.Field, fe.Reason)
	}
	return invalid("", err.Error())
}

func wrongShard(meta *shardv1.ShardMeta, format string, args ...any) *shardv1.Result {
	return &shardv1.Result{Code: shardv1.Code_CODE_WRONG_SHARD, Reason: fmt.Sprintf(format, args...), Range: meta.GetRange()}
}
