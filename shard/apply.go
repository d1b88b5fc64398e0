package shard

import (
	"bytes"
	"fmt"
	"time"

	"github.com/warden-dev/warden/keyspace"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// CommandVersion is the newest envelope version this binary applies.
// Version 2 added RenewBatchCmd and version 3 BatchCmd. Version 4 changes
// what Apply decides for an existing command: a Reserve's fair share is
// max-min (water-filling) instead of weight / Σ weights × limit. Apply
// keeps every older version's rule for entries of that version, so
// replicas of old and new binaries decide every entry alike. VersionOf is
// the oldest version a command can travel in; the router proposes
// max(VersionOf, the newest version every replica's node reports), so a
// rolling upgrade never stops a replica and the new rules start only
// once every replica applies them. Version 5 adds ReportUsageCmd's
// observed_seq (a reconciliation against what was observed), which an
// older binary would ignore: a command carrying it needs version 5.
// Version 6 adds NewEpochCmd. Version 7 changes what SetConfig decides:
// it refuses to lower max_clock_skew (VersionSkewRaiseOnly).
const CommandVersion = 7

// VersionNewEpoch is the first envelope version with NewEpochCmd.
const VersionNewEpoch = 6

// VersionSkewRaiseOnly is the first envelope version whose SetConfig
// refuses a lower max_clock_skew. A lower bound would apply at once to
// shard time that leaders stamped under the higher one (time only moves
// forward: max(env.now, last)), which may lead real time by up to half
// of it, so leases would become grantable early in real time.
const VersionSkewRaiseOnly = 7

// VersionObservedSeq is the first envelope version whose ReportUsage
// reads observed_seq.
const VersionObservedSeq = 5

// VersionMaxMinShare is the first envelope version whose Reserve uses
// max-min fair shares (waterShares).
const VersionMaxMinShare = 4

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
	case env.GetNewEpoch() != nil:
		return VersionNewEpoch
	case env.GetReportUsage() != nil && env.GetReportUsage().ObservedSeq != nil:
		return VersionObservedSeq
	case env.GetBatch() != nil:
		return 3
	case env.GetRenewBatch() != nil:
		return 2
	}
	return 1
}

// DefaultConfig is the shard config a new shard starts with.
func DefaultConfig() *shardv1.ShardConfig {
	return &shardv1.ShardConfig{
		MaxClockSkewNanos:          int64(500 * time.Millisecond),
		MinLeaseTtlNanos:           int64(time.Second),
		MaxLeaseTtlNanos:           int64(10 * time.Minute),
		DefaultLeaseTtlNanos:       int64(30 * time.Second),
		DefaultReservationTtlNanos: int64(5 * time.Minute),
		MaxReservationTtlNanos:     int64(time.Hour),
		FairnessThresholdPercent:   80,
		LedgerRetentionNanos:       int64(7 * 24 * time.Hour),
		DedupWindowNanos:           int64(10 * time.Minute),
		MaxWaitTimeoutNanos:        int64(5 * time.Minute),
		MaxWaitersPerResource:      1_000,
		MaxWaitersPerTenant:        10_000,
	}
}

// maxClockSkewBound caps max_clock_skew: a larger bound would make a dead
// holder's lock wait longer than any sane lease.
const maxClockSkewBound = int64(time.Minute)

// maxDurationBound caps the config's lease TTL, wait and dedup durations
// (7 days), so that shard time plus any of them stays far from int64
// overflow (year 2262) and a lease can never expire "before" it began.
const maxDurationBound = int64(7 * 24 * time.Hour)

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

// ChangeKind says what a Change does.
type ChangeKind uint8

// The kinds of change Apply emits.
const (
	PutMeta ChangeKind = iota + 1
	PutLock
	DeleteLock
	PutDedup
	DeleteDedup
	PutWaiter
	DeleteWaiter
	PutTenantWaiters
	PutQuota
	DeleteQuota
	PutReservation
	DeleteReservation
	PutPool
	DeletePool
	PutLedger
	DeleteLedger
	PutReport
	DeleteReport
	PutCheckpoint
	DeleteCheckpoint
)

// Change is one write decided by Apply. Put kinds carry the new record;
// delete kinds carry the key (Resource, and RequestID for dedup or Seq for
// waiters); PutTenantWaiters carries Tenant and Count.
type Change struct {
	Kind      ChangeKind
	Meta      *shardv1.ShardMeta
	Lock      *shardv1.LockRecord
	Dedup     *shardv1.DedupRecord
	Waiter    *shardv1.WaiterRecord
	Resource  string
	RequestID string
	Seq       uint64
	Tenant    string
	Count     uint32
	// Quota changes: the put kinds carry their record; the delete kinds
	// the key (Key, and ID for a reservation or report, Pool and Seq for
	// a ledger event, Pool for a pool record).
	Quota       *shardv1.QuotaRecord
	Reservation *shardv1.ReservationRecord
	PoolRecord  *shardv1.PoolRecord
	Ledger      *shardv1.LedgerEvent
	Report      *shardv1.UsageReport
	Checkpoint  *shardv1.LedgerCheckpoint
	Key, ID     string
	Pool        string
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
	a := &applier{r: r, meta: meta, version: env.GetVersion(),
		locks: map[string]*shardv1.LockRecord{}, dedups: map[dedupKeyT]*shardv1.DedupRecord{},
		gone: map[waiterKeyT]bool{}, tenants: map[string]uint32{},
		quotas: map[string]*shardv1.QuotaRecord{}, pools: map[string]*shardv1.PoolRecord{},
		reservations: map[string]*shardv1.ReservationRecord{}}
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
		if env.GetVersion() < 2 {
			// Version 1 binaries find this command unknown; so does this
			// one in a version 1 envelope, or replicas would diverge.
			res = invalid("command", "is missing or unknown (renew_batch needs envelope version 2)")
			break
		}
		res, err = a.renewBatch(c.RenewBatch)
	case *shardv1.Envelope_Batch:
		if env.GetVersion() < 3 {
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
	default:
		res = invalid("command", "is missing or unknown")
	}
	if err != nil {
		return nil, nil, err
	}
	res.Granted, res.Dropped = a.granted, a.dropped
	if a.metaDirty {
		a.changes = append([]Change{{Kind: PutMeta, Meta: a.meta}}, a.changes...)
	}
	return res, a.changes, nil
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
	a.put(Change{Kind: PutLock, Lock: l})
}

func (a *applier) deleteLock(resource string) {
	a.locks[resource] = nil
	a.put(Change{Kind: DeleteLock, Resource: resource})
}

func (a *applier) dedup(resource, requestID string) (*shardv1.DedupRecord, error) {
	if d, ok := a.dedups[dedupKeyT{resource, requestID}]; ok {
		return d, nil
	}
	return a.r.Dedup(resource, requestID)
}

func (a *applier) setDedup(d *shardv1.DedupRecord) {
	a.dedups[dedupKeyT{d.GetResource(), d.GetRequestId()}] = d
	a.put(Change{Kind: PutDedup, Dedup: d})
}

func (a *applier) deleteDedup(resource, requestID string) {
	a.dedups[dedupKeyT{resource, requestID}] = nil
	a.put(Change{Kind: DeleteDedup, Resource: resource, RequestID: requestID})
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
	a.put(Change{Kind: PutTenantWaiters, Tenant: tenant, Count: n})
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

// Holds reports whether lock l keeps everyone else out at shard time now
// (Unix ns) under config c: it is held and its lease's expiry plus
// max_clock_skew has not passed (DESIGN.md §1 rule 6). A nil record holds
// nothing. Describe answers held with it; a grant needs it false.
func Holds(l *shardv1.LockRecord, c *shardv1.ShardConfig, now int64) bool {
	return l.GetHeld() && now < l.GetExpiresAtUnixNano()+c.GetMaxClockSkewNanos()
}

// grantable reports whether the lock may be granted to a new lease now.
func (a *applier) grantable(l *shardv1.LockRecord) bool { return !Holds(l, a.cfg(), a.now) }

// current reports whether lease is the lock's current, unexpired lease.
func (a *applier) current(l *shardv1.LockRecord, leaseID []byte) bool {
	return l != nil && l.GetHeld() && bytes.Equal(l.GetLeaseId(), leaseID) && a.now < l.GetExpiresAtUnixNano()
}

func (a *applier) acquire(c *shardv1.AcquireCmd) (*shardv1.Result, error) {
	if res := a.checkKey(c.GetResource()); res != nil {
		return res, nil
	}
	if err := CheckName("request_id", c.GetRequestId(), MaxRequestIDBytes); err != nil {
		return invalidErr(err), nil
	}
	if err := CheckText("holder", c.GetHolder(), MaxHolderBytes); err != nil {
		return invalidErr(err), nil
	}
	if err := CheckText("tenant", c.GetTenant(), MaxTenantBytes); err != nil {
		return invalidErr(err), nil
	}
	if len(c.GetLeaseId()) != LeaseIDBytes {
		return invalid("lease_id", fmt.Sprintf("must be %d bytes", LeaseIDBytes)), nil
	}
	ttl := c.GetLeaseTtlNanos()
	if ttl == 0 {
		ttl = a.cfg().GetDefaultLeaseTtlNanos()
	}
	if ttl < a.cfg().GetMinLeaseTtlNanos() || ttl > a.cfg().GetMaxLeaseTtlNanos() {
		return invalid("lease_ttl", fmt.Sprintf("%v is outside [%v, %v]",
			time.Duration(ttl), time.Duration(a.cfg().GetMinLeaseTtlNanos()), time.Duration(a.cfg().GetMaxLeaseTtlNanos()))), nil
	}
	if w := c.GetWaitTimeoutNanos(); w < 0 || w > a.cfg().GetMaxWaitTimeoutNanos() {
		return invalid("wait_timeout", fmt.Sprintf("%v is outside [0, %v]", time.Duration(w), time.Duration(a.cfg().GetMaxWaitTimeoutNanos()))), nil
	}
	lock, err := a.lock(c.GetResource())
	if err != nil {
		return nil, err
	}
	d, err := a.dedup(c.GetResource(), c.GetRequestId())
	if err != nil {
		return nil, err
	}
	if d != nil {
		// A retry (DESIGN.md §1 rules 5 and 8). wait_timeout is not a
		// parameter: a retry may carry the time it has left.
		if d.GetLeaseTtlNanos() != ttl || d.GetHolder() != c.GetHolder() {
			return invalid("request_id", "was used before with a different lease_ttl or holder"), nil
		}
		queued := d.GetWaiterSeq() != 0
		if !queued && !a.current(lock, d.GetLeaseId()) {
			return failed("the lease granted to this request_id has ended"), nil
		}
		// This attempt is now the request's latest: an earlier attempt's
		// cancel must no longer take its place or its grant away.
		if !bytes.Equal(d.GetAttemptId(), c.GetLeaseId()) {
			d = cloneDedup(d)
			d.AttemptId = c.GetLeaseId()
			a.setDedup(d)
		}
		if queued {
			return &shardv1.Result{Code: shardv1.Code_CODE_QUEUED, WaitDeadlineUnixNano: d.GetWaitDeadlineUnixNano(), WaiterSeq: d.GetWaiterSeq()}, nil
		}
		return &shardv1.Result{Code: shardv1.Code_CODE_OK, Replayed: true, Lease: leaseInfo(lock, true)}, nil
	}
	if lock != nil && lock.GetHeld() && a.grantable(lock) {
		// The previous lease is over but was not yet reaped: end it now, and
		// hand the lock to the queue before this newcomer.
		if lock, err = a.endLease(lock); err != nil {
			return nil, err
		}
		if lock, err = a.grantNext(lock); err != nil {
			return nil, err
		}
	}
	if lock != nil && lock.GetHeld() {
		if c.GetWaitTimeoutNanos() == 0 {
			return &shardv1.Result{Code: shardv1.Code_CODE_CONFLICT, Reason: "the lock is held", Lease: leaseInfo(lock, false)}, nil
		}
		return a.enqueue(lock, c, ttl)
	}
	l, refused := a.grant(lock, c.GetResource(), c.GetLeaseId(), c.GetRequestId(), c.GetHolder(), ttl)
	if refused != nil {
		return refused, nil
	}
	d = requestRecord(c.GetResource(), c.GetRequestId(), c.GetLeaseId(), ttl, c.GetHolder(), c.GetLeaseId())
	d.FencingToken = l.GetFencingToken()
	a.setDedup(d)
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Lease: leaseInfo(l, true)}, nil
}

// newEpoch moves an active shard to a fresh, larger epoch, its revision
// starting again at 0 (NewEpochCmd). The shard's current epoch again is a
// replay: resetting the revision within an epoch would repeat tokens.
func (a *applier) newEpoch(c *shardv1.NewEpochCmd) *shardv1.Result {
	switch {
	case a.meta.GetInactive():
		return failed("the shard is not active")
	case c.GetEpoch() == a.meta.GetEpoch():
		return &shardv1.Result{Code: shardv1.Code_CODE_OK, Replayed: true}
	case c.GetEpoch() < a.meta.GetEpoch() || c.GetEpoch() > MaxEpoch:
		return invalid("epoch", fmt.Sprintf("%d is not in (%d, %d]", c.GetEpoch(), a.meta.GetEpoch(), MaxEpoch))
	}
	a.dirtyMeta()
	a.meta.Epoch, a.meta.Revision = c.GetEpoch(), 0
	return &shardv1.Result{Code: shardv1.Code_CODE_OK}
}

// grant gives a free lock (or nil) to a new lease and writes it. It
// refuses when the revision space is exhausted or, as an invariant check
// of rule 2, when the new token would not exceed the lock's last one.
func (a *applier) grant(free *shardv1.LockRecord, resource string, leaseID []byte, requestID, holder string, ttl int64) (*shardv1.LockRecord, *shardv1.Result) {
	if a.meta.GetRevision() >= MaxRevision {
		return nil, &shardv1.Result{Code: shardv1.Code_CODE_UNAVAILABLE, Reason: "the shard's revision space is exhausted; it needs a new epoch"}
	}
	token := Token(a.meta.GetEpoch(), a.meta.GetRevision()+1)
	if free != nil && token <= free.GetFencingToken() {
		return nil, &shardv1.Result{Code: shardv1.Code_CODE_INTERNAL,
			Reason: fmt.Sprintf("fencing token %d would not exceed the last token %d", token, free.GetFencingToken())}
	}
	a.bumpRevision()
	a.meta.HeldLocks++
	l := &shardv1.LockRecord{
		Resource:          resource,
		Held:              true,
		LeaseId:           leaseID,
		RequestId:         requestID,
		Holder:            holder,
		FencingToken:      token,
		LeaseTtlNanos:     ttl,
		GrantedAtUnixNano: a.now,
		ExpiresAtUnixNano: a.now + ttl,
		Waiters:           free.GetWaiters(),
		LastWaiterSeq:     free.GetLastWaiterSeq(),
	}
	a.setLock(l)
	return l, nil
}

// enqueue adds an Acquire to the held lock's queue, within the bounds of
// the shard config.
func (a *applier) enqueue(lock *shardv1.LockRecord, c *shardv1.AcquireCmd, ttl int64) (*shardv1.Result, error) {
	if lock.GetWaiters() >= a.cfg().GetMaxWaitersPerResource() {
		return &shardv1.Result{Code: shardv1.Code_CODE_RESOURCE_EXHAUSTED, Field: "resource",
			Reason: fmt.Sprintf("the resource's wait queue is full (%d waiters)", lock.GetWaiters())}, nil
	}
	n, err := a.tenantWaiters(c.GetTenant())
	if err != nil {
		return nil, err
	}
	if n >= a.cfg().GetMaxWaitersPerTenant() {
		return &shardv1.Result{Code: shardv1.Code_CODE_RESOURCE_EXHAUSTED, Field: "tenant",
			Reason: fmt.Sprintf("the tenant has %d waiters queued, the most allowed", n)}, nil
	}
	a.dirtyMeta()
	a.meta.QueuedWaiters++
	l := cloneLock(lock)
	l.Waiters++
	l.LastWaiterSeq++
	deadline := a.now + c.GetWaitTimeoutNanos()
	a.setLock(l)
	a.put(Change{Kind: PutWaiter, Waiter: &shardv1.WaiterRecord{
		Resource:         c.GetResource(),
		RequestId:        c.GetRequestId(),
		Seq:              l.GetLastWaiterSeq(),
		LeaseId:          c.GetLeaseId(),
		LeaseTtlNanos:    ttl,
		Holder:           c.GetHolder(),
		Tenant:           c.GetTenant(),
		DeadlineUnixNano: deadline,
	}})
	d := requestRecord(c.GetResource(), c.GetRequestId(), c.GetLeaseId(), ttl, c.GetHolder(), c.GetLeaseId())
	d.WaiterSeq, d.WaitDeadlineUnixNano = l.GetLastWaiterSeq(), deadline
	a.setDedup(d)
	if err := a.addTenantWaiters(c.GetTenant(), 1); err != nil {
		return nil, err
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_QUEUED, WaitDeadlineUnixNano: deadline, Count: l.GetWaiters(), WaiterSeq: l.GetLastWaiterSeq()}, nil
}

// grantNext hands a free lock to the head of its queue, in this same
// command: waiters whose deadline has passed are dropped on the way. It
// writes and returns the lock's new record.
func (a *applier) grantNext(lock *shardv1.LockRecord) (*shardv1.LockRecord, error) {
	for from := uint64(0); lock.GetWaiters() > 0 && a.meta.GetRevision() < MaxRevision; {
		w, err := a.nextWaiter(lock.GetResource(), from)
		if err != nil {
			return nil, err
		}
		if w == nil {
			return nil, fmt.Errorf("%w: lock %q counts %d waiters but has none queued", ErrCorruptRecord, lock.GetResource(), lock.GetWaiters())
		}
		from = w.GetSeq() + 1
		queued, err := a.dedup(w.GetResource(), w.GetRequestId())
		if err != nil {
			return nil, err
		}
		if lock, err = a.removeWaiter(lock, w); err != nil {
			return nil, err
		}
		if a.now >= w.GetDeadlineUnixNano() {
			a.dropped = append(a.dropped, &shardv1.WaiterEvent{Resource: w.GetResource(), RequestId: w.GetRequestId(), Seq: w.GetSeq()})
			continue
		}
		l, refused := a.grant(lock, w.GetResource(), w.GetLeaseId(), w.GetRequestId(), w.GetHolder(), w.GetLeaseTtlNanos())
		if refused != nil {
			return nil, fmt.Errorf("shard: granting to waiter %q of %q: %s", w.GetRequestId(), w.GetResource(), refused.GetReason())
		}
		d := requestRecord(w.GetResource(), w.GetRequestId(), w.GetLeaseId(), w.GetLeaseTtlNanos(), w.GetHolder(), queued.GetAttemptId())
		d.FencingToken = l.GetFencingToken()
		a.setDedup(d)
		a.granted = append(a.granted, &shardv1.WaiterEvent{Resource: w.GetResource(), RequestId: w.GetRequestId(), Seq: w.GetSeq(), Lease: leaseInfo(l, true),
			AttemptId: queued.GetAttemptId()})
		return l, nil
	}
	return lock, nil
}

// removeWaiter takes w out of the queue: its record, its dedup entry (a
// grant writes a new one) and its count on the lock and the tenant.
func (a *applier) removeWaiter(lock *shardv1.LockRecord, w *shardv1.WaiterRecord) (*shardv1.LockRecord, error) {
	a.gone[waiterKeyT{w.GetResource(), w.GetSeq()}] = true
	a.put(Change{Kind: DeleteWaiter, Resource: w.GetResource(), Seq: w.GetSeq()})
	if err := a.addTenantWaiters(w.GetTenant(), -1); err != nil {
		return nil, err
	}
	a.deleteDedup(w.GetResource(), w.GetRequestId())
	a.dirtyMeta()
	a.meta.QueuedWaiters--
	l := cloneLock(lock)
	l.Waiters--
	a.setLock(l)
	return l, nil
}

func (a *applier) bumpRevision() {
	a.dirtyMeta()
	a.meta.Revision++
}

// dirtyMeta makes a.meta this command's own copy, to be written.
func (a *applier) dirtyMeta() {
	if !a.metaDirty {
		a.meta = cloneMeta(a.meta)
		a.metaDirty = true
	}
}

// endLease ends a held lock's lease and marks its request's dedup entry
// ended, starting the dedup window. It writes and returns the free record,
// which keeps the last token and the queue.
func (a *applier) endLease(l *shardv1.LockRecord) (*shardv1.LockRecord, error) {
	d, err := a.dedup(l.GetResource(), l.GetRequestId())
	if err != nil {
		return nil, err
	}
	if d != nil && bytes.Equal(d.GetLeaseId(), l.GetLeaseId()) {
		d = cloneDedup(d)
		d.EndedAtUnixNano = a.now
		a.setDedup(d)
	}
	a.dirtyMeta()
	a.meta.HeldLocks--
	free := &shardv1.LockRecord{
		Resource:          l.GetResource(),
		FencingToken:      l.GetFencingToken(),
		GrantedAtUnixNano: l.GetGrantedAtUnixNano(),
		ExpiresAtUnixNano: l.GetExpiresAtUnixNano(),
		Holder:            l.GetHolder(),
		EndedAtUnixNano:   a.now,
		Waiters:           l.GetWaiters(),
		LastWaiterSeq:     l.GetLastWaiterSeq(),
	}
	a.setLock(free)
	return free, nil
}

// endAndHandOff ends the lock's lease and grants the head waiter.
func (a *applier) endAndHandOff(l *shardv1.LockRecord) error {
	free, err := a.endLease(l)
	if err != nil {
		return err
	}
	_, err = a.grantNext(free)
	return err
}

func (a *applier) renew(c *shardv1.RenewCmd) (*shardv1.Result, error) {
	if res := a.checkKey(c.GetResource()); res != nil {
		return res, nil
	}
	lock, err := a.lock(c.GetResource())
	if err != nil {
		return nil, err
	}
	if !a.current(lock, c.GetLeaseId()) {
		return failed("the lease is not current (expired, released or replaced)"), nil
	}
	l := cloneLock(lock)
	l.ExpiresAtUnixNano = a.now + l.GetLeaseTtlNanos()
	a.setLock(l)
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Lease: leaseInfo(l, false)}, nil
}

// renewBatch renews each item as renew would, in order, so an item sees
// the items before it; each gets its own result.
func (a *applier) renewBatch(c *shardv1.RenewBatchCmd) (*shardv1.Result, error) {
	if n := len(c.GetItems()); n == 0 || n > MaxRenewBatch {
		return invalid("items", fmt.Sprintf("must hold 1 to %d renewals, not %d", MaxRenewBatch, n)), nil
	}
	out := &shardv1.Result{Code: shardv1.Code_CODE_OK, Items: make([]*shardv1.Result, 0, len(c.GetItems()))}
	for _, item := range c.GetItems() {
		res, err := a.renew(item)
		if err != nil {
			return nil, err
		}
		out.Items = append(out.Items, res)
	}
	return out, nil
}

// batch applies each item as its own command would, in order, so an item
// sees the items before it; each gets its own result. An acquire item
// that asks to wait is refused alone: a batch's items do not wait.
func (a *applier) batch(c *shardv1.BatchCmd) (*shardv1.Result, error) {
	if n := len(c.GetItems()); n == 0 || n > MaxBatch {
		return invalid("items", fmt.Sprintf("must hold 1 to %d items, not %d", MaxBatch, n)), nil
	}
	out := &shardv1.Result{Code: shardv1.Code_CODE_OK, Items: make([]*shardv1.Result, 0, len(c.GetItems()))}
	for i, item := range c.GetItems() {
		var res *shardv1.Result
		var err error
		switch {
		case item.GetAcquire().GetWaitTimeoutNanos() != 0:
			res = invalid(fmt.Sprintf("items[%d].wait_timeout_nanos", i), "must be 0 in a batch")
		case item.GetAcquire() != nil:
			res, err = a.acquire(item.GetAcquire())
		case item.GetRelease() != nil:
			res, err = a.release(item.GetRelease())
		default:
			res = invalid(fmt.Sprintf("items[%d]", i), "must hold an acquire or a release")
		}
		if err != nil {
			return nil, err
		}
		out.Items = append(out.Items, res)
	}
	return out, nil
}

func (a *applier) release(c *shardv1.ReleaseCmd) (*shardv1.Result, error) {
	if res := a.checkKey(c.GetResource()); res != nil {
		return res, nil
	}
	lock, err := a.lock(c.GetResource())
	if err != nil {
		return nil, err
	}
	return a.releaseCurrent(lock, c.GetLeaseId())
}

// releaseCurrent ends the lock's lease and hands the lock on, if leaseID is
// its current lease. Only the current lease releases (DESIGN.md §1 rule
// 3): an expired one is over already, and the leader's expiry timer frees
// its record; anything else answers released=false and changes nothing.
func (a *applier) releaseCurrent(lock *shardv1.LockRecord, leaseID []byte) (*shardv1.Result, error) {
	if !a.current(lock, leaseID) {
		return &shardv1.Result{Code: shardv1.Code_CODE_OK}, nil
	}
	if err := a.endAndHandOff(lock); err != nil {
		return nil, err
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Released: true}, nil
}

func (a *applier) expire(c *shardv1.ExpireCmd) (*shardv1.Result, error) {
	var n uint32
	for _, it := range c.GetItems() {
		lock, err := a.lock(it.GetResource())
		if err != nil {
			return nil, err
		}
		// Only the exact lease the leader saw, with the expiry it saw, and
		// only once the skew bound has passed: a deposed or paused leader's
		// late proposal is a no-op (etcd #12528, #15247).
		if !Serves(a.meta, it.GetResource()) || lock == nil || !lock.GetHeld() || !bytes.Equal(lock.GetLeaseId(), it.GetLeaseId()) ||
			lock.GetExpiresAtUnixNano() != it.GetExpiresAtUnixNano() || !a.grantable(lock) {
			continue
		}
		if err := a.endAndHandOff(lock); err != nil {
			return nil, err
		}
		n++
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Count: n}, nil
}

// cancelWait abandons a waiting Acquire: removes it from the queue, or
// releases the lease it was granted in a race with the cancel.
func (a *applier) cancelWait(c *shardv1.CancelWaitCmd) (*shardv1.Result, error) {
	if res := a.checkKey(c.GetResource()); res != nil {
		return res, nil
	}
	d, err := a.dedup(c.GetResource(), c.GetRequestId())
	if err != nil || d == nil {
		return &shardv1.Result{Code: shardv1.Code_CODE_OK}, err
	}
	if len(c.GetAttemptId()) > 0 && !bytes.Equal(c.GetAttemptId(), d.GetAttemptId()) {
		// A later attempt of the same request is alive: it keeps the place.
		return &shardv1.Result{Code: shardv1.Code_CODE_OK}, nil
	}
	lock, err := a.lock(c.GetResource())
	if err != nil {
		return nil, err
	}
	if seq := d.GetWaiterSeq(); seq != 0 {
		w, err := a.waiter(c.GetResource(), seq)
		if err != nil {
			return nil, err
		}
		if w == nil || lock == nil {
			return nil, fmt.Errorf("%w: dedup of %q/%q names waiter %d, which is missing", ErrCorruptRecord, c.GetResource(), c.GetRequestId(), seq)
		}
		if _, err := a.removeWaiter(lock, w); err != nil {
			return nil, err
		}
		// An earlier attempt still waiting on the same place learns at once
		// that the wait is over (its caller's retry gave the place up).
		a.dropped = append(a.dropped, &shardv1.WaiterEvent{Resource: w.GetResource(), RequestId: w.GetRequestId(), Seq: w.GetSeq()})
		return &shardv1.Result{Code: shardv1.Code_CODE_OK, Count: 1}, nil
	}
	return a.releaseCurrent(lock, d.GetLeaseId())
}

// dropWaiters removes waiters whose deadline passed, as the leader saw them.
func (a *applier) dropWaiters(c *shardv1.DropWaitersCmd) (*shardv1.Result, error) {
	var n uint32
	for _, it := range c.GetItems() {
		w, err := a.waiter(it.GetResource(), it.GetSeq())
		if err != nil {
			return nil, err
		}
		if !Serves(a.meta, it.GetResource()) || w == nil || w.GetDeadlineUnixNano() != it.GetDeadlineUnixNano() || a.now < w.GetDeadlineUnixNano() {
			continue
		}
		lock, err := a.lock(it.GetResource())
		if err != nil {
			return nil, err
		}
		if _, err := a.removeWaiter(lock, w); err != nil {
			return nil, err
		}
		a.dropped = append(a.dropped, &shardv1.WaiterEvent{Resource: w.GetResource(), RequestId: w.GetRequestId(), Seq: w.GetSeq()})
		n++
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Count: n}, nil
}

func (a *applier) forget(c *shardv1.ForgetCmd) (*shardv1.Result, error) {
	var n uint32
	window := a.cfg().GetDedupWindowNanos()
	for _, ref := range c.GetDedup() {
		d, err := a.dedup(ref.GetResource(), ref.GetRequestId())
		if err != nil {
			return nil, err
		}
		if !Serves(a.meta, ref.GetResource()) || d == nil || d.GetEndedAtUnixNano() == 0 || a.now < d.GetEndedAtUnixNano()+window {
			continue
		}
		a.deleteDedup(ref.GetResource(), ref.GetRequestId())
		n++
	}
	for _, res := range c.GetIdleLocks() {
		l, err := a.lock(res)
		if err != nil {
			return nil, err
		}
		// Deleting an idle record is safe for tokens: the revision belongs
		// to the shard, so the next grant's token is still larger.
		if !Serves(a.meta, res) || l == nil || l.GetHeld() || l.GetWaiters() > 0 || a.now < l.GetEndedAtUnixNano()+window {
			continue
		}
		a.deleteLock(res)
		n++
	}
	// Ended reservations are kept one dedup window, for retries of their
	// Reserve, Commit and Release.
	for _, ref := range c.GetReservations() {
		if CheckQuotaKey("key", ref.GetKey()) != nil || serves(a.meta, keyspace.Hash(keyspace.Pool(ref.GetKey()))) != nil {
			continue
		}
		r, err := a.reservation(ref.GetKey(), ref.GetReservationId())
		if err != nil {
			return nil, err
		}
		if r == nil || r.GetState() == shardv1.ReservationState_RESERVATION_STATE_OPEN || a.now < r.GetEndedAtUnixNano()+window {
			continue
		}
		a.reservations[ref.GetKey()+"\x00"+ref.GetReservationId()] = nil
		a.put(Change{Kind: DeleteReservation, Key: ref.GetKey(), ID: ref.GetReservationId()})
		n++
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Count: n}, nil
}

func (a *applier) setConfig(c *shardv1.SetConfigCmd) *shardv1.Result {
	cfg := cloneConfig(a.cfg())
	set := func(dst *int64, v *int64) {
		if v != nil {
			*dst = *v
		}
	}
	set(&cfg.MaxClockSkewNanos, c.MaxClockSkewNanos)
	set(&cfg.MinLeaseTtlNanos, c.MinLeaseTtlNanos)
	set(&cfg.MaxLeaseTtlNanos, c.MaxLeaseTtlNanos)
	set(&cfg.DefaultLeaseTtlNanos, c.DefaultLeaseTtlNanos)
	set(&cfg.DedupWindowNanos, c.DedupWindowNanos)
	set(&cfg.MaxWaitTimeoutNanos, c.MaxWaitTimeoutNanos)
	set(&cfg.DefaultReservationTtlNanos, c.DefaultReservationTtlNanos)
	set(&cfg.MaxReservationTtlNanos, c.MaxReservationTtlNanos)
	set(&cfg.LedgerRetentionNanos, c.LedgerRetentionNanos)
	if c.FairnessThresholdPercent != nil {
		cfg.FairnessThresholdPercent = *c.FairnessThresholdPercent
	}
	if c.MaxWaitersPerResource != nil {
		cfg.MaxWaitersPerResource = *c.MaxWaitersPerResource
	}
	if c.MaxWaitersPerTenant != nil {
		cfg.MaxWaitersPerTenant = *c.MaxWaitersPerTenant
	}
	if err := CheckConfig(cfg); err != nil {
		return invalidErr(err)
	}
	if old := a.cfg().GetMaxClockSkewNanos(); a.version >= VersionSkewRaiseOnly && cfg.GetMaxClockSkewNanos() < old {
		return invalid("max_clock_skew", fmt.Sprintf("can only be raised (it is %v): shard time that leaders stamped under it may lead real time by up to half of it, and a lower bound would let leases be granted early", time.Duration(old)))
	}
	a.dirtyMeta()
	a.meta.Config = cfg
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Config: cfg}
}

// CheckConfig validates a shard config and returns a *FieldError naming
// the first bad field, or nil.
func CheckConfig(c *shardv1.ShardConfig) error {
	switch {
	case c.GetMaxClockSkewNanos() < 0 || c.GetMaxClockSkewNanos() > maxClockSkewBound:
		return &FieldError{"max_clock_skew", fmt.Sprintf("must be within [0, %v]", time.Duration(maxClockSkewBound))}
	case c.GetMinLeaseTtlNanos() < int64(time.Millisecond):
		return &FieldError{"min_lease_ttl", "must be at least 1ms"}
	case c.GetMaxLeaseTtlNanos() < c.GetMinLeaseTtlNanos() || c.GetMaxLeaseTtlNanos() > maxDurationBound:
		return &FieldError{"max_lease_ttl", fmt.Sprintf("must be within [min_lease_ttl, %v]", time.Duration(maxDurationBound))}
	case c.GetDefaultLeaseTtlNanos() < c.GetMinLeaseTtlNanos() || c.GetDefaultLeaseTtlNanos() > c.GetMaxLeaseTtlNanos():
		return &FieldError{"default_lease_ttl", "must be within [min_lease_ttl, max_lease_ttl]"}
	case c.GetDedupWindowNanos() < 0 || c.GetDedupWindowNanos() > maxDurationBound:
		return &FieldError{"dedup_window", fmt.Sprintf("must be within [0, %v]", time.Duration(maxDurationBound))}
	case c.GetMaxWaitTimeoutNanos() < int64(time.Millisecond) || c.GetMaxWaitTimeoutNanos() > maxDurationBound:
		return &FieldError{"max_wait_timeout", fmt.Sprintf("must be within [1ms, %v]", time.Duration(maxDurationBound))}
	case c.GetMaxReservationTtlNanos() < c.GetMinLeaseTtlNanos() || c.GetMaxReservationTtlNanos() > maxDurationBound:
		return &FieldError{"max_reservation_ttl", fmt.Sprintf("must be within [min_lease_ttl, %v]", time.Duration(maxDurationBound))}
	case c.GetDefaultReservationTtlNanos() < c.GetMinLeaseTtlNanos() || c.GetDefaultReservationTtlNanos() > c.GetMaxReservationTtlNanos():
		return &FieldError{"default_reservation_ttl", "must be within [min_lease_ttl, max_reservation_ttl]"}
	case c.GetLedgerRetentionNanos() != 0 && (c.GetLedgerRetentionNanos() < int64(time.Hour) || c.GetLedgerRetentionNanos() > 10*365*int64(24*time.Hour)):
		return &FieldError{"ledger_retention", "must be 0 (forever) or within [1h, 3650 days]"}
	case c.GetFairnessThresholdPercent() < 1 || c.GetFairnessThresholdPercent() > 100:
		return &FieldError{"fairness_threshold_percent", "must be within [1, 100]"}
	}
	return nil
}

// requestRecord is the dedup record of an Acquire request: the parameters
// a retry must repeat, the lease id it gets, and its latest attempt.
func requestRecord(resource, requestID string, leaseID []byte, ttl int64, holder string, attempt []byte) *shardv1.DedupRecord {
	return &shardv1.DedupRecord{
		Resource:      resource,
		RequestId:     requestID,
		LeaseId:       leaseID,
		LeaseTtlNanos: ttl,
		Holder:        holder,
		AttemptId:     attempt,
	}
}

// leaseInfo reports a lock's lease; withID says whether the bearer secret
// may be included (only to the request that was granted it).
func leaseInfo(l *shardv1.LockRecord, withID bool) *shardv1.LeaseInfo {
	li := &shardv1.LeaseInfo{
		FencingToken:      l.GetFencingToken(),
		ExpiresAtUnixNano: l.GetExpiresAtUnixNano(),
		LeaseTtlNanos:     l.GetLeaseTtlNanos(),
	}
	if withID {
		li.LeaseId = l.GetLeaseId()
	}
	return li
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
