package shard

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"

	"pgregory.net/rapid"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// The reference model: the lock rules of DESIGN.md §1 written as plainly
// as possible, with no storage, indexes or encoding.

type mLease struct {
	id        []byte
	reqID     string
	holder    string
	token     uint64
	ttl       int64
	expiresAt int64
}

type mLock struct {
	cur       *mLease // nil when free
	lastToken uint64
	endedAt   int64
}

type mDedup struct {
	leaseID []byte
	ttl     int64
	holder  string
	endedAt int64
}

type dedupID struct{ resource, reqID string }

type model struct {
	now      int64 // the state machine's time: max of all command times
	skew     int64
	window   int64
	revision uint64
	locks    map[string]*mLock
	dedup    map[dedupID]*mDedup
}

const (
	second   = int64(time.Second)
	testSkew = 500 * int64(time.Millisecond)
)

func (m *model) tick(now int64) { m.now = max(m.now, now) }

func (m *model) validLease(r string) *mLease {
	l := m.locks[r]
	if l == nil || l.cur == nil || m.now >= l.cur.expiresAt {
		return nil
	}
	return l.cur
}

func (m *model) end(r string) {
	l := m.locks[r]
	if d := m.dedup[dedupID{r, l.cur.reqID}]; d != nil && bytes.Equal(d.leaseID, l.cur.id) {
		d.endedAt = m.now
	}
	l.cur, l.endedAt = nil, m.now
}

func (m *model) acquire(r, req string, ttl int64, holder string, id []byte) (shardv1.Code, *mLease) {
	if ttl == 0 {
		ttl = 30 * second
	}
	if d := m.dedup[dedupID{r, req}]; d != nil {
		if d.ttl != ttl || d.holder != holder {
			return shardv1.Code_CODE_INVALID_ARGUMENT, nil
		}
		if v := m.validLease(r); v != nil && bytes.Equal(v.id, d.leaseID) {
			return shardv1.Code_CODE_OK, v
		}
		return shardv1.Code_CODE_FAILED_PRECONDITION, nil
	}
	l := m.locks[r]
	if l != nil && l.cur != nil && m.now < l.cur.expiresAt+m.skew {
		return shardv1.Code_CODE_CONFLICT, l.cur
	}
	if l == nil {
		l = &mLock{}
		m.locks[r] = l
	}
	if l.cur != nil {
		m.end(r)
	}
	m.revision++
	l.cur = &mLease{id: id, reqID: req, holder: holder, token: 1<<40 | m.revision, ttl: ttl, expiresAt: m.now + ttl}
	l.lastToken = l.cur.token
	m.dedup[dedupID{r, req}] = &mDedup{leaseID: id, ttl: ttl, holder: holder}
	return shardv1.Code_CODE_OK, l.cur
}

func (m *model) renew(r string, id []byte) shardv1.Code {
	v := m.validLease(r)
	if v == nil || !bytes.Equal(v.id, id) {
		return shardv1.Code_CODE_FAILED_PRECONDITION
	}
	v.expiresAt = m.now + v.ttl
	return shardv1.Code_CODE_OK
}

func (m *model) release(r string, id []byte) bool {
	if v := m.validLease(r); v == nil || !bytes.Equal(v.id, id) {
		return false
	}
	m.end(r)
	return true
}

func (m *model) expire(items []*shardv1.ExpireItem) uint32 {
	var n uint32
	for _, it := range items {
		l := m.locks[it.GetResource()]
		if l == nil || l.cur == nil || !bytes.Equal(l.cur.id, it.GetLeaseId()) ||
			l.cur.expiresAt != it.GetExpiresAtUnixNano() || m.now < l.cur.expiresAt+m.skew {
			continue
		}
		m.end(it.GetResource())
		n++
	}
	return n
}

func (m *model) forget(c *shardv1.ForgetCmd) uint32 {
	var n uint32
	for _, ref := range c.GetDedup() {
		id := dedupID{ref.GetResource(), ref.GetRequestId()}
		if d := m.dedup[id]; d != nil && d.endedAt != 0 && m.now >= d.endedAt+m.window {
			delete(m.dedup, id)
			n++
		}
	}
	for _, r := range c.GetIdleLocks() {
		if l := m.locks[r]; l != nil && l.cur == nil && m.now >= l.endedAt+m.window {
			delete(m.locks, r)
			n++
		}
	}
	return n
}

// TestApplyMatchesModel runs random command sequences against a replica
// and the reference model, from proposers whose clocks differ by up to
// max_clock_skew and change with every leader change, and checks the
// safety rules on every step.
func TestApplyMatchesModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp("", "warden-model-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		rep := openReplica(rt, dir)
		defer func() { rep.sm.Close() }()
		newModelRun(rt, rep).run()
	})
}

type issuedLease struct {
	resource, reqID, holder string
	ttl                     int64
	lease                   *mLease // as granted
	expiresSeen             int64   // an expiry some leader once saw
}

type modelRun struct {
	t   *rapid.T
	rep *replica
	m   *model
	// trueNow is real time; a proposer stamps trueNow+offset, and leaders'
	// offsets lie within ±skew/2 so any two differ by at most skew.
	trueNow   int64
	offset    int64
	nextID    uint64
	issued    []*issuedLease
	maxToken  map[string]uint64 // every token ever granted, never forgotten
	resources []string
}

func newModelRun(t *rapid.T, rep *replica) *modelRun {
	start := int64(1_700_000_000) * second
	r := &modelRun{
		t: t, rep: rep, trueNow: start,
		m:         &model{skew: testSkew, window: 5 * second, locks: map[string]*mLock{}, dedup: map[dedupID]*mDedup{}},
		maxToken:  map[string]uint64{},
		resources: []string{"a", "b", "c/d", "é"},
	}
	w := r.m.window
	res := r.propose(setConfigCmd(&shardv1.SetConfigCmd{DedupWindowNanos: &w}))
	if res.GetCode() != shardv1.Code_CODE_OK {
		t.Fatalf("set config: %v", res)
	}
	return r
}

func (r *modelRun) stamp() int64 { return r.trueNow + r.offset }

func (r *modelRun) propose(env *shardv1.Envelope) *shardv1.Result {
	now := r.stamp()
	r.m.tick(now)
	return r.rep.propose(now, env)
}

func (r *modelRun) freshLeaseID() []byte {
	r.nextID++
	return binary.BigEndian.AppendUint64(make([]byte, 8), r.nextID)
}

func (r *modelRun) run() {
	r.t.Repeat(map[string]func(*rapid.T){
		"acquire":      r.acquire,
		"retry":        r.retry,
		"retryChanged": r.retryChanged,
		"renew":        r.renew,
		"release":      r.release,
		"expireScan":   r.expireScan,
		"expireStale":  r.expireStale,
		"forgetScan":   r.forgetScan,
		"advance":      r.advance,
		"leaderChange": r.leaderChange,
		"setConfig":    r.setConfig,
		"":             r.check,
	})
}

func (r *modelRun) acquire(t *rapid.T) {
	res := rapid.SampledFrom(r.resources).Draw(t, "resource")
	ttl := rapid.SampledFrom([]int64{0, second, 2 * second, 5 * second}).Draw(t, "ttl")
	holder := rapid.SampledFrom([]string{"", "w1", "w2"}).Draw(t, "holder")
	req := fmt.Sprintf("q%d", len(r.issued))
	r.doAcquire(t, res, req, ttl, holder)
}

func (r *modelRun) doAcquire(t *rapid.T, res, req string, ttl int64, holder string) {
	id := r.freshLeaseID()
	r.m.tick(r.stamp())
	prev := r.m.validLease(res)
	prevLock := r.m.locks[res]
	var prevLease *mLease
	if prevLock != nil {
		prevLease = prevLock.cur
	}
	got := r.propose(acquireCmd(res, req, ttl, holder, id))
	wantCode, want := r.m.acquire(res, req, ttl, holder, id)
	if got.GetCode() != wantCode {
		t.Fatalf("acquire %s %s: code %v, model %v (%v)", res, req, got.GetCode(), wantCode, got.GetReason())
	}
	if wantCode != shardv1.Code_CODE_OK {
		return
	}
	if got.GetLease().GetFencingToken() != want.token || got.GetLease().GetExpiresAtUnixNano() != want.expiresAt ||
		!bytes.Equal(got.GetLease().GetLeaseId(), want.id) {
		t.Fatalf("acquire %s %s: lease %v, model %+v", res, req, got.GetLease(), want)
	}
	if got.GetReplayed() {
		return
	}
	// Rule 1: at most one valid lease — a fresh grant only when none was valid.
	if prev != nil {
		t.Fatalf("granted %s while lease %x was valid", res, prev.id)
	}
	// Rule 6: grantable to another only once the granting clock passed the
	// old expiry + skew, which in real time is after the old expiry.
	if prevLease != nil && r.trueNow <= prevLease.expiresAt {
		t.Fatalf("granted %s at real time %d, before the old lease's expiry %d", res, r.trueNow, prevLease.expiresAt)
	}
	// Rule 2: tokens strictly increase per resource, forever.
	if tok := got.GetLease().GetFencingToken(); tok <= r.maxToken[res] || tok >= 1<<63 {
		t.Fatalf("token %d for %s after %d", tok, res, r.maxToken[res])
	}
	r.maxToken[res] = got.GetLease().GetFencingToken()
	r.issued = append(r.issued, &issuedLease{resource: res, reqID: req, holder: holder, ttl: ttl, lease: want, expiresSeen: want.expiresAt})
}

func (r *modelRun) pickIssued(t *rapid.T) *issuedLease {
	if len(r.issued) == 0 {
		t.Skip("nothing issued yet")
	}
	return rapid.SampledFrom(r.issued).Draw(t, "lease")
}

func (r *modelRun) retry(t *rapid.T) {
	il := r.pickIssued(t)
	r.doAcquire(t, il.resource, il.reqID, il.ttl, il.holder)
}

// retryChanged reuses a request id with another holder: refused while
// the id is remembered, a fresh request once it has been forgotten.
func (r *modelRun) retryChanged(t *rapid.T) {
	il := r.pickIssued(t)
	r.doAcquire(t, il.resource, il.reqID, il.ttl, il.holder+"x")
}

func (r *modelRun) renew(t *rapid.T) {
	il := r.pickIssued(t)
	wasValid := r.m.validLease(il.resource)
	got := r.propose(renewCmd(il.resource, il.lease.id))
	want := r.m.renew(il.resource, il.lease.id)
	if got.GetCode() != want {
		t.Fatalf("renew %s: code %v, model %v", il.resource, got.GetCode(), want)
	}
	// Rule 3: only the current lease renews.
	if want == shardv1.Code_CODE_OK {
		if wasValid == nil || !bytes.Equal(wasValid.id, il.lease.id) {
			t.Fatalf("renewed a lease that was not current")
		}
		if got.GetLease().GetExpiresAtUnixNano() != r.m.locks[il.resource].cur.expiresAt {
			t.Fatalf("renew expiry %d, model %d", got.GetLease().GetExpiresAtUnixNano(), r.m.locks[il.resource].cur.expiresAt)
		}
		il.expiresSeen = r.m.locks[il.resource].cur.expiresAt
	}
}

func (r *modelRun) release(t *rapid.T) {
	il := r.pickIssued(t)
	got := r.propose(releaseCmd(il.resource, il.lease.id))
	want := r.m.release(il.resource, il.lease.id)
	if got.GetCode() != shardv1.Code_CODE_OK || got.GetReleased() != want {
		t.Fatalf("release %s: %v, model released=%v", il.resource, got, want)
	}
}

// expireScan is the leader's path: scan for expired leases, propose them.
func (r *modelRun) expireScan(t *rapid.T) {
	q := r.rep.query(r.stamp(), &shardv1.Query{Query: &shardv1.Query_Expired{Expired: &shardv1.ScanQuery{Limit: 100}}})
	items := q.GetExpire().GetItems()
	// The scan finds exactly the held leases past expiry + skew.
	want := 0
	now := max(r.m.now, r.stamp())
	for _, l := range r.m.locks {
		if l.cur != nil && now >= l.cur.expiresAt+r.m.skew {
			want++
		}
	}
	if len(items) != want {
		t.Fatalf("expiry scan found %d, model %d", len(items), want)
	}
	got := r.propose(expireCmd(items...))
	if n := r.m.expire(items); got.GetCount() != n {
		t.Fatalf("expire: %d, model %d", got.GetCount(), n)
	}
}

// expireStale proposes an expiry from an old view: a lease id that may have
// been replaced, or an expiry that a renewal has since moved.
func (r *modelRun) expireStale(t *rapid.T) {
	il := r.pickIssued(t)
	exp := rapid.SampledFrom([]int64{il.lease.expiresAt, il.expiresSeen, il.expiresSeen - second}).Draw(t, "seen")
	item := &shardv1.ExpireItem{Resource: il.resource, LeaseId: il.lease.id, ExpiresAtUnixNano: exp}
	got := r.propose(expireCmd(item))
	if n := r.m.expire([]*shardv1.ExpireItem{item}); got.GetCount() != n {
		t.Fatalf("stale expire: %d, model %d", got.GetCount(), n)
	}
}

func (r *modelRun) forgetScan(t *rapid.T) {
	q := r.rep.query(r.stamp(), &shardv1.Query{Query: &shardv1.Query_Forgettable{Forgettable: &shardv1.ScanQuery{Limit: 1000}}})
	c := q.GetForget()
	got := r.propose(forgetCmd(c))
	if n := r.m.forget(c); got.GetCount() != n {
		t.Fatalf("forget: %d, model %d", got.GetCount(), n)
	}
	// Everything the model could forget was found and forgotten.
	for id, d := range r.m.dedup {
		if d.endedAt != 0 && r.m.now >= d.endedAt+r.m.window {
			t.Fatalf("dedup %v is past its window but was not found", id)
		}
	}
}

func (r *modelRun) advance(t *rapid.T) {
	r.trueNow += rapid.Int64Range(0, 3*second).Draw(t, "advance")
}

func (r *modelRun) leaderChange(t *rapid.T) {
	r.offset = rapid.Int64Range(-r.m.skew/2, r.m.skew/2).Draw(t, "offset")
}

// setConfig changes the replicated skew bound and dedup window; leaders'
// clocks are then kept within the new bound.
func (r *modelRun) setConfig(t *rapid.T) {
	skew := rapid.SampledFrom([]int64{0, testSkew / 2, testSkew, 2 * testSkew}).Draw(t, "skew")
	window := rapid.SampledFrom([]int64{0, second, 5 * second}).Draw(t, "window")
	if res := r.propose(setConfigCmd(&shardv1.SetConfigCmd{MaxClockSkewNanos: &skew, DedupWindowNanos: &window})); res.GetCode() != shardv1.Code_CODE_OK {
		t.Fatalf("set config: %v", res)
	}
	r.m.skew, r.m.window = skew, window
	r.offset = max(-skew/2, min(skew/2, r.offset))
}

// check compares every resource's lock as Describe reads it with the model.
func (r *modelRun) check(t *rapid.T) {
	for _, res := range r.resources {
		q := r.rep.query(0, &shardv1.Query{Query: &shardv1.Query_Describe{Describe: &shardv1.DescribeQuery{Resource: res}}})
		l, ml := q.GetLock(), r.m.locks[res]
		switch {
		case ml == nil && l != nil:
			t.Fatalf("%s: replica has %v, model none", res, l)
		case ml == nil:
		case l == nil:
			t.Fatalf("%s: replica has no record, model %+v", res, ml)
		case l.GetHeld() != (ml.cur != nil) || l.GetFencingToken() != ml.lastToken:
			t.Fatalf("%s: replica %v, model %+v", res, l, ml)
		case ml.cur != nil && l.GetExpiresAtUnixNano() != ml.cur.expiresAt:
			t.Fatalf("%s: expiry %d, model %d", res, l.GetExpiresAtUnixNano(), ml.cur.expiresAt)
		}
	}
}
