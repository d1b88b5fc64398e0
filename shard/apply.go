package shard

import (
	"bytes"
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// CommandVersion is the envelope version this binary proposes and the
// newest it applies.
const CommandVersion = 1

// DefaultConfig is the shard config a new shard starts with.
func DefaultConfig() *shardv1.ShardConfig {
	return &shardv1.ShardConfig{
		MaxClockSkewNanos:    int64(500 * time.Millisecond),
		MinLeaseTtlNanos:     int64(time.Second),
		MaxLeaseTtlNanos:     int64(10 * time.Minute),
		DefaultLeaseTtlNanos: int64(30 * time.Second),
		DedupWindowNanos:     int64(10 * time.Minute),
	}
}

// maxClockSkewBound caps max_clock_skew: a larger bound would make a dead
// holder's lock wait longer than any sane lease.
const maxClockSkewBound = int64(time.Minute)

// KeyHash places a key in the 64-bit hash space that shards partition.
// Locks hash their resource name (DESIGN.md §2 "Placement and routing").
func KeyHash(key string) uint64 { return xxhash.Sum64String(key) }

// InRange reports whether hash h falls in the descriptor's [start, end).
func InRange(d *shardv1.RangeDescriptor, h uint64) bool {
	return h >= d.GetStart() && (d.GetEnd() == 0 || h < d.GetEnd())
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
)

// Change is one write decided by Apply. Put kinds carry the new record;
// delete kinds carry the key (Resource, and RequestID for dedup).
type Change struct {
	Kind      ChangeKind
	Meta      *shardv1.ShardMeta
	Lock      *shardv1.LockRecord
	Dedup     *shardv1.DedupRecord
	Resource  string
	RequestID string
}

// Apply decides one command against the state r and returns its result
// and the changes to write, in order. It is pure: it reads no clock, draws
// no random numbers and writes nothing; time comes from the envelope. A
// refused command is a Result with a non-OK code and no changes. The error
// is only ever a read error of r or ErrUnsupportedVersion.
func Apply(r Reader, env *shardv1.Envelope) (*shardv1.Result, []Change, error) {
	if env.GetVersion() > CommandVersion {
		return nil, nil, fmt.Errorf("%w: %d (this binary applies up to %d)", ErrUnsupportedVersion, env.GetVersion(), CommandVersion)
	}
	meta, err := r.Meta()
	if err != nil {
		return nil, nil, err
	}
	a := &applier{r: r, meta: meta}
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
		a.meta = cloneMeta(meta)
		a.meta.LastNowUnixNano = a.now
		a.metaDirty = true
	}
	var res *shardv1.Result
	switch c := env.GetCommand().(type) {
	case *shardv1.Envelope_Acquire:
		res, err = a.acquire(c.Acquire)
	case *shardv1.Envelope_Renew:
		res, err = a.renew(c.Renew)
	case *shardv1.Envelope_Release:
		res, err = a.release(c.Release)
	case *shardv1.Envelope_Expire:
		res, err = a.expire(c.Expire)
	case *shardv1.Envelope_Forget:
		res, err = a.forget(c.Forget)
	case *shardv1.Envelope_SetConfig:
		res = a.setConfig(c.SetConfig)
	default:
		res = invalid("command", "is missing or unknown")
	}
	if err != nil {
		return nil, nil, err
	}
	if res.GetCode() != shardv1.Code_CODE_OK {
		// A refusal changes nothing but the shard's time.
		a.changes = a.changes[:0]
	}
	if a.metaDirty {
		a.changes = append([]Change{{Kind: PutMeta, Meta: a.meta}}, a.changes...)
	}
	return res, a.changes, nil
}

type applier struct {
	r         Reader
	meta      *shardv1.ShardMeta
	metaDirty bool
	now       int64
	changes   []Change
}

func (a *applier) cfg() *shardv1.ShardConfig { return a.meta.GetConfig() }

func (a *applier) put(c Change) { a.changes = append(a.changes, c) }

// checkKey refuses a resource that is malformed or outside the shard's range.
func (a *applier) checkKey(resource string) *shardv1.Result {
	if err := CheckName("resource", resource, MaxResourceBytes); err != nil {
		return invalidErr(err)
	}
	if !InRange(a.meta.GetRange(), KeyHash(resource)) {
		return wrongShard(a.meta, "resource is outside the shard's hash range")
	}
	return nil
}

// grantable reports whether the lock may be granted to a new lease now:
// it is free, or its lease's expiry plus max_clock_skew has passed on the
// shard's clock (DESIGN.md §1 rule 6).
func (a *applier) grantable(l *shardv1.LockRecord) bool {
	return l == nil || !l.GetHeld() || a.now >= l.GetExpiresAtUnixNano()+a.cfg().GetMaxClockSkewNanos()
}

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
	lock, err := a.r.Lock(c.GetResource())
	if err != nil {
		return nil, err
	}
	d, err := a.r.Dedup(c.GetResource(), c.GetRequestId())
	if err != nil {
		return nil, err
	}
	if d != nil {
		// A retry (DESIGN.md §1 rules 5 and 8).
		if d.GetLeaseTtlNanos() != ttl || d.GetHolder() != c.GetHolder() {
			return invalid("request_id", "was used before with a different lease_ttl or holder"), nil
		}
		if !a.current(lock, d.GetLeaseId()) {
			return &shardv1.Result{Code: shardv1.Code_CODE_FAILED_PRECONDITION, Reason: "the lease granted to this request_id has ended"}, nil
		}
		return &shardv1.Result{Code: shardv1.Code_CODE_OK, Replayed: true, Lease: leaseInfo(lock, true)}, nil
	}
	if !a.grantable(lock) {
		return &shardv1.Result{Code: shardv1.Code_CODE_CONFLICT, Reason: "the lock is held", Lease: leaseInfo(lock, false)}, nil
	}
	if a.meta.GetRevision() >= MaxRevision {
		return &shardv1.Result{Code: shardv1.Code_CODE_UNAVAILABLE, Reason: "the shard's revision space is exhausted; it needs a new epoch"}, nil
	}
	token := Token(a.meta.GetEpoch(), a.meta.GetRevision()+1)
	if lock != nil && token <= lock.GetFencingToken() {
		// Safety rule 2: never reissue or lower a token. Nothing is granted.
		return &shardv1.Result{Code: shardv1.Code_CODE_INTERNAL,
			Reason: fmt.Sprintf("fencing token %d would not exceed the last token %d", token, lock.GetFencingToken())}, nil
	}
	if lock != nil && lock.GetHeld() {
		// The previous lease expired but was not yet reaped; end it now.
		if err := a.endLease(lock); err != nil {
			return nil, err
		}
	}
	a.bumpRevision()
	l := &shardv1.LockRecord{
		Resource:          c.GetResource(),
		Held:              true,
		LeaseId:           c.GetLeaseId(),
		RequestId:         c.GetRequestId(),
		Holder:            c.GetHolder(),
		FencingToken:      token,
		LeaseTtlNanos:     ttl,
		GrantedAtUnixNano: a.now,
		ExpiresAtUnixNano: a.now + ttl,
	}
	a.put(Change{Kind: PutLock, Lock: l})
	a.put(Change{Kind: PutDedup, Dedup: &shardv1.DedupRecord{
		Resource:      c.GetResource(),
		RequestId:     c.GetRequestId(),
		LeaseId:       c.GetLeaseId(),
		LeaseTtlNanos: ttl,
		Holder:        c.GetHolder(),
		FencingToken:  token,
	}})
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Lease: leaseInfo(l, true)}, nil
}

func (a *applier) bumpRevision() {
	if !a.metaDirty {
		a.meta = cloneMeta(a.meta)
		a.metaDirty = true
	}
	a.meta.Revision++
}

// endLease frees a held lock record and marks its request's dedup entry
// ended, starting both records' dedup window.
func (a *applier) endLease(l *shardv1.LockRecord) error {
	d, err := a.r.Dedup(l.GetResource(), l.GetRequestId())
	if err != nil {
		return err
	}
	if d != nil && bytes.Equal(d.GetLeaseId(), l.GetLeaseId()) {
		d = cloneDedup(d)
		d.EndedAtUnixNano = a.now
		a.put(Change{Kind: PutDedup, Dedup: d})
	}
	free := &shardv1.LockRecord{
		Resource:          l.GetResource(),
		FencingToken:      l.GetFencingToken(),
		GrantedAtUnixNano: l.GetGrantedAtUnixNano(),
		ExpiresAtUnixNano: l.GetExpiresAtUnixNano(),
		Holder:            l.GetHolder(),
		EndedAtUnixNano:   a.now,
	}
	a.put(Change{Kind: PutLock, Lock: free})
	return nil
}

func (a *applier) renew(c *shardv1.RenewCmd) (*shardv1.Result, error) {
	if res := a.checkKey(c.GetResource()); res != nil {
		return res, nil
	}
	lock, err := a.r.Lock(c.GetResource())
	if err != nil {
		return nil, err
	}
	if !a.current(lock, c.GetLeaseId()) {
		return &shardv1.Result{Code: shardv1.Code_CODE_FAILED_PRECONDITION, Reason: "the lease is not current (expired, released or replaced)"}, nil
	}
	l := cloneLock(lock)
	l.ExpiresAtUnixNano = a.now + l.GetLeaseTtlNanos()
	a.put(Change{Kind: PutLock, Lock: l})
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Lease: leaseInfo(l, false)}, nil
}

func (a *applier) release(c *shardv1.ReleaseCmd) (*shardv1.Result, error) {
	if res := a.checkKey(c.GetResource()); res != nil {
		return res, nil
	}
	lock, err := a.r.Lock(c.GetResource())
	if err != nil {
		return nil, err
	}
	// Only the current lease releases (DESIGN.md §1 rule 3). An expired one
	// is over already; the leader's expiry timer frees its record.
	if !a.current(lock, c.GetLeaseId()) {
		return &shardv1.Result{Code: shardv1.Code_CODE_OK, Released: false}, nil
	}
	if err := a.endLease(lock); err != nil {
		return nil, err
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Released: true}, nil
}

func (a *applier) expire(c *shardv1.ExpireCmd) (*shardv1.Result, error) {
	var n uint32
	for _, it := range c.GetItems() {
		lock, err := a.r.Lock(it.GetResource())
		if err != nil {
			return nil, err
		}
		// Only the exact lease the leader saw, with the expiry it saw, and
		// only once the skew bound has passed: a deposed or paused leader's
		// late proposal is a no-op (etcd #12528, #15247).
		if lock == nil || !lock.GetHeld() || !bytes.Equal(lock.GetLeaseId(), it.GetLeaseId()) ||
			lock.GetExpiresAtUnixNano() != it.GetExpiresAtUnixNano() || !a.grantable(lock) {
			continue
		}
		if err := a.endLease(lock); err != nil {
			return nil, err
		}
		n++
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Count: n}, nil
}

func (a *applier) forget(c *shardv1.ForgetCmd) (*shardv1.Result, error) {
	var n uint32
	window := a.cfg().GetDedupWindowNanos()
	for _, ref := range c.GetDedup() {
		d, err := a.r.Dedup(ref.GetResource(), ref.GetRequestId())
		if err != nil {
			return nil, err
		}
		if d == nil || d.GetEndedAtUnixNano() == 0 || a.now < d.GetEndedAtUnixNano()+window {
			continue
		}
		a.put(Change{Kind: DeleteDedup, Resource: ref.GetResource(), RequestID: ref.GetRequestId()})
		n++
	}
	for _, res := range c.GetIdleLocks() {
		l, err := a.r.Lock(res)
		if err != nil {
			return nil, err
		}
		// Deleting an idle record is safe for tokens: the revision belongs
		// to the shard, so the next grant's token is still larger.
		if l == nil || l.GetHeld() || a.now < l.GetEndedAtUnixNano()+window {
			continue
		}
		a.put(Change{Kind: DeleteLock, Resource: res})
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
	if err := CheckConfig(cfg); err != nil {
		return invalidErr(err)
	}
	if !a.metaDirty {
		a.meta = cloneMeta(a.meta)
		a.metaDirty = true
	}
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
	case c.GetMaxLeaseTtlNanos() < c.GetMinLeaseTtlNanos():
		return &FieldError{"max_lease_ttl", "must be at least min_lease_ttl"}
	case c.GetDefaultLeaseTtlNanos() < c.GetMinLeaseTtlNanos() || c.GetDefaultLeaseTtlNanos() > c.GetMaxLeaseTtlNanos():
		return &FieldError{"default_lease_ttl", "must be within [min_lease_ttl, max_lease_ttl]"}
	case c.GetDedupWindowNanos() < 0:
		return &FieldError{"dedup_window", "must not be negative"}
	}
	return nil
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
