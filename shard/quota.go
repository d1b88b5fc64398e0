package shard

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/keyspace"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// Quotas (DESIGN.md §1 rule 7, §4). A key is a slash path, pool first; a
// level is any prefix of it. Every level on a key's path is charged with
// the key's usage, so a level's committed and reserved include its whole
// subtree. Limits are optional per level; a key with no limit on any
// level is refused (an unknown pool is never unlimited).

// Quota key bounds.
const (
	MaxQuotaSegments     = 8
	MaxQuotaSegmentBytes = 64
	// MaxQuotaAmount bounds amounts, limits and observed usage, so sums
	// over a tree never overflow int64.
	MaxQuotaAmount = int64(1) << 50
	// MaxQuotaWeight bounds a level's fairness weight.
	MaxQuotaWeight = 1000
)

// Ledger event kinds.
const (
	LedgerSetLimit   = "SET_LIMIT"
	LedgerReserve    = "RESERVE"
	LedgerCommit     = "COMMIT"
	LedgerRelease    = "RELEASE"
	LedgerExpire     = "EXPIRE"
	LedgerCorrection = "CORRECTION"
	LedgerUnfreeze   = "UNFREEZE"
)

// ReasonRestored is QuotaOutcome.reason of a Reserve refused because its
// pool is frozen since a restore (PoolRecord.restored).
const ReasonRestored = "RESTORED"

// Refusal reasons of an exhausted Reserve.
const (
	ReasonLimit     = "LIMIT"
	ReasonFairShare = "FAIR_SHARE"
)

// CheckQuotaKey validates a quota key: 1–8 segments of 1–64 bytes of
// [A-Za-z0-9._-], joined by '/'.
func CheckQuotaKey(field, key string) error {
	segs := strings.Split(key, "/")
	if key == "" || len(segs) > MaxQuotaSegments {
		return &FieldError{field, fmt.Sprintf("must have 1 to %d segments", MaxQuotaSegments)}
	}
	for _, s := range segs {
		if len(s) == 0 || len(s) > MaxQuotaSegmentBytes {
			return &FieldError{field, fmt.Sprintf("segments must be 1 to %d bytes", MaxQuotaSegmentBytes)}
		}
		for _, c := range s {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return &FieldError{field, fmt.Sprintf("segment %q has %q; only [A-Za-z0-9._-] are allowed", s, c)}
			}
		}
	}
	return nil
}

// Levels returns the levels of key's path, root first.
func Levels(key string) []string {
	segs := strings.Split(key, "/")
	out := make([]string, len(segs))
	for i := range segs {
		out[i] = strings.Join(segs[:i+1], "/")
	}
	return out
}

// quotaTree is the state of one key's path as a command sees it: the
// level records (created empty when missing) and, for a Reserve, the
// capacity that reservations past their ttl free at each level before the
// reclaimer records them (see countExpired).
type quotaTree struct {
	levels  []*shardv1.QuotaRecord
	expired []int64 // per level: expired-pending amount
}

func (a *applier) quotaLevel(key string) (*shardv1.QuotaRecord, error) {
	if q, ok := a.quotas[key]; ok {
		return q, nil
	}
	q, err := a.r.Quota(key)
	if err != nil {
		return nil, err
	}
	if q == nil {
		q = &shardv1.QuotaRecord{Key: key, Weight: 1}
	}
	return q, nil
}

func (a *applier) setQuota(q *shardv1.QuotaRecord) {
	q.Version++
	q.UpdatedAtUnixNano = a.now
	a.quotas[q.GetKey()] = q
	a.put(putQuota{quota: q})
}

// tree loads key's path.
func (a *applier) tree(key string) (*quotaTree, error) {
	t := &quotaTree{}
	for _, l := range Levels(key) {
		q, err := a.quotaLevel(l)
		if err != nil {
			return nil, err
		}
		t.levels = append(t.levels, proto.CloneOf(q))
	}
	t.expired = make([]int64, len(t.levels))
	return t, nil
}

// countExpired fills t.expired: the capacity that reservations past their
// ttl, not yet reclaimed, hold at each level. Only a Reserve needs it
// (to treat that capacity as free); the other commands charge the levels
// by exact amounts.
func (a *applier) countExpired(t *quotaTree) error {
	exp, err := a.r.Expired(keyspace.Pool(t.levels[0].GetKey()), a.now)
	if err != nil {
		return err
	}
	for _, r := range exp {
		for i, q := range t.levels {
			if Under(r.GetKey(), q.GetKey()) {
				t.expired[i] += r.GetAmount()
			}
		}
	}
	return nil
}

// use is level i's committed plus live reserved usage.
func (t *quotaTree) use(i int) int64 {
	return t.levels[i].GetCommitted() + t.levels[i].GetReserved() - t.expired[i]
}

// charge adds reserved and committed deltas to every level of the path
// and records them.
func (a *applier) charge(t *quotaTree, reserved, committed int64) {
	for _, q := range t.levels {
		q.Reserved += reserved
		q.Committed += committed
		a.setQuota(q)
	}
}

// ledger appends an event to the key's pool ledger.
// pool returns pool's record as this command left it so far (nil if it
// has none yet).
func (a *applier) pool(pool string) (*shardv1.PoolRecord, error) {
	if p, ok := a.pools[pool]; ok {
		return p, nil
	}
	return a.r.PoolRecord(pool)
}

func (a *applier) ledger(e *shardv1.LedgerEvent) error {
	p, err := a.pool(keyspace.Pool(e.GetKey()))
	if err != nil {
		return err
	}
	if p == nil {
		p = &shardv1.PoolRecord{Pool: keyspace.Pool(e.GetKey())}
	}
	p = proto.CloneOf(p)
	p.LastSeq++
	a.setPool(p)
	e.Seq, e.AtUnixNano = p.GetLastSeq(), a.now
	a.put(putLedger{event: e})
	return nil
}

func (a *applier) setPool(p *shardv1.PoolRecord) {
	a.pools[p.GetPool()] = p
	a.put(putPool{pool: p})
}

// frozen refuses a Reserve under a pool that a restore froze (from
// VersionRestoredPools): its counters are the backup's and do not count
// what was reserved or committed after it, so granting from them could
// oversell (DESIGN.md §6 "Backup and restore").
func (a *applier) frozen(key string) (*shardv1.Result, error) {
	if a.version < VersionRestoredPools {
		return nil, nil
	}
	pool := keyspace.Pool(key)
	p, err := a.pool(pool)
	if err != nil || !p.GetRestored() {
		return nil, err
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_FAILED_PRECONDITION,
		Reason: fmt.Sprintf("pool %q is frozen since a restore: record its observed usage (ReportUsage with correct) or unfreeze it", pool),
		Quota:  &shardv1.QuotaOutcome{Level: pool, Reason: ReasonRestored}}, nil
}

// thaw clears a restored pool's freeze (the caller records why in the
// ledger); it reports whether the pool was frozen.
func (a *applier) thaw(pool string) (bool, error) {
	p, err := a.pool(pool)
	if err != nil || !p.GetRestored() {
		return false, err
	}
	p = proto.CloneOf(p)
	p.Restored = false
	a.setPool(p)
	return true, nil
}

func (a *applier) unfreezePool(c *shardv1.UnfreezePoolCmd) (*shardv1.Result, error) {
	if res := a.checkQuotaKey(c.GetPool()); res != nil {
		return res, nil
	}
	if keyspace.Pool(c.GetPool()) != c.GetPool() {
		return invalid("pool", "must be a pool: a key of one segment"), nil
	}
	thawed, err := a.thaw(c.GetPool())
	if err != nil || !thawed {
		return &shardv1.Result{Code: shardv1.Code_CODE_OK}, err
	}
	if err := a.ledger(&shardv1.LedgerEvent{Key: c.GetPool(), Kind: LedgerUnfreeze}); err != nil {
		return nil, err
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Count: 1}, nil
}

// checkQuotaKey refuses a malformed key or one this shard does not serve.
func (a *applier) checkQuotaKey(key string) *shardv1.Result {
	if err := CheckQuotaKey("key", key); err != nil {
		return invalidErr(err)
	}
	return serves(a.meta, keyspace.Hash(keyspace.Pool(key)))
}

func (a *applier) setLimit(c *shardv1.SetLimitCmd) (*shardv1.Result, error) {
	if res := a.checkQuotaKey(c.GetKey()); res != nil {
		return res, nil
	}
	if c.GetLimit() < 0 || c.GetLimit() > MaxQuotaAmount {
		return invalid("limit", fmt.Sprintf("must be within [0, %d]", MaxQuotaAmount)), nil
	}
	w := max(c.GetWeight(), 1)
	if w > MaxQuotaWeight {
		return invalid("weight", fmt.Sprintf("must be within [1, %d]", MaxQuotaWeight)), nil
	}
	q, err := a.quotaLevel(c.GetKey())
	if err != nil {
		return nil, err
	}
	if q.GetHasLimit() && q.GetLimit() == c.GetLimit() && q.GetWeight() == w {
		return &shardv1.Result{Code: shardv1.Code_CODE_OK, Quota: &shardv1.QuotaOutcome{Record: q, Replayed: true}}, nil
	}
	q = proto.CloneOf(q)
	q.HasLimit, q.Limit, q.Weight = true, c.GetLimit(), w
	a.setQuota(q)
	if err := a.ledger(&shardv1.LedgerEvent{Key: c.GetKey(), Kind: LedgerSetLimit, Limit: c.GetLimit()}); err != nil {
		return nil, err
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Quota: &shardv1.QuotaOutcome{Record: q}}, nil
}

func (a *applier) reserve(c *shardv1.ReserveCmd) (*shardv1.Result, error) {
	if res := a.checkQuotaKey(c.GetKey()); res != nil {
		return res, nil
	}
	if err := CheckName("reservation_id", c.GetReservationId(), MaxRequestIDBytes); err != nil {
		return invalidErr(err), nil
	}
	if c.GetAmount() <= 0 || c.GetAmount() > MaxQuotaAmount {
		return invalid("amount", fmt.Sprintf("must be within [1, %d]", MaxQuotaAmount)), nil
	}
	ttl := c.GetTtlNanos()
	if ttl == 0 {
		ttl = a.cfg().GetDefaultReservationTtlNanos()
	}
	if ttl < a.cfg().GetMinLeaseTtlNanos() || ttl > a.cfg().GetMaxReservationTtlNanos() {
		return invalid("ttl", fmt.Sprintf("must be within [%v, %v]", time.Duration(a.cfg().GetMinLeaseTtlNanos()), time.Duration(a.cfg().GetMaxReservationTtlNanos()))), nil
	}
	if old, err := a.reservation(c.GetKey(), c.GetReservationId()); err != nil || old != nil {
		if err != nil {
			return nil, err
		}
		if old.GetAmount() != c.GetAmount() || old.GetTtlNanos() != ttl {
			return invalid("reservation_id", "was used with another amount or ttl"), nil
		}
		return &shardv1.Result{Code: shardv1.Code_CODE_OK, Quota: &shardv1.QuotaOutcome{Reservation: old, Remaining: old.GetRemaining(), Replayed: true}}, nil
	}
	if a.version >= VersionReleaseReplay {
		// A reservation_id is unique per pool (DESIGN.md §3): one that
		// another key of the pool holds is a retry with another key, a
		// parameter. The refusal does not name that key, which may be
		// another principal's.
		keys, err := a.r.ReservationKeys(keyspace.Pool(c.GetKey()), c.GetReservationId())
		if err != nil {
			return nil, err
		}
		if len(keys) > 0 {
			return invalid("reservation_id", "was used with another key of the pool"), nil
		}
	}
	if res, err := a.frozen(c.GetKey()); res != nil || err != nil {
		return res, err
	}
	t, err := a.tree(c.GetKey())
	if err != nil {
		return nil, err
	}
	if err := a.countExpired(t); err != nil {
		return nil, err
	}
	limited := false
	remaining := MaxQuotaAmount
	for i, q := range t.levels { // root first: the first refusal names the highest level
		if !q.GetHasLimit() {
			continue
		}
		limited = true
		after := t.use(i) + c.GetAmount()
		if after > q.GetLimit() {
			return a.exhausted(t, i, ReasonLimit)
		}
		remaining = min(remaining, q.GetLimit()-after)
		// Fairness: above the threshold of this level, no limited child on
		// the path may go past its weighted share.
		if i+1 < len(t.levels) && t.levels[i+1].GetHasLimit() && after*100 > q.GetLimit()*int64(a.cfg().GetFairnessThresholdPercent()) {
			share, err := a.share(q, t.levels[i+1])
			if err != nil {
				return nil, err
			}
			// A max-min share is never above the child's own limit; where
			// it equals it, the child's own limit is what binds, and its
			// check below says so (LIMIT).
			capped := a.version >= VersionMaxMinShare && share >= t.levels[i+1].GetLimit()
			if t.use(i+1)+c.GetAmount() > share && !capped {
				return a.exhausted(t, i+1, ReasonFairShare, share)
			}
		}
	}
	if !limited {
		return failed(fmt.Sprintf("no level of %q has a limit (set one on its pool %q)", c.GetKey(), keyspace.Pool(c.GetKey()))), nil
	}
	a.charge(t, c.GetAmount(), 0)
	r := &shardv1.ReservationRecord{Key: c.GetKey(), ReservationId: c.GetReservationId(), Amount: c.GetAmount(), TtlNanos: ttl,
		ExpiresAtUnixNano: a.now + ttl, State: shardv1.ReservationState_RESERVATION_STATE_OPEN, Remaining: remaining}
	a.setReservation(r)
	if err := a.ledger(&shardv1.LedgerEvent{Key: c.GetKey(), Kind: LedgerReserve, Amount: c.GetAmount(), ReservationId: c.GetReservationId(), ExpiresAtUnixNano: r.GetExpiresAtUnixNano()}); err != nil {
		return nil, err
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Quota: &shardv1.QuotaOutcome{Reservation: r, Remaining: remaining}}, nil
}

// share is child's fair share of parent's limit among the parent's
// children that have limits. From envelope version 4 it is max-min fair
// (waterShares): no share is above its child's own limit, and what a
// capped child cannot use goes to the others by weight. Before, it was
// weight / Σ weights × parent limit, which stranded capacity: with A=10,
// A/x=2, A/y=10, x full, y's share was 5 and 3 units of A could never be
// used.
func (a *applier) share(parent, child *shardv1.QuotaRecord) (int64, error) {
	kids, err := a.r.QuotaChildren(parent.GetKey())
	if err != nil {
		return 0, err
	}
	var limited []*shardv1.QuotaRecord
	for _, k := range kids {
		if k.GetKey() == child.GetKey() {
			k = child
		}
		if k.GetHasLimit() {
			limited = append(limited, k)
		}
	}
	if len(limited) == 0 {
		return parent.GetLimit(), nil
	}
	if a.version < VersionMaxMinShare {
		var total int64
		for _, k := range limited {
			total += int64(max(k.GetWeight(), 1))
		}
		return parent.GetLimit() * int64(max(child.GetWeight(), 1)) / total, nil
	}
	slices.SortFunc(limited, func(x, y *shardv1.QuotaRecord) int { return strings.Compare(x.GetKey(), y.GetKey()) })
	shares := waterShares(parent.GetLimit(), limited)
	for i, k := range limited {
		if k.GetKey() == child.GetKey() {
			return shares[i], nil
		}
	}
	return parent.GetLimit(), nil
}

// waterShares divides limit among kids (sorted by key; each with a limit)
// max-min fairly: kid i gets min(its limit, weight_i × λ), with λ chosen
// so that the shares add up to limit (or every kid gets its own limit,
// when those add up to less). Shares are whole units: each is floored,
// and the units left over go one at a time to the kids below their own
// limit, in key order. Pure integer arithmetic (128-bit products), so
// every replica computes the same shares.
//
// It fills by water level: the kids sorted by limit/weight, a kid whose
// limit is at or below its weighted part of what is left is capped at
// its limit and leaves the rest to the others; the first kid that is not
// capped, and every one after it, shares what is left by weight.
func waterShares(limit int64, kids []*shardv1.QuotaRecord) []int64 {
	weight := func(i int) uint64 { return uint64(max(kids[i].GetWeight(), 1)) }
	order := make([]int, len(kids))
	var weights uint64
	for i := range kids {
		order[i] = i
		weights += weight(i)
	}
	// By limit/weight, ties in key order: l_i/w_i < l_j/w_j ⇔ l_i·w_j < l_j·w_i.
	slices.SortStableFunc(order, func(i, j int) int {
		return cmp128(mul128(uint64(max(kids[i].GetLimit(), 0)), weight(j)), mul128(uint64(max(kids[j].GetLimit(), 0)), weight(i)))
	})
	shares := make([]int64, len(kids))
	capped := make([]bool, len(kids))
	left := uint64(max(limit, 0))
	k := 0
	for ; k < len(order); k++ {
		i := order[k]
		own := uint64(max(kids[i].GetLimit(), 0))
		// Capped when own ≤ weight × left / weights.
		if cmp128(mul128(own, weights), mul128(weight(i), left)) > 0 {
			break
		}
		shares[i], capped[i] = int64(own), true
		left -= own
		weights -= weight(i)
	}
	if k == len(order) {
		return shares // every kid gets its own limit
	}
	given := uint64(0)
	for _, i := range order[k:] {
		hi, lo := bits.Mul64(weight(i), left)
		q, _ := bits.Div64(hi, lo, weights) // ≤ left: weight(i) ≤ weights
		shares[i] = int64(q)
		given += q
	}
	// Fewer units are left over than kids share them (each floor loses
	// less than one), and each of those kids is below its own limit.
	for i := 0; given < left && i < len(kids); i++ {
		if !capped[i] {
			shares[i]++
			given++
		}
	}
	return shares
}

// mul128 is the 128-bit product of a and b.
func mul128(a, b uint64) [2]uint64 {
	hi, lo := bits.Mul64(a, b)
	return [2]uint64{hi, lo}
}

// cmp128 compares two 128-bit numbers.
func cmp128(x, y [2]uint64) int {
	if c := cmp.Compare(x[0], y[0]); c != 0 {
		return c
	}
	return cmp.Compare(x[1], y[1])
}

// exhausted refuses a Reserve at level i: remaining room there (under cap,
// the fair share, when given) and the time to its nearest expiry.
func (a *applier) exhausted(t *quotaTree, i int, reason string, cap ...int64) (*shardv1.Result, error) {
	q := t.levels[i]
	limit := q.GetLimit()
	if len(cap) > 0 {
		limit = cap[0]
	}
	next, err := a.r.NextExpiry(q.GetKey(), a.now)
	if err != nil {
		return nil, err
	}
	out := &shardv1.QuotaOutcome{Level: q.GetKey(), Reason: reason, Remaining: max(0, limit-t.use(i))}
	if next != 0 {
		out.RetryAfterNanos = next - a.now
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_RESOURCE_EXHAUSTED, Field: "amount",
		Reason: fmt.Sprintf("%s: %s has %d left", reason, q.GetKey(), out.GetRemaining()), Quota: out}, nil
}

// reservation reads a reservation through this command's own writes.
func (a *applier) reservation(key, id string) (*shardv1.ReservationRecord, error) {
	if r, ok := a.reservations[key+"\x00"+id]; ok {
		return r, nil
	}
	return a.r.Reservation(key, id)
}

func (a *applier) setReservation(r *shardv1.ReservationRecord) {
	a.reservations[r.GetKey()+"\x00"+r.GetReservationId()] = r
	a.put(putReservation{reservation: r})
}

// reservationFor finds the reservation of a Commit or Release.
func (a *applier) reservationFor(key, id string) (*shardv1.ReservationRecord, *shardv1.Result, error) {
	if res := a.checkQuotaKey(key); res != nil {
		return nil, res, nil
	}
	if err := CheckName("reservation_id", id, MaxRequestIDBytes); err != nil {
		return nil, invalidErr(err), nil
	}
	r, err := a.reservation(key, id)
	return r, nil, err
}

// live reports whether r is open and not past its ttl.
func (a *applier) live(r *shardv1.ReservationRecord) bool {
	return r.GetState() == shardv1.ReservationState_RESERVATION_STATE_OPEN && a.now < r.GetExpiresAtUnixNano()
}

func (a *applier) commit(c *shardv1.CommitCmd) (*shardv1.Result, error) {
	r, res, err := a.reservationFor(c.GetKey(), c.GetReservationId())
	if res != nil || err != nil {
		return res, err
	}
	switch {
	case r.GetState() == shardv1.ReservationState_RESERVATION_STATE_COMMITTED:
		return &shardv1.Result{Code: shardv1.Code_CODE_OK, Quota: &shardv1.QuotaOutcome{Reservation: r, Replayed: true}}, nil
	case r == nil:
		return failed("no such reservation (refused, or forgotten after the dedup window)"), nil
	case !a.live(r):
		return failed("the reservation is released or expired; reserve again"), nil
	case c.GetAmount() < 0 || c.GetAmount() > r.GetAmount():
		return invalid("amount", fmt.Sprintf("must be within [0, %d] (0: all of the reservation)", r.GetAmount())), nil
	}
	amount := c.GetAmount()
	if amount == 0 {
		amount = r.GetAmount()
	}
	t, err := a.tree(c.GetKey())
	if err != nil {
		return nil, err
	}
	a.charge(t, -r.GetAmount(), amount)
	r = proto.CloneOf(r)
	r.State, r.Committed, r.EndedAtUnixNano = shardv1.ReservationState_RESERVATION_STATE_COMMITTED, amount, a.now
	a.setReservation(r)
	if err := a.ledger(&shardv1.LedgerEvent{Key: c.GetKey(), Kind: LedgerCommit, Amount: amount, Returned: r.GetAmount() - amount, ReservationId: r.GetReservationId()}); err != nil {
		return nil, err
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Quota: &shardv1.QuotaOutcome{Reservation: r}}, nil
}

func (a *applier) releaseReservation(c *shardv1.ReleaseReservationCmd) (*shardv1.Result, error) {
	r, res, err := a.reservationFor(c.GetKey(), c.GetReservationId())
	if res != nil || err != nil {
		return res, err
	}
	if r.GetState() == shardv1.ReservationState_RESERVATION_STATE_COMMITTED {
		return failed("the reservation is committed: its usage is not returned by a release"), nil
	}
	if !a.live(r) {
		return &shardv1.Result{Code: shardv1.Code_CODE_OK, Quota: &shardv1.QuotaOutcome{Reservation: r}}, nil
	}
	t, err := a.tree(c.GetKey())
	if err != nil {
		return nil, err
	}
	a.charge(t, -r.GetAmount(), 0)
	r = proto.CloneOf(r)
	r.State, r.EndedAtUnixNano = shardv1.ReservationState_RESERVATION_STATE_RELEASED, a.now
	a.setReservation(r)
	if err := a.ledger(&shardv1.LedgerEvent{Key: c.GetKey(), Kind: LedgerRelease, Amount: r.GetAmount(), ReservationId: r.GetReservationId()}); err != nil {
		return nil, err
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Released: true, Quota: &shardv1.QuotaOutcome{Reservation: r}}, nil
}

// reclaim records the expiry of reservations the leader saw expired.
func (a *applier) reclaim(c *shardv1.ReclaimCmd) (*shardv1.Result, error) {
	var n uint32
	for _, it := range c.GetItems() {
		if CheckQuotaKey("key", it.GetKey()) != nil || serves(a.meta, keyspace.Hash(keyspace.Pool(it.GetKey()))) != nil {
			continue
		}
		r, err := a.reservation(it.GetKey(), it.GetReservationId())
		if err != nil {
			return nil, err
		}
		if r.GetState() != shardv1.ReservationState_RESERVATION_STATE_OPEN || r.GetExpiresAtUnixNano() != it.GetExpiresAtUnixNano() || a.now < r.GetExpiresAtUnixNano() {
			continue
		}
		t, err := a.tree(r.GetKey())
		if err != nil {
			return nil, err
		}
		a.charge(t, -r.GetAmount(), 0)
		r = proto.CloneOf(r)
		r.State, r.EndedAtUnixNano = shardv1.ReservationState_RESERVATION_STATE_EXPIRED, a.now
		a.setReservation(r)
		if err := a.ledger(&shardv1.LedgerEvent{Key: r.GetKey(), Kind: LedgerExpire, Amount: r.GetAmount(), ReservationId: r.GetReservationId()}); err != nil {
			return nil, err
		}
		n++
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Count: n}, nil
}

func (a *applier) reportUsage(c *shardv1.ReportUsageCmd) (*shardv1.Result, error) {
	if res := a.checkQuotaKey(c.GetKey()); res != nil {
		return res, nil
	}
	if c.GetObserved() < 0 || c.GetObserved() > MaxQuotaAmount {
		return invalid("observed", fmt.Sprintf("must be within [0, %d]", MaxQuotaAmount)), nil
	}
	seqd := a.version >= VersionObservedSeq && c.ObservedSeq != nil
	if a.version >= VersionObservedSeq && c.GetCorrect() && !seqd {
		return invalid("observed_seq", "is required with correct: pass the ledger_seq of the Query the observation corresponds to"), nil
	}
	if c.GetCorrect() {
		if err := CheckName("report_id", c.GetReportId(), MaxRequestIDBytes); err != nil {
			return invalidErr(err), nil
		}
		old, err := a.r.Report(c.GetKey(), c.GetReportId())
		if err != nil {
			return nil, err
		}
		if old != nil {
			if old.GetObserved() != c.GetObserved() {
				return invalid("report_id", "was used with another observed value"), nil
			}
			if seqd && old.GetObservedSeq() != c.GetObservedSeq() {
				return invalid("report_id", "was used with another observed_seq"), nil
			}
			q, err := a.quotaLevel(c.GetKey())
			if err != nil {
				return nil, err
			}
			return &shardv1.Result{Code: shardv1.Code_CODE_OK, Quota: &shardv1.QuotaOutcome{Drift: old.GetDrift(), Record: q, Replayed: true}}, nil
		}
	}
	t, err := a.tree(c.GetKey())
	if err != nil {
		return nil, err
	}
	leaf := t.levels[len(t.levels)-1]
	drift := c.GetObserved() - leaf.GetCommitted()
	if seqd {
		since, res, err := a.committedSince(c.GetKey(), c.GetObservedSeq())
		if err != nil || res != nil {
			return res, err
		}
		// Against what was observed: the commits and corrections recorded
		// after observed_seq are kept.
		drift += since
	}
	if !c.GetCorrect() {
		return &shardv1.Result{Code: shardv1.Code_CODE_OK, Quota: &shardv1.QuotaOutcome{Drift: drift, Record: leaf}}, nil
	}
	limited := false
	for _, q := range t.levels {
		limited = limited || q.GetHasLimit()
	}
	if !limited {
		return failed(fmt.Sprintf("no level of %q has a limit: an unknown pool takes no corrections", c.GetKey())), nil
	}
	// observed is the level's whole usage, its children's included; the
	// correction changes only the level's own part, which cannot go below
	// zero, so every level still counts exactly its subtree.
	kids, err := a.r.QuotaChildren(c.GetKey())
	if err != nil {
		return nil, err
	}
	var below int64
	for _, k := range kids {
		below += k.GetCommitted()
	}
	if c.GetObserved() < below {
		return invalid("observed", fmt.Sprintf("%d is below the %d its sub-levels have committed; correct them first", c.GetObserved(), below)), nil
	}
	// The correction moves committed usage by the drift on every level of
	// the path. It may leave a level above its limit (DESIGN.md rule 7);
	// nothing new is reserved there until it fits.
	a.charge(t, 0, drift)
	report := &shardv1.UsageReport{Key: c.GetKey(), ReportId: c.GetReportId(), Observed: c.GetObserved(), Drift: drift}
	if seqd {
		report.ObservedSeq = c.ObservedSeq
	}
	a.put(putReport{report: report})
	// Observed usage of the whole pool is what a restored pool waits for.
	if a.version >= VersionRestoredPools && keyspace.Pool(c.GetKey()) == c.GetKey() {
		if _, err := a.thaw(c.GetKey()); err != nil {
			return nil, err
		}
	}
	if err := a.ledger(&shardv1.LedgerEvent{Key: c.GetKey(), Kind: LedgerCorrection, Amount: drift, ReportId: c.GetReportId()}); err != nil {
		return nil, err
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Quota: &shardv1.QuotaOutcome{Drift: drift, Record: t.levels[len(t.levels)-1]}}, nil
}

// maxReconcileEvents bounds the ledger events a ReportUsage with
// observed_seq reads (one Raft entry's work): an observation older than
// that many events of its pool is refused.
const maxReconcileEvents = 100_000

// committedSince returns what the COMMIT and CORRECTION events of key's
// subtree recorded after seq added to its committed usage. A seq ahead of
// the ledger is invalid; one whose later events were compacted away, or
// more than maxReconcileEvents behind, is failed_precondition naming the
// oldest usable sequence.
func (a *applier) committedSince(key string, seq uint64) (int64, *shardv1.Result, error) {
	pool := keyspace.Pool(key)
	rec, err := a.pool(pool) // this command's own writes first
	if err != nil {
		return 0, nil, err
	}
	last := rec.GetLastSeq()
	if seq > last {
		return 0, invalid("observed_seq", fmt.Sprintf("%d is ahead of pool %q's ledger (last sequence %d)", seq, pool, last)), nil
	}
	first, err := a.r.LedgerFrom(pool, 0, 1)
	if err != nil {
		return 0, nil, err
	}
	oldest := last // with no event kept, only the last sequence is usable
	if len(first) > 0 {
		oldest = first[0].GetSeq() - 1
	}
	if seq < oldest || last-seq > maxReconcileEvents {
		oldest = max(oldest, last-min(last, maxReconcileEvents))
		return 0, failed(fmt.Sprintf("observed_seq %d is older than the ledger keeps for pool %q: the oldest usable is %d; query again and observe anew", seq, pool, oldest)), nil
	}
	var since int64
	for from := seq + 1; from <= last; {
		events, err := a.r.LedgerFrom(pool, from, 1000)
		if err != nil {
			return 0, nil, err
		}
		if len(events) == 0 {
			break
		}
		for _, e := range events {
			if (e.GetKind() == LedgerCommit || e.GetKind() == LedgerCorrection) && (e.GetKey() == key || Under(e.GetKey(), key)) {
				since += e.GetAmount()
			}
		}
		from = events[len(events)-1].GetSeq() + 1
	}
	return since, nil, nil
}

// maxCompact bounds the ledger events one CompactLedgerCmd folds.
const maxCompact = 1000

// compactLedger folds old ledger events into per-key checkpoints: for
// each pool, the events up to through_seq that are older than the
// retention, from the oldest on; then deletes them. Replaying the
// checkpoints and the remaining events gives the same totals.
func (a *applier) compactLedger(c *shardv1.CompactLedgerCmd) (*shardv1.Result, error) {
	keep := a.cfg().GetLedgerRetentionNanos()
	var n uint32
	if keep == 0 {
		return &shardv1.Result{Code: shardv1.Code_CODE_OK}, nil
	}
	for _, it := range c.GetItems() {
		if CheckQuotaKey("pool", it.GetPool()) != nil || serves(a.meta, keyspace.Hash(it.GetPool())) != nil {
			continue
		}
		events, err := a.r.LedgerFrom(it.GetPool(), 0, maxCompact-int(n))
		if err != nil {
			return nil, err
		}
		cps := map[string]*shardv1.LedgerCheckpoint{}
		for _, e := range events {
			if e.GetSeq() > it.GetThroughSeq() || e.GetAtUnixNano() > a.now-keep {
				break
			}
			cp, ok := cps[e.GetKey()]
			if !ok {
				if cp, err = a.r.Checkpoint(e.GetKey()); err != nil {
					return nil, err
				}
				if cp == nil {
					cp = &shardv1.LedgerCheckpoint{Key: e.GetKey()}
				}
				cp = proto.CloneOf(cp)
				cps[e.GetKey()] = cp
			}
			cp.ThroughSeq = e.GetSeq()
			switch e.GetKind() {
			case LedgerSetLimit:
				cp.HasLimit, cp.Limit = true, e.GetLimit()
			case LedgerCommit, LedgerCorrection:
				cp.Committed += e.GetAmount()
			}
			a.put(deleteLedger{pool: it.GetPool(), seq: e.GetSeq()})
			n++
		}
		for _, cp := range cps {
			a.put(putCheckpoint{checkpoint: cp})
		}
	}
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Count: n}, nil
}
