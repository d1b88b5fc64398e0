package shard

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strings"
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

type mWaiter struct {
	reqID    string
	id       []byte
	ttl      int64
	holder   string
	deadline int64
	seq      uint64
}

type mLock struct {
	cur       *mLease // nil when free
	lastToken uint64
	endedAt   int64
	queue     []*mWaiter // in enqueue order
	lastSeq   uint64
}

type mDedup struct {
	leaseID []byte
	ttl     int64
	holder  string
	endedAt int64
	waiting bool
	until   int64
	attempt []byte // the latest attempt's lease id
}

type dedupID struct{ resource, reqID string }

type model struct {
	now      int64 // the state machine's time: max of all command times
	skew     int64
	window   int64
	revision uint64
	locks    map[string]*mLock
	dedup    map[dedupID]*mDedup
	events   []string // grants and drops of the current command
}

const (
	second   = int64(time.Second)
	testSkew = 500 * int64(time.Millisecond)
)

func (m *model) tick(now int64) { m.now = max(m.now, now); m.events = nil }

func (m *model) validLease(r string) *mLease {
	l := m.locks[r]
	if l == nil || l.cur == nil || m.now >= l.cur.expiresAt {
		return nil
	}
	return l.cur
}

// end ends the current lease, then hands the lock to the queue's head,
// dropping waiters past their deadline on the way.
func (m *model) end(r string) {
	l := m.locks[r]
	if d := m.dedup[dedupID{r, l.cur.reqID}]; d != nil && bytes.Equal(d.leaseID, l.cur.id) {
		d.endedAt = m.now
	}
	l.cur, l.endedAt = nil, m.now
	for len(l.queue) > 0 {
		w := l.queue[0]
		l.queue = l.queue[1:]
		attempt := m.dedup[dedupID{r, w.reqID}].attempt
		delete(m.dedup, dedupID{r, w.reqID})
		if m.now >= w.deadline {
			m.events = append(m.events, "dropped:"+w.reqID)
			continue
		}
		g := m.grant(r, w.reqID, w.ttl, w.holder, w.id)
		m.dedup[dedupID{r, w.reqID}].attempt = attempt // the request's latest attempt
		m.events = append(m.events, fmt.Sprintf("granted:%s:%d:%x", w.reqID, g.token, attempt))
		return
	}
}

func (m *model) grant(r, req string, ttl int64, holder string, id []byte) *mLease {
	l := m.locks[r]
	if l == nil {
		l = &mLock{}
		m.locks[r] = l
	}
	m.revision++
	l.cur = &mLease{id: id, reqID: req, holder: holder, token: 1<<40 | m.revision, ttl: ttl, expiresAt: m.now + ttl}
	l.lastToken = l.cur.token
	m.dedup[dedupID{r, req}] = &mDedup{leaseID: id, ttl: ttl, holder: holder, attempt: id}
	return l.cur
}

func (m *model) acquire(r, req string, ttl int64, holder string, id []byte, wait int64) (shardv1.Code, *mLease) {
	if ttl == 0 {
		ttl = 30 * second
	}
	if d := m.dedup[dedupID{r, req}]; d != nil {
		switch {
		case d.ttl != ttl || d.holder != holder:
			return shardv1.Code_CODE_INVALID_ARGUMENT, nil
		case d.waiting:
			d.attempt = id
			return shardv1.Code_CODE_QUEUED, nil
		}
		if v := m.validLease(r); v != nil && bytes.Equal(v.id, d.leaseID) {
			d.attempt = id
			return shardv1.Code_CODE_OK, v
		}
		return shardv1.Code_CODE_FAILED_PRECONDITION, nil
	}
	l := m.locks[r]
	if l != nil && l.cur != nil && m.now >= l.cur.expiresAt+m.skew {
		m.end(r) // over but not reaped: the queue goes first
	}
	if l != nil && l.cur != nil {
		if wait == 0 {
			return shardv1.Code_CODE_CONFLICT, l.cur
		}
		l.lastSeq++
		l.queue = append(l.queue, &mWaiter{reqID: req, id: id, ttl: ttl, holder: holder, deadline: m.now + wait, seq: l.lastSeq})
		m.dedup[dedupID{r, req}] = &mDedup{leaseID: id, ttl: ttl, holder: holder, waiting: true, until: m.now + wait, attempt: id}
		return shardv1.Code_CODE_QUEUED, nil
	}
	return shardv1.Code_CODE_OK, m.grant(r, req, ttl, holder, id)
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

// cancel abandons an attempt of a waiting request: out of the queue, or its
// lease released — unless a later attempt of the request is alive.
func (m *model) cancel(r, req string, attempt []byte) (removed, released bool) {
	d := m.dedup[dedupID{r, req}]
	switch {
	case d == nil, !bytes.Equal(d.attempt, attempt):
		return false, false
	case d.waiting:
		l := m.locks[r]
		for i, w := range l.queue {
			if w.reqID == req {
				l.queue = append(l.queue[:i:i], l.queue[i+1:]...)
			}
		}
		delete(m.dedup, dedupID{r, req})
		m.events = append(m.events, "dropped:"+req)
		return true, false
	}
	if v := m.validLease(r); v != nil && bytes.Equal(v.id, d.leaseID) {
		m.end(r)
		return false, true
	}
	return false, false
}

func (m *model) drop(items []*shardv1.WaiterRef) uint32 {
	var n uint32
	for _, it := range items {
		l := m.locks[it.GetResource()]
		for i, w := range l.queue {
			if w.seq == it.GetSeq() && w.deadline == it.GetDeadlineUnixNano() && m.now >= w.deadline {
				l.queue = append(l.queue[:i:i], l.queue[i+1:]...)
				delete(m.dedup, dedupID{it.GetResource(), w.reqID})
				m.events = append(m.events, "dropped:"+w.reqID)
				n++
				break
			}
		}
	}
	return n
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
		if l := m.locks[r]; l != nil && l.cur == nil && len(l.queue) == 0 && m.now >= l.endedAt+m.window {
			delete(m.locks, r)
			n++
		}
	}
	return n
}

// sorted orders hand-off events as a Result lists them: grants, then drops.
func sorted(evs []string) []string {
	out := slices.Clone(evs)
	rank := func(e string) int {
		if strings.HasPrefix(e, "dropped") {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(out, func(a, b string) int { return cmp.Compare(rank(a), rank(b)) })
	return out
}

// events formats a result's grants and drops like the model's.
func events(res *shardv1.Result) []string {
	var out []string
	for _, g := range res.GetGranted() {
		out = append(out, fmt.Sprintf("granted:%s:%d:%x", g.GetRequestId(), g.GetLease().GetFencingToken(), g.GetAttemptId()))
	}
	for _, d := range res.GetDropped() {
		out = append(out, "dropped:"+d.GetRequestId())
	}
	return out
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
		rep := openReplica(rt, dir, FirstShard)
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

// request is an Acquire as a client sent it, for retries and cancels.
type request struct {
	resource, reqID, holder string
	ttl, wait               int64
	id                      []byte
	attempts                *[][]byte // lease ids of every attempt, shared by retries
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
	requests  []*request
	maxToken  map[string]uint64 // every token ever granted, never forgotten
	resources []string
	// holders is the replica's lock events folded into each lock's
	// holder (its GRANTED event), as a watcher would; folded counts the
	// events read.
	holders map[string]LockEvent
	folded  int
}

func newModelRun(t *rapid.T, rep *replica) *modelRun {
	start := int64(1_700_000_000) * second
	r := &modelRun{
		t: t, rep: rep, trueNow: start,
		m:         &model{skew: testSkew, window: 5 * second, locks: map[string]*mLock{}, dedup: map[dedupID]*mDedup{}},
		maxToken:  map[string]uint64{},
		resources: []string{"a", "b", "c/d", "é"},
		holders:   map[string]LockEvent{},
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

// handOffs checks a command's grants to waiters and drops against the
// model's, and the token rule for every grant.
func (r *modelRun) handOffs(t *rapid.T, what string, got *shardv1.Result) {
	// A result lists grants before drops; the model records them in the
	// order they happened.
	if g, w := fmt.Sprint(events(got)), fmt.Sprint(sorted(r.m.events)); g != w {
		t.Fatalf("%s: hand-offs %s, model %s", what, g, w)
	}
	for _, g := range got.GetGranted() {
		for _, q := range r.requests {
			if q.resource == g.GetResource() && q.reqID == g.GetRequestId() {
				r.granted(t, q, g.GetLease().GetFencingToken(), r.m.locks[q.resource].cur)
				break // the first request with this id is the one queued
			}
		}
	}
}

// granted records a grant after checking rule 2: tokens strictly increase
// per resource, forever.
func (r *modelRun) granted(t *rapid.T, q *request, tok uint64, l *mLease) {
	if tok <= r.maxToken[q.resource] || tok >= 1<<63 {
		t.Fatalf("token %d for %s after %d", tok, q.resource, r.maxToken[q.resource])
	}
	r.maxToken[q.resource] = tok
	r.issued = append(r.issued, &issuedLease{resource: q.resource, reqID: q.reqID, holder: q.holder, ttl: q.ttl, lease: l, expiresSeen: l.expiresAt})
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
		"cancel":       r.cancel,
		"renew":        r.renew,
		"renewBatch":   r.renewBatch,
		"batch":        r.batch,
		"release":      r.release,
		"expireScan":   r.expireScan,
		"expireStale":  r.expireStale,
		"dropScan":     r.dropScan,
		"forgetScan":   r.forgetScan,
		"advance":      r.advance,
		"leaderChange": r.leaderChange,
		"setConfig":    r.setConfig,
		"":             r.check,
	})
}

func (r *modelRun) acquire(t *rapid.T) {
	q := &request{
		resource: rapid.SampledFrom(r.resources).Draw(t, "resource"),
		reqID:    fmt.Sprintf("q%d", len(r.requests)),
		ttl:      rapid.SampledFrom([]int64{0, second, 2 * second, 5 * second}).Draw(t, "ttl"),
		holder:   rapid.SampledFrom([]string{"", "w1", "w2"}).Draw(t, "holder"),
		wait:     rapid.SampledFrom([]int64{0, 0, second, 4 * second}).Draw(t, "wait"),
		id:       r.freshLeaseID(),
		attempts: new([][]byte),
	}
	r.requests = append(r.requests, q)
	r.doAcquire(t, q)
}

func (r *modelRun) doAcquire(t *rapid.T, q *request) {
	r.m.tick(r.stamp())
	*q.attempts = append(*q.attempts, q.id)
	env := acquireCmd(q.resource, q.reqID, q.ttl, q.holder, q.id)
	env.GetAcquire().WaitTimeoutNanos = q.wait
	got := r.propose(env)
	r.checkAcquire(t, "acquire", q, got)
	r.handOffs(t, "acquire", got)
}

// checkAcquire applies q's acquire to the model and checks got, the state
// machine's result for it, against the model's and against rules 1, 2
// and 6. The model's clock must already be at the command's time.
func (r *modelRun) checkAcquire(t *rapid.T, what string, q *request, got *shardv1.Result) {
	prev := r.m.validLease(q.resource)
	var prevLease *mLease
	if l := r.m.locks[q.resource]; l != nil {
		prevLease = l.cur
	}
	wantCode, want := r.m.acquire(q.resource, q.reqID, q.ttl, q.holder, q.id, q.wait)
	if got.GetCode() != wantCode {
		t.Fatalf("%s %s %s: code %v, model %v (%v)", what, q.resource, q.reqID, got.GetCode(), wantCode, got.GetReason())
	}
	if wantCode != shardv1.Code_CODE_OK {
		return
	}
	if got.GetLease().GetFencingToken() != want.token || got.GetLease().GetExpiresAtUnixNano() != want.expiresAt ||
		!bytes.Equal(got.GetLease().GetLeaseId(), want.id) {
		t.Fatalf("%s %s %s: lease %v, model %+v", what, q.resource, q.reqID, got.GetLease(), want)
	}
	if got.GetReplayed() {
		return
	}
	// Rule 1: at most one valid lease — a fresh grant only when none was valid.
	if prev != nil {
		t.Fatalf("granted %s while lease %x was valid", q.resource, prev.id)
	}
	// Rule 6: grantable to another only once the granting clock passed the
	// old expiry + skew, which in real time is after the old expiry.
	if prevLease != nil && r.trueNow <= prevLease.expiresAt {
		t.Fatalf("granted %s at real time %d, before the old lease's expiry %d", q.resource, r.trueNow, prevLease.expiresAt)
	}
	r.granted(t, q, got.GetLease().GetFencingToken(), want)
}

// batch sends a few acquires that do not wait (new requests and retries)
// and releases of issued leases in one BatchCmd. The model applies them
// one by one, and each item's result must be what its own command's would
// be, under the same rules.
func (r *modelRun) batch(t *rapid.T) {
	n := rapid.IntRange(1, 4).Draw(t, "batch")
	cmd := &shardv1.BatchCmd{}
	acquires := make([]*request, n) // nil: item i is a release
	releases := make([]*issuedLease, n)
	for i := range n {
		kind := rapid.SampledFrom([]string{"acquire", "retry", "release"}).Draw(t, "item")
		switch {
		case kind == "release" && len(r.issued) > 0:
			releases[i] = rapid.SampledFrom(r.issued).Draw(t, "lease")
			cmd.Items = append(cmd.Items, &shardv1.BatchItem{Command: &shardv1.BatchItem_Release{
				Release: &shardv1.ReleaseCmd{Resource: releases[i].resource, LeaseId: releases[i].lease.id}}})
			continue
		case kind == "retry" && len(r.requests) > 0:
			q := *rapid.SampledFrom(r.requests).Draw(t, "request")
			q.id, q.wait = r.freshLeaseID(), 0 // a retry's wait is not a parameter
			acquires[i] = &q
		default:
			acquires[i] = &request{
				resource: rapid.SampledFrom(r.resources).Draw(t, "resource"),
				reqID:    fmt.Sprintf("q%d", len(r.requests)),
				ttl:      rapid.SampledFrom([]int64{0, second, 5 * second}).Draw(t, "ttl"),
				holder:   rapid.SampledFrom([]string{"", "w1"}).Draw(t, "holder"),
				id:       r.freshLeaseID(),
				attempts: new([][]byte),
			}
			r.requests = append(r.requests, acquires[i])
		}
		q := acquires[i]
		*q.attempts = append(*q.attempts, q.id)
		cmd.Items = append(cmd.Items, &shardv1.BatchItem{Command: &shardv1.BatchItem_Acquire{
			Acquire: acquireCmd(q.resource, q.reqID, q.ttl, q.holder, q.id).GetAcquire()}})
	}
	got := r.propose(&shardv1.Envelope{Command: &shardv1.Envelope_Batch{Batch: cmd}})
	if got.GetCode() != shardv1.Code_CODE_OK || len(got.GetItems()) != n {
		t.Fatalf("batch: %v", got)
	}
	for i, item := range got.GetItems() {
		if q := acquires[i]; q != nil {
			r.checkAcquire(t, fmt.Sprintf("batch item %d acquire", i), q, item)
			continue
		}
		il := releases[i]
		if want := r.m.release(il.resource, il.lease.id); item.GetCode() != shardv1.Code_CODE_OK || item.GetReleased() != want {
			t.Fatalf("batch item %d release %s: %v, model released=%v", i, il.resource, item, want)
		}
	}
	r.handOffs(t, "batch", got)
}

func (r *modelRun) pickRequest(t *rapid.T) *request {
	if len(r.requests) == 0 {
		t.Skip("no request sent yet")
	}
	return rapid.SampledFrom(r.requests).Draw(t, "request")
}

func (r *modelRun) pickIssued(t *rapid.T) *issuedLease {
	if len(r.issued) == 0 {
		t.Skip("nothing issued yet")
	}
	return rapid.SampledFrom(r.issued).Draw(t, "lease")
}

// retry resends a request with the same id (and a fresh lease id, as a
// router would draw): it finds its lease, its place in the queue, or that
// its lease ended.
func (r *modelRun) retry(t *rapid.T) {
	q := *r.pickRequest(t)
	q.id = r.freshLeaseID()
	r.doAcquire(t, &q)
}

// retryChanged reuses a request id with another holder: refused while
// the id is remembered, a fresh request once it has been forgotten.
func (r *modelRun) retryChanged(t *rapid.T) {
	q := *r.pickRequest(t)
	q.holder += "x"
	q.id = r.freshLeaseID()
	q.attempts = new([][]byte)
	r.requests = append(r.requests, &q)
	r.doAcquire(t, &q)
}

// cancel is a waiting RPC giving up: its waiter leaves the queue, or the
// lease it was just granted is released — never left to nobody — unless a
// later attempt of the same request is alive.
func (r *modelRun) cancel(t *rapid.T) {
	q := r.pickRequest(t)
	attempt := rapid.SampledFrom(*q.attempts).Draw(t, "attempt")
	got := r.propose(&shardv1.Envelope{Command: &shardv1.Envelope_CancelWait{CancelWait: &shardv1.CancelWaitCmd{Resource: q.resource, RequestId: q.reqID, AttemptId: attempt}}})
	removed, released := r.m.cancel(q.resource, q.reqID, attempt)
	if got.GetCode() != shardv1.Code_CODE_OK || (got.GetCount() == 1) != removed || got.GetReleased() != released {
		t.Fatalf("cancel %s %s: %v, model removed=%v released=%v", q.resource, q.reqID, got, removed, released)
	}
	r.handOffs(t, "cancel", got)
}

// dropScan is the leader's path for waiters past their deadline.
func (r *modelRun) dropScan(t *rapid.T) {
	q := r.rep.query(r.stamp(), &shardv1.Query{Query: &shardv1.Query_TimedOut{TimedOut: &shardv1.ScanQuery{Limit: 100}}})
	items := q.GetDrop().GetItems()
	want := 0
	now := max(r.m.now, r.stamp())
	for _, l := range r.m.locks {
		for _, w := range l.queue {
			if now >= w.deadline {
				want++
			}
		}
	}
	if len(items) != want {
		t.Fatalf("timed-out scan found %d, model %d", len(items), want)
	}
	got := r.propose(&shardv1.Envelope{Command: &shardv1.Envelope_DropWaiters{DropWaiters: &shardv1.DropWaitersCmd{Items: items}}})
	if n := r.m.drop(items); got.GetCount() != n {
		t.Fatalf("drop: %d, model %d", got.GetCount(), n)
	}
	r.handOffs(t, "drop", got)
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

// renewBatch renews a few issued leases (the same one possibly twice) in
// one RenewBatchCmd; the model renews them one by one.
func (r *modelRun) renewBatch(t *rapid.T) {
	n := rapid.IntRange(1, 4).Draw(t, "batch")
	ils := make([]*issuedLease, n)
	cmd := &shardv1.RenewBatchCmd{}
	for i := range ils {
		ils[i] = r.pickIssued(t)
		cmd.Items = append(cmd.Items, &shardv1.RenewCmd{Resource: ils[i].resource, LeaseId: ils[i].lease.id})
	}
	got := r.propose(&shardv1.Envelope{Command: &shardv1.Envelope_RenewBatch{RenewBatch: cmd}})
	if got.GetCode() != shardv1.Code_CODE_OK || len(got.GetItems()) != n {
		t.Fatalf("renew batch: %v", got)
	}
	for i, il := range ils {
		want := r.m.renew(il.resource, il.lease.id)
		item := got.GetItems()[i]
		if item.GetCode() != want {
			t.Fatalf("renew batch item %d %s: code %v, model %v", i, il.resource, item.GetCode(), want)
		}
		if want == shardv1.Code_CODE_OK {
			if item.GetLease().GetExpiresAtUnixNano() != r.m.locks[il.resource].cur.expiresAt {
				t.Fatalf("renew batch item %d expiry %d, model %d", i, item.GetLease().GetExpiresAtUnixNano(), r.m.locks[il.resource].cur.expiresAt)
			}
			il.expiresSeen = r.m.locks[il.resource].cur.expiresAt
		}
	}
}

func (r *modelRun) release(t *rapid.T) {
	il := r.pickIssued(t)
	got := r.propose(releaseCmd(il.resource, il.lease.id))
	want := r.m.release(il.resource, il.lease.id)
	if got.GetCode() != shardv1.Code_CODE_OK || got.GetReleased() != want {
		t.Fatalf("release %s: %v, model released=%v", il.resource, got, want)
	}
	r.handOffs(t, "release", got)
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
	r.handOffs(t, "expire", got)
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
	r.handOffs(t, "stale expire", got)
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
// clocks are then kept within the new bound. A lower skew is refused.
func (r *modelRun) setConfig(t *rapid.T) {
	skew := rapid.SampledFrom([]int64{0, testSkew / 2, testSkew, 2 * testSkew}).Draw(t, "skew")
	window := rapid.SampledFrom([]int64{0, second, 5 * second}).Draw(t, "window")
	res := r.propose(setConfigCmd(&shardv1.SetConfigCmd{MaxClockSkewNanos: &skew, DedupWindowNanos: &window}))
	if skew < r.m.skew {
		// Lowering it is refused (VersionSkewRaiseOnly): time stamped
		// under the old bound may lead real time by half of it.
		if res.GetCode() != shardv1.Code_CODE_INVALID_ARGUMENT || res.GetField() != "max_clock_skew" {
			t.Fatalf("set config lowering max_clock_skew from %d to %d: %v", r.m.skew, skew, res)
		}
		return
	}
	if res.GetCode() != shardv1.Code_CODE_OK {
		t.Fatalf("set config: %v", res)
	}
	r.m.skew, r.m.window = skew, window
	r.offset = max(-skew/2, min(skew/2, r.offset))
}

// check compares every resource's lock as Describe reads it with the model,
// and the shard's counts of held locks and waiters.
func (r *modelRun) check(t *rapid.T) {
	r.checkEvents(t)
	meta := r.rep.query(0, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}}).GetMeta()
	var held, queued uint64
	for _, l := range r.m.locks {
		if l.cur != nil {
			held++
		}
		queued += uint64(len(l.queue))
	}
	if meta.GetHeldLocks() != held || meta.GetQueuedWaiters() != queued {
		t.Fatalf("shard counts %d held, %d queued; model %d, %d", meta.GetHeldLocks(), meta.GetQueuedWaiters(), held, queued)
	}
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
		case int(l.GetWaiters()) != len(ml.queue):
			t.Fatalf("%s: %d waiters, model %d", res, l.GetWaiters(), len(ml.queue))
		}
		// A free lock has no queue: every release or expiry hands it on.
		if ml != nil && ml.cur == nil && len(ml.queue) > 0 {
			t.Fatalf("%s: free with %d waiters", res, len(ml.queue))
		}
	}
}

// checkEvents folds the lock events applied since the last check into
// each lock's holder, as a watcher does, and checks the fold against the
// model: an event ends only the lease the fold holds, a grant comes only
// to a free lock, an end is EXPIRED exactly when the shard's time had
// reached the lease's expiry, and every lock's holder and token are the
// model's current lease (held until a command ends it, expired or not).
func (r *modelRun) checkEvents(t *rapid.T) {
	for _, e := range r.rep.events[r.folded:] {
		h, held := r.holders[e.Resource]
		switch e.Kind {
		case EventGranted:
			if held {
				t.Fatalf("event %+v while the fold holds %+v", e, h)
			}
			r.holders[e.Resource] = e
		case EventReleased, EventExpired:
			if !held || h.FencingToken != e.FencingToken || h.Holder != e.Holder {
				t.Fatalf("event %+v ends a lease the fold does not hold (%+v)", e, h)
			}
			if expired := e.AtUnixNano >= e.ExpiresAtUnixNano; expired != (e.Kind == EventExpired) {
				t.Fatalf("event %+v: at %d, expires %d", e, e.AtUnixNano, e.ExpiresAtUnixNano)
			}
			delete(r.holders, e.Resource)
		default:
			t.Fatalf("event %+v: no command here revokes", e)
		}
	}
	r.folded = len(r.rep.events)
	for _, res := range r.resources {
		h, held := r.holders[res]
		var cur *mLease
		if l := r.m.locks[res]; l != nil {
			cur = l.cur
		}
		switch {
		case cur == nil && held:
			t.Fatalf("%s: the events leave %+v holding it, the model no lease", res, h)
		case cur == nil:
		case !held || h.FencingToken != cur.token || h.Holder != cur.holder:
			t.Fatalf("%s: the events leave %+v holding it (held %v), the model %+v", res, h, held, cur)
		}
	}
}
