package shard

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/keyspace"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// Moving a hash range between shards (DESIGN.md §2 "Placement and
// routing"). Dragonboat cannot split a group, so a placement operator
// drives a move through these commands, each idempotent so that a new
// placement leader can repeat the step it was in:
//
//  1. FenceRange in the source: commands on the moving keys answer
//     CODE_UNAVAILABLE and the leader's timers leave them alone.
//  2. ImportRange into the new, inactive shard: the records, copied from
//     the source through an ExportQuery (any number of commands).
//  3. ActivateRange in the new shard: it owns the range from now on, with
//     a fresh epoch, so its tokens exceed every token the source granted.
//  4. The operator commits the new placement map.
//  5. ReleaseRange in the source: its range shrinks to the rest and the
//     moved records are deleted.
//
// UnfenceRange rolls back an operator that has not reached step 3.

// serves answers nil when the shard serves hash h now, or its refusal:
// CODE_WRONG_SHARD outside its range (or before it has one), and
// CODE_UNAVAILABLE inside a fence, which the router retries.
func serves(meta *shardv1.ShardMeta, h uint64) *shardv1.Result {
	if meta.GetInactive() || !InRange(meta.GetRange(), h) {
		return wrongShard(meta, "resource is outside the shard's hash range")
	}
	if f := meta.GetFence(); f != nil && InRange(&shardv1.RangeDescriptor{Start: f.GetStart(), End: f.GetEnd()}, h) {
		return &shardv1.Result{Code: shardv1.Code_CODE_UNAVAILABLE, Reason: fmt.Sprintf("its hash range is moving to another shard (operator %d)", f.GetOperatorId())}
	}
	return nil
}

// Serves reports whether a shard with this meta serves resource now: it
// owns the resource's hash, and no move has fenced it. Reads use it to
// refuse what a stale router sent to the wrong shard.
func Serves(meta *shardv1.ShardMeta, resource string) bool {
	return serves(meta, keyspace.Hash(resource)) == nil
}

// endBefore reports whether end a comes before end b, where end 0 is 2^64.
func endBefore(a, b uint64) bool { return a != 0 && (b == 0 || a < b) }

// fenceSide says which end of r the fence f takes: "upper", "lower", or ""
// when f is not a proper part at either end.
func fenceSide(r *shardv1.RangeDescriptor, f *shardv1.RangeFence) string {
	switch {
	case f.GetEnd() == r.GetEnd() && f.GetStart() > r.GetStart() && endBefore(f.GetStart(), r.GetEnd()):
		return "upper"
	case f.GetStart() == r.GetStart() && f.GetEnd() != 0 && f.GetEnd() > r.GetStart() && endBefore(f.GetEnd(), r.GetEnd()):
		return "lower"
	}
	return ""
}

func (a *applier) fenceRange(c *shardv1.FenceRangeCmd) *shardv1.Result {
	f := c.GetFence()
	if f.GetOperatorId() == 0 {
		return invalid("fence.operator_id", "is required")
	}
	if cur := a.meta.GetFence(); cur != nil {
		if proto.Equal(cur, f) {
			return &shardv1.Result{Code: shardv1.Code_CODE_OK, Replayed: true}
		}
		return failed(fmt.Sprintf("the shard is already moving [%#x, %#x) for operator %d", cur.GetStart(), cur.GetEnd(), cur.GetOperatorId()))
	}
	if a.meta.GetInactive() {
		return failed("the shard owns no hash range")
	}
	if fenceSide(a.meta.GetRange(), f) == "" {
		return invalid("fence", fmt.Sprintf("[%#x, %#x) is not a proper lower or upper part of the shard's range [%#x, %#x)",
			f.GetStart(), f.GetEnd(), a.meta.GetRange().GetStart(), a.meta.GetRange().GetEnd()))
	}
	a.dirtyMeta()
	a.meta.Fence = proto.CloneOf(f)
	return &shardv1.Result{Code: shardv1.Code_CODE_OK}
}

func (a *applier) unfenceRange(c *shardv1.UnfenceRangeCmd) *shardv1.Result {
	if f := a.meta.GetFence(); f != nil && f.GetOperatorId() == c.GetOperatorId() {
		a.dirtyMeta()
		a.meta.Fence = nil
		return &shardv1.Result{Code: shardv1.Code_CODE_OK, Count: 1}
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK}
}

// claim checks that an inactive shard may take operator op's import or
// activation, and records op as its operator.
func (a *applier) claim(op uint64) *shardv1.Result {
	if op == 0 {
		return invalid("operator_id", "is required")
	}
	if cur := a.meta.GetOperatorId(); cur != 0 && cur != op {
		return failed(fmt.Sprintf("the shard is being filled by operator %d", cur))
	}
	if a.meta.GetOperatorId() != op {
		a.dirtyMeta()
		a.meta.OperatorId = op
	}
	return nil
}

func (a *applier) importRange(c *shardv1.ImportRangeCmd) (*shardv1.Result, error) {
	if !a.meta.GetInactive() {
		if a.meta.GetOperatorId() == c.GetOperatorId() && c.GetOperatorId() != 0 {
			return &shardv1.Result{Code: shardv1.Code_CODE_OK, Replayed: true}, nil // activated already
		}
		return failed("the shard is active; only a new shard imports records"), nil
	}
	if res := checkRecords(c.GetRecords()); res != nil {
		return res, nil
	}
	if res := a.claim(c.GetOperatorId()); res != nil {
		return res, nil
	}
	recs := c.GetRecords()
	for _, l := range recs.GetLocks() {
		old, err := a.lock(l.GetResource())
		if err != nil {
			return nil, err
		}
		a.countHeld(old, -1)
		a.countHeld(l, +1)
		a.setLock(l)
	}
	for _, d := range recs.GetDedups() {
		a.setDedup(d)
	}
	for _, w := range recs.GetWaiters() {
		old, err := a.waiter(w.GetResource(), w.GetSeq())
		if err != nil {
			return nil, err
		}
		if old == nil {
			if err := a.addTenantWaiters(w.GetTenant(), +1); err != nil {
				return nil, err
			}
			a.dirtyMeta()
			a.meta.QueuedWaiters++
		}
		a.put(putWaiter{waiter: w})
	}
	// Quota trees move whole: levels, reservations (the store rebuilds
	// their expiry indexes), ledger and its sequence, reports.
	for _, q := range recs.GetQuotas() {
		a.put(putQuota{quota: q})
	}
	for _, r := range recs.GetReservations() {
		a.put(putReservation{reservation: r})
	}
	for _, p := range recs.GetPools() {
		a.put(putPool{pool: p})
	}
	for _, e := range recs.GetLedger() {
		a.put(putLedger{event: e})
	}
	for _, u := range recs.GetReports() {
		a.put(putReport{report: u})
	}
	for _, k := range recs.GetCheckpoints() {
		a.put(putCheckpoint{checkpoint: k})
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Count: uint32(RecordCount(recs))}, nil
}

// countHeld moves the meta's count of held locks by delta if l is held.
func (a *applier) countHeld(l *shardv1.LockRecord, delta int) {
	if l.GetHeld() {
		a.dirtyMeta()
		a.meta.HeldLocks = uint64(int64(a.meta.HeldLocks) + int64(delta))
	}
}

// checkRecords refuses imported records that could not have come from a
// shard: bad names or duplicates within the command.
func checkRecords(r *shardv1.RangeRecords) *shardv1.Result {
	locks := map[string]bool{}
	for _, l := range r.GetLocks() {
		if err := CheckName("records.locks.resource", l.GetResource(), MaxResourceBytes); err != nil {
			return invalidErr(err)
		}
		if locks[l.GetResource()] {
			return invalid("records.locks", "names "+l.GetResource()+" twice")
		}
		locks[l.GetResource()] = true
	}
	for _, d := range r.GetDedups() {
		if err := CheckName("records.dedups.resource", d.GetResource(), MaxResourceBytes); err != nil {
			return invalidErr(err)
		}
		if err := CheckName("records.dedups.request_id", d.GetRequestId(), MaxRequestIDBytes); err != nil {
			return invalidErr(err)
		}
	}
	for _, q := range r.GetQuotas() {
		if err := CheckQuotaKey("records.quotas.key", q.GetKey()); err != nil {
			return invalidErr(err)
		}
	}
	for _, v := range r.GetReservations() {
		if err := CheckQuotaKey("records.reservations.key", v.GetKey()); err != nil {
			return invalidErr(err)
		}
	}
	for _, e := range r.GetLedger() {
		if err := CheckQuotaKey("records.ledger.key", e.GetKey()); err != nil {
			return invalidErr(err)
		}
	}
	for _, u := range r.GetReports() {
		if err := CheckQuotaKey("records.reports.key", u.GetKey()); err != nil {
			return invalidErr(err)
		}
	}
	for _, k := range r.GetCheckpoints() {
		if err := CheckQuotaKey("records.checkpoints.key", k.GetKey()); err != nil {
			return invalidErr(err)
		}
	}
	for _, p := range r.GetPools() {
		if err := CheckQuotaKey("records.pools.pool", p.GetPool()); err != nil || strings.Contains(p.GetPool(), "/") {
			return invalid("records.pools.pool", "must be one segment")
		}
	}
	waiters := map[waiterKeyT]bool{}
	for _, w := range r.GetWaiters() {
		if err := CheckName("records.waiters.resource", w.GetResource(), MaxResourceBytes); err != nil {
			return invalidErr(err)
		}
		k := waiterKeyT{w.GetResource(), w.GetSeq()}
		if w.GetSeq() == 0 || waiters[k] {
			return invalid("records.waiters.seq", fmt.Sprintf("%d of %s is zero or repeated", w.GetSeq(), w.GetResource()))
		}
		waiters[k] = true
	}
	return nil
}

func (a *applier) activateRange(c *shardv1.ActivateRangeCmd) *shardv1.Result {
	rg := c.GetRange()
	if !a.meta.GetInactive() {
		if a.meta.GetOperatorId() == c.GetOperatorId() && c.GetOperatorId() != 0 && proto.Equal(a.meta.GetRange(), rg) {
			return &shardv1.Result{Code: shardv1.Code_CODE_OK, Replayed: true}
		}
		return failed("the shard is active already")
	}
	switch {
	case rg.GetShardId() != a.meta.GetRange().GetShardId():
		return invalid("range.shard_id", fmt.Sprintf("is %d, not this shard's %d", rg.GetShardId(), a.meta.GetRange().GetShardId()))
	case rg.GetGeneration() == 0:
		return invalid("range.generation", "is required")
	case c.GetEpoch() <= a.meta.GetEpoch() || c.GetEpoch() > MaxEpoch:
		return invalid("epoch", fmt.Sprintf("%d is not in (%d, %d]", c.GetEpoch(), a.meta.GetEpoch(), MaxEpoch))
	}
	if err := CheckConfig(c.GetConfig()); err != nil {
		return invalidErr(err)
	}
	if res := a.claim(c.GetOperatorId()); res != nil {
		return res
	}
	a.dirtyMeta()
	a.meta.Range = proto.CloneOf(rg)
	a.meta.Epoch, a.meta.Revision = c.GetEpoch(), 0
	a.meta.Config = cloneConfig(c.GetConfig())
	a.meta.Inactive = false
	a.now = max(a.now, c.GetSourceLastNowUnixNano())
	a.meta.LastNowUnixNano = a.now
	return &shardv1.Result{Code: shardv1.Code_CODE_OK}
}

func (a *applier) releaseRange(c *shardv1.ReleaseRangeCmd) (*shardv1.Result, error) {
	keep, r, f := c.GetKeep(), a.meta.GetRange(), a.meta.GetFence()
	if f == nil || f.GetOperatorId() != c.GetOperatorId() {
		if proto.Equal(r, keep) && c.GetOperatorId() != 0 {
			return &shardv1.Result{Code: shardv1.Code_CODE_OK, Replayed: true}, nil
		}
		return failed(fmt.Sprintf("operator %d has no fence in this shard", c.GetOperatorId())), nil
	}
	wantStart, wantEnd := r.GetStart(), f.GetStart()
	if fenceSide(r, f) == "lower" {
		wantStart, wantEnd = f.GetEnd(), r.GetEnd()
	}
	switch {
	case keep.GetShardId() != r.GetShardId():
		return invalid("keep.shard_id", fmt.Sprintf("is %d, not this shard's %d", keep.GetShardId(), r.GetShardId())), nil
	case keep.GetStart() != wantStart || keep.GetEnd() != wantEnd:
		return invalid("keep", fmt.Sprintf("[%#x, %#x) is not the range without the fence, [%#x, %#x)", keep.GetStart(), keep.GetEnd(), wantStart, wantEnd)), nil
	case keep.GetGeneration() <= r.GetGeneration():
		return invalid("keep.generation", fmt.Sprintf("%d is not above the range's %d", keep.GetGeneration(), r.GetGeneration())), nil
	}
	recs, _, err := a.r.Records(f.GetStart(), f.GetEnd(), nil, 0)
	if err != nil {
		return nil, err
	}
	for _, l := range recs.GetLocks() {
		a.countHeld(l, -1)
		a.deleteLock(l.GetResource())
	}
	for _, d := range recs.GetDedups() {
		a.deleteDedup(d.GetResource(), d.GetRequestId())
	}
	for _, w := range recs.GetWaiters() {
		if err := a.addTenantWaiters(w.GetTenant(), -1); err != nil {
			return nil, err
		}
		a.put(deleteWaiter{resource: w.GetResource(), seq: w.GetSeq()})
	}
	for _, q := range recs.GetQuotas() {
		a.put(deleteQuota{key: q.GetKey()})
	}
	for _, r := range recs.GetReservations() {
		a.put(deleteReservation{key: r.GetKey(), id: r.GetReservationId()})
	}
	for _, p := range recs.GetPools() {
		a.put(deletePool{pool: p.GetPool()})
	}
	for _, e := range recs.GetLedger() {
		a.put(deleteLedger{pool: keyspace.Pool(e.GetKey()), seq: e.GetSeq()})
	}
	for _, u := range recs.GetReports() {
		a.put(deleteReport{key: u.GetKey(), id: u.GetReportId()})
	}
	for _, k := range recs.GetCheckpoints() {
		a.put(deleteCheckpoint{key: k.GetKey()})
	}
	a.dirtyMeta()
	a.meta.QueuedWaiters -= uint64(len(recs.GetWaiters()))
	a.meta.Range = proto.CloneOf(keep)
	a.meta.Fence = nil
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Count: uint32(RecordCount(recs))}, nil
}

func failed(reason string) *shardv1.Result {
	return &shardv1.Result{Code: shardv1.Code_CODE_FAILED_PRECONDITION, Reason: reason}
}
