package shard

import (
	"bytes"
	"fmt"
	"time"

	"github.com/warden-dev/warden/keyspace"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// The lock commands: acquire, renew, release, batches, expiry, waiters
// and the dedup records that make them idempotent.

// Holds reports whether lock l keeps everyone else out at shard time now
// (Unix ns) under config c: it is held and its lease's expiry plus
// max_clock_skew has not passed (DESIGN.md §1 rule 6). A nil record holds
// nothing. Describe answers held with it; a grant needs it false.
func Holds(l *shardv1.LockRecord, c *shardv1.ShardConfig, now int64) bool {
	return l.GetHeld() && now < l.GetExpiresAtUnixNano()+c.GetMaxClockSkewNanos()
}

// DescribeHolds reports whether the lock a Describe lookup read (q.Lock)
// is held, as Describe answers it: Holds at the shard's time high-water
// mark (q.Meta.last_now_unix_nano, the latest now any applied command
// carried), not at the reading leader's clock (q.TimeUnixNano). Every
// command applies at that time or later, so a lock it shows free is
// grantable to a command stamped by any leader, whatever its clock; one
// read at a leader clock ahead (a leader not yet confirmed, or out of
// bounds, DESIGN.md "Time") showed a lock free that the next leader
// still refused as held. A lease past expires_at + max_clock_skew shows
// held until a command applies a later time: the leader's expiry sweep
// does within a scan interval.
func DescribeHolds(q *shardv1.QueryResult) bool {
	return Holds(q.GetLock(), q.GetMeta().GetConfig(), q.GetMeta().GetLastNowUnixNano())
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
		// parameter: a retry may carry the time it has left. From
		// VersionPrincipal, only the principal that made the request may
		// replay it, checked first so a refusal says nothing of the
		// request's parameters. An Acquire without a principal
		// (authentication off) is not checked: every caller may do
		// everything then.
		if a.version >= VersionPrincipal && c.GetPrincipal() != "" && d.GetPrincipal() != c.GetPrincipal() {
			return &shardv1.Result{Code: shardv1.Code_CODE_PERMISSION_DENIED, Field: "request_id", Reason: "was used by another principal"}, nil
		}
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
		if lock, err = a.endLease(lock, false); err != nil {
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
	d = a.requestRecord(c, ttl)
	d.FencingToken = l.GetFencingToken()
	a.setDedup(d)
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Lease: leaseInfo(l, true)}, nil
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
	a.put(putWaiter{waiter: &shardv1.WaiterRecord{
		Resource:         c.GetResource(),
		RequestId:        c.GetRequestId(),
		Seq:              l.GetLastWaiterSeq(),
		LeaseId:          c.GetLeaseId(),
		LeaseTtlNanos:    ttl,
		Holder:           c.GetHolder(),
		Tenant:           c.GetTenant(),
		DeadlineUnixNano: deadline,
	}})
	d := a.requestRecord(c, ttl)
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
		d := newDedup(w.GetResource(), w.GetRequestId(), w.GetLeaseId(), w.GetLeaseTtlNanos(), w.GetHolder(), queued.GetAttemptId())
		d.FencingToken = l.GetFencingToken()
		if a.version >= VersionPrincipal {
			d.Principal = queued.GetPrincipal() // the waiter's, who may replay it
		}
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
	a.put(deleteWaiter{resource: w.GetResource(), seq: w.GetSeq()})
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

// endLease ends a held lock's lease and marks its request's dedup entry
// ended, starting the dedup window; byRelease says a Release of the lease
// ends it, which from VersionReleaseReplay the entry remembers, for that
// Release's repeats. It writes and returns the free record, which keeps
// the last token and the queue.
func (a *applier) endLease(l *shardv1.LockRecord, byRelease bool) (*shardv1.LockRecord, error) {
	d, err := a.dedup(l.GetResource(), l.GetRequestId())
	if err != nil {
		return nil, err
	}
	if d != nil && bytes.Equal(d.GetLeaseId(), l.GetLeaseId()) {
		d = cloneDedup(d)
		d.EndedAtUnixNano = a.now
		if byRelease && a.version >= VersionReleaseReplay {
			d.Released = true
			a.released[l.GetResource()+"\x00"+string(l.GetLeaseId())] = true
		}
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

// endAndHandOff ends the lock's lease (byRelease: by a Release, as for
// endLease) and grants the head waiter.
func (a *applier) endAndHandOff(l *shardv1.LockRecord, byRelease bool) error {
	free, err := a.endLease(l, byRelease)
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
	if a.version >= VersionReleaseReplay && !a.current(lock, c.GetLeaseId()) {
		// A repeat of a Release that ended this lease changes nothing,
		// but says that the lease was released (replayed), while the
		// request's dedup record is kept (DESIGN.md §1 rule 3); a lease
		// that expired or was revoked was not released.
		done, err := a.releasedLease(c.GetResource(), c.GetLeaseId())
		if err != nil || done {
			return &shardv1.Result{Code: shardv1.Code_CODE_OK, Replayed: done}, err
		}
	}
	return a.releaseCurrent(lock, c.GetLeaseId(), true)
}

// releasedLease reports whether a Release ended resource's lease leaseID,
// in this command or in one the state holds.
func (a *applier) releasedLease(resource string, leaseID []byte) (bool, error) {
	if a.released[resource+"\x00"+string(leaseID)] {
		return true, nil
	}
	d, err := a.r.ReleasedLease(resource, leaseID)
	return d != nil, err
}

// releaseCurrent ends the lock's lease and hands the lock on, if leaseID is
// its current lease; byRelease says the lease's own Release asks. Only
// the current lease releases (DESIGN.md §1 rule 3): an expired one is
// over already, and the leader's expiry timer frees its record; anything
// else answers released=false and changes nothing.
func (a *applier) releaseCurrent(lock *shardv1.LockRecord, leaseID []byte, byRelease bool) (*shardv1.Result, error) {
	if !a.current(lock, leaseID) {
		return &shardv1.Result{Code: shardv1.Code_CODE_OK}, nil
	}
	if err := a.endAndHandOff(lock, byRelease); err != nil {
		return nil, err
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Released: true}, nil
}

// revoke ends the lock's current lease if it is the one with the fencing
// token the operator saw (Describe), and hands the lock on: a token, never
// a lease id, names it, since no one but the holder knows the lease id.
// An expired lease is the expiry timer's to end, as for Release (rule 3).
func (a *applier) revoke(c *shardv1.RevokeCmd) (*shardv1.Result, error) {
	if res := a.checkKey(c.GetResource()); res != nil {
		return res, nil
	}
	if c.GetFencingToken() == 0 {
		return invalid("fencing_token", "is required"), nil
	}
	lock, err := a.lock(c.GetResource())
	if err != nil {
		return nil, err
	}
	if lock.GetFencingToken() != c.GetFencingToken() {
		return &shardv1.Result{Code: shardv1.Code_CODE_OK}, nil
	}
	return a.releaseCurrent(lock, lock.GetLeaseId(), false)
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
		if err := a.endAndHandOff(lock, false); err != nil {
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
	return a.releaseCurrent(lock, d.GetLeaseId(), false)
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
		a.put(deleteReservation{key: ref.GetKey(), id: ref.GetReservationId()})
		n++
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Count: n}, nil
}

// requestRecord is the dedup record of Acquire c, granted or queued with
// lease TTL ttl; from VersionPrincipal it keeps c's principal.
func (a *applier) requestRecord(c *shardv1.AcquireCmd, ttl int64) *shardv1.DedupRecord {
	d := newDedup(c.GetResource(), c.GetRequestId(), c.GetLeaseId(), ttl, c.GetHolder(), c.GetLeaseId())
	if a.version >= VersionPrincipal {
		d.Principal = c.GetPrincipal()
	}
	return d
}

// newDedup is the dedup record of an Acquire request: the parameters a
// retry must repeat, the lease id it gets, and its latest attempt.
func newDedup(resource, requestID string, leaseID []byte, ttl int64, holder string, attempt []byte) *shardv1.DedupRecord {
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
