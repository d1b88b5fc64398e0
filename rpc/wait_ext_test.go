package rpc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/rpc"
	"github.com/warden-dev/warden/server"
)

// handOffLog records every hand-off result one replica applied.
type handOffLog struct {
	mu      sync.Mutex
	results []*shardv1.Result
}

func (h *handOffLog) observe(_ uint64, res *shardv1.Result) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.results = append(h.results, res)
}

// grantedBy returns the hand-off result that granted requestID.
func (h *handOffLog) grantedBy(requestID string) *shardv1.Result {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.results {
		for _, g := range r.GetGranted() {
			if g.GetRequestId() == requestID {
				return r
			}
		}
	}
	return nil
}

// Case L1: a waiter is granted when the holder's lease expires, with a
// lease clock that starts at the grant and a higher token; a cancelled
// waiter is removed and never granted.
func TestWaiterGrantedAtExpiry(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	const ttlA = 2 * time.Second
	a := c.mustAcquire("r", "a1", ttlA) // A never renews
	// C waits too, but gives up (its RPC is cancelled) before A expires.
	cctx, cancelC := context.WithCancel(context.Background())
	cdone := make(chan error, 1)
	go func() {
		_, err := c.acquireWait(cctx, "r", "c1", 5*time.Second, time.Minute)
		cdone <- err
	}()
	waitFor(t, func() bool { return c.describe("r").GetWaiters() == 1 })
	b := make(chan *wardenv1.AcquireResponse, 1)
	go func() {
		resp, err := c.acquireWait(ctx(t), "r", "b1", 5*time.Second, time.Minute)
		if err != nil {
			t.Errorf("B: %v", err)
		}
		b <- resp
	}()
	waitFor(t, func() bool { return c.describe("r").GetWaiters() == 2 })
	cancelC()
	if err := <-cdone; connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("C after cancel: %v", err)
	}
	waitFor(t, func() bool { return c.describe("r").GetWaiters() == 1 })

	got := <-b
	now := time.Now()
	exp := got.GetExpiresAt().AsTime()
	if got.GetFencingToken() <= a.GetFencingToken() {
		t.Fatalf("B's token %d after A's %d", got.GetFencingToken(), a.GetFencingToken())
	}
	if !now.After(a.GetExpiresAt().AsTime()) {
		t.Fatalf("B granted at %v, before A's expiry %v", now, a.GetExpiresAt().AsTime())
	}
	// The lease clock starts at the grant: about 5 s from now, never past.
	if left := exp.Sub(now); left <= 4*time.Second || left > 5*time.Second {
		t.Fatalf("B's lease has %v left at its grant, want ≈5s", left)
	}
	d := c.describe("r")
	if d.GetFencingToken() != got.GetFencingToken() || d.GetWaiters() != 0 {
		t.Fatalf("after the hand-off: %v", d)
	}
	// C was never granted: its request id has no lease.
	if _, err := c.acquire("r", "c1", 5*time.Second); connect.CodeOf(err) != connect.CodeAborted {
		t.Fatalf("C's request after cancel: %v, want a fresh (refused) attempt", err)
	}
}

// waitFor waits up to 10 s for cond.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	waitUntil(t, 10*time.Second, cond)
}

// waitUntil waits up to within for cond, looking every 10 ms.
func waitUntil(t testing.TB, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Case L8: one release wakes exactly one waiter, in arrival order; each
// grant is in the same log entry as the release before it, and tokens
// strictly increase.
func TestHandOffOrder(t *testing.T) {
	log := &handOffLog{}
	c := startCluster(t, server.DevConfig{Observer: log.observe})
	const n = 200
	a := c.mustAcquire("hot", "holder", 30*time.Second)
	type grant struct {
		i    int
		resp *wardenv1.AcquireResponse
	}
	grants := make(chan grant, n)
	var wg sync.WaitGroup
	for i := range n {
		// Enqueue one at a time (commit order is the queue order).
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.acquireWait(ctx(t), "hot", fmt.Sprintf("w%d", i), 30*time.Second, 2*time.Minute)
			if err != nil {
				t.Errorf("w%d: %v", i, err)
				return
			}
			grants <- grant{i, resp}
			// Release right after the grant, handing on to the next.
			if ok, err := c.release("hot", resp.GetLeaseId()); err != nil || !ok {
				t.Errorf("w%d release: %v %v", i, ok, err)
			}
		}()
		waitFor(t, func() bool { return c.describe("hot").GetWaiters() == uint32(i+1) })
	}
	if ok, err := c.release("hot", a.GetLeaseId()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	wg.Wait()
	close(grants)
	prev := a.GetFencingToken()
	next := 0
	for g := range grants {
		if g.i != next {
			t.Fatalf("grant %d came where w%d was due", g.i, next)
		}
		if g.resp.GetFencingToken() <= prev {
			t.Fatalf("w%d: token %d after %d", g.i, g.resp.GetFencingToken(), prev)
		}
		prev = g.resp.GetFencingToken()
		// The grant is in the very entry of the release before it.
		if res := log.grantedBy(fmt.Sprintf("w%d", g.i)); res == nil || !res.GetReleased() {
			t.Fatalf("w%d was not granted by a release's own entry: %v", g.i, res)
		}
		next++
	}
	if next != n {
		t.Fatalf("%d of %d waiters granted", next, n)
	}
}

// wait_timeout passes without a grant: deadline_exceeded, and the waiter
// is gone from the queue (it is never granted afterwards).
func TestWaitTimeout(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	a := c.mustAcquire("r", "a", 5*time.Second)
	start := time.Now()
	_, err := c.acquireWait(ctx(t), "r", "b", 5*time.Second, 500*time.Millisecond)
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("wait past wait_timeout: %v", err)
	}
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Fatalf("gave up after %v", took)
	}
	if d := c.describe("r"); d.GetWaiters() != 0 {
		t.Fatalf("timed-out waiter still queued: %v", d)
	}
	if ok, err := c.release("r", a.GetLeaseId()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if d := c.describe("r"); d.GetHeld() {
		t.Fatalf("the lock went to a waiter that timed out: %v", d)
	}
}

// A wait ends by the shard's clock, in log order, not by the router's
// wall clock: this router's clock (the one that stamps the shard's
// commands) runs 700 ms behind the wall clock, so a wait of 2 s ends on
// the shard 2.7 s after it began by the wall. The holder releases 1.6 s
// in (wall): the waiter is granted. The router used to time the wait by
// the wall clock and cancel the waiter at 2 s (shard time 1.3 s), before
// the release; and with its cancel racing the grant it could answer
// deadline_exceeded for a lease the log had granted to it.
func TestWaitEndsByTheShardsClock(t *testing.T) {
	c := startCluster(t, server.DevConfig{Router: router.Config{Knobs: router.TestingKnobs{ClockOffset: -700 * time.Millisecond}}})
	a := c.mustAcquire("r", "a", time.Minute)
	released := make(chan error, 1)
	go func() {
		time.Sleep(1600 * time.Millisecond) // real time must pass: the wait is timed by clocks
		ok, err := c.release("r", a.GetLeaseId())
		if err == nil && !ok {
			err = errors.New("released false")
		}
		released <- err
	}()
	w, err := c.acquireWait(ctx(t), "r", "b", time.Minute, 2*time.Second)
	if rerr := <-released; rerr != nil {
		t.Fatalf("release of the holder: %v", rerr)
	}
	if err != nil {
		t.Fatalf("a waiter whose wait has 1.1 s left on the shard's clock when the lock is released: %v, want granted", err)
	}
	if w.GetFencingToken() <= a.GetFencingToken() {
		t.Fatalf("waiter's token %d, holder's %d", w.GetFencingToken(), a.GetFencingToken())
	}
}

// Cases L3 and L18 in one process: a waiting Acquire rides through leader
// changes. The holder is dead (it never renews); leadership moves five
// times, 1 s apart, while the waiter waits; the waiter's one call (a raw
// Connect client, no SDK retries) is granted after the holder's lease
// expires, within rule 6's bound, and never answered unavailable.
func TestWaiterRidesThroughLeaderChanges(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	const ttl = 10 * time.Second
	h := c.mustAcquire("r", "dead-holder", ttl)
	type answer struct {
		lease *wardenv1.AcquireResponse
		err   error
		at    time.Time
	}
	done := make(chan answer, 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		l, err := c.acquireWait(cctx, "r", "waiter", 5*time.Second, 30*time.Second)
		done <- answer{l, err, time.Now()}
	}()
	waitFor(t, func() bool { return c.describe("r").GetWaiters() == 1 })
	for i := range 5 {
		from := c.leader()
		c.transferLeader((from + 1) % server.DevNodes) // fails unless the leader did change
		select {
		case a := <-done:
			t.Fatalf("the waiter was answered during transfer %d, before the holder's lease ended: %v %v", i+1, a.lease, a.err)
		case <-time.After(time.Second):
		}
	}
	lastTransfer := time.Now()
	a := <-done
	if a.err != nil {
		t.Fatalf("the waiter, through five leader changes: %v (code %v), want the grant", a.err, connect.CodeOf(a.err))
	}
	expires := h.GetExpiresAt().AsTime()
	skew := 500 * time.Millisecond // the shards' default max_clock_skew
	if !a.at.After(lastTransfer) || !lastTransfer.Before(expires) {
		t.Fatalf("premise: the transfers (last at %v) all came before the holder's expiry (%v) and the grant (%v)", lastTransfer, expires, a.at)
	}
	// Rule 6: grantable only past expires_at + max_clock_skew, and free by
	// TTL + 2 × skew + scan interval + election time (1 s here, with slack).
	if early := expires.Add(skew); a.at.Before(early) {
		t.Fatalf("granted at %v, before expires_at + max_clock_skew (%v)", a.at, early)
	}
	if late := expires.Add(2*skew + c.cfg.Router.ScanInterval + 2*time.Second); a.at.After(late) {
		t.Fatalf("granted at %v, after rule 6's bound %v", a.at, late)
	}
	if a.lease.GetFencingToken() <= h.GetFencingToken() {
		t.Fatalf("the waiter's token %d is not above the holder's %d", a.lease.GetFencingToken(), h.GetFencingToken())
	}
	// The same request id replays the grant.
	again, err := c.acquireWait(ctx(t), "r", "waiter", 5*time.Second, time.Minute)
	if err != nil || again.GetLeaseId() != a.lease.GetLeaseId() {
		t.Fatalf("replay: %v %v", again, err)
	}
}

// Two attempts of one request id wait at once (a client retried over a
// new connection); the first one's connection drops. The later attempt
// keeps the place and gets the grant: a stale attempt's cancel is ignored.
func TestAbandonedAttemptKeepsLiveRetry(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	h := c.mustAcquire("r", "holder", 30*time.Second)
	actx, cancelA := context.WithCancel(context.Background())
	adone := make(chan error, 1)
	go func() {
		_, err := c.acquireWait(actx, "r", "same", 5*time.Second, 30*time.Second)
		adone <- err
	}()
	waitFor(t, func() bool { return c.describe("r").GetWaiters() == 1 })
	firstAttempt := c.attempt("r", "same")
	b := make(chan *wardenv1.AcquireResponse, 1)
	go func() {
		resp, err := c.acquireWait(ctx(t), "r", "same", 5*time.Second, 30*time.Second)
		if err != nil {
			t.Errorf("live retry: %v", err)
		}
		b <- resp
	}()
	// The retry's attempt is applied: the request's latest attempt changed.
	waitFor(t, func() bool { a := c.attempt("r", "same"); return a != nil && !bytes.Equal(a, firstAttempt) })
	cancelA()
	if err := <-adone; connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("abandoned attempt: %v", err)
	}
	if d := c.describe("r"); d.GetWaiters() != 1 {
		t.Fatalf("the abandoned attempt took the live retry's place: %v", d)
	}
	if ok, err := c.release("r", h.GetLeaseId()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	got := <-b
	if got == nil || got.GetFencingToken() <= h.GetFencingToken() {
		t.Fatalf("live retry's grant: %v", got)
	}
	if d := c.describe("r"); !d.GetHeld() || d.GetFencingToken() != got.GetFencingToken() {
		t.Fatalf("the live retry's lease was released: %v", d)
	}
}

// Waiting clients that give up within milliseconds — during their
// enqueue, before its outcome is known — leave nothing behind: no waiter,
// and no grant held by nobody.
func TestClientsGivingUpLeaveNoWaiters(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	h := c.mustAcquire("r", "holder", 30*time.Second)
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+i%5)*time.Millisecond)
			defer cancel()
			_, _ = c.acquireWait(cctx, "r", fmt.Sprintf("w%d", i), 30*time.Second, time.Minute)
		}()
	}
	wg.Wait()
	waitFor(t, func() bool { return c.describe("r").GetWaiters() == 0 })
	if ok, err := c.release("r", h.GetLeaseId()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	// A grant that raced a cancel is released by it at once.
	waitFor(t, func() bool { return !c.describe("r").GetHeld() })
}

// A retry without wait_timeout of a request id that is queued has no time
// left to wait: it answers as a wait that ran out (deadline_exceeded) and
// takes the request's place back, so no grant goes to nobody; the same
// through Batch. (It used to dereference a missing subscription.)
func TestRetryWithoutWaitOfQueuedRequest(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	h := c.mustAcquire("r", "holder", 30*time.Second)
	for _, viaBatch := range []bool{false, true} {
		id := fmt.Sprintf("queued-%v", viaBatch)
		done := make(chan error, 1)
		go func() {
			_, err := c.acquireWait(ctx(t), "r", id, 5*time.Second, 30*time.Second)
			done <- err
		}()
		waitFor(t, func() bool { return c.describe("r").GetWaiters() == 1 })
		var code connect.Code
		if viaBatch {
			out, err := c.batch(&wardenv1.BatchOp{Op: &wardenv1.BatchOp_Acquire{Acquire: &wardenv1.AcquireRequest{
				Resource: "r", RequestId: id, LeaseTtl: durationpb.New(5 * time.Second)}}})
			if err != nil {
				t.Fatal(err)
			}
			if err := code.UnmarshalText([]byte(out[0].GetCode())); err != nil {
				t.Fatalf("batch outcome %v: %v", out[0], err)
			}
		} else {
			_, err := c.acquire("r", id, 5*time.Second)
			code = connect.CodeOf(err)
		}
		if code != connect.CodeDeadlineExceeded {
			t.Errorf("retry without a wait (batch %v): %v, want deadline_exceeded", viaBatch, code)
		}
		waitFor(t, func() bool { return c.describe("r").GetWaiters() == 0 })
		// The first attempt, still waiting on the place the retry gave up,
		// learns at once that its wait is over (not at its 30 s deadline).
		select {
		case err := <-done:
			if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
				t.Errorf("the first attempt answered %v while %s held the lock, want deadline_exceeded", err, h.GetLeaseId())
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the first attempt was not answered when its place was given up")
		}
	}
	if d := c.describe("r"); !d.GetHeld() || d.GetFencingToken() != h.GetFencingToken() {
		t.Fatalf("r: %v, want still held by the first lease", d)
	}
}

// A waiting attempt whose request was retried (here without a wait, which
// gives the place up) before the lock was handed to the request is not
// told it holds the lock: the grant belongs to the retry, whose cancel
// releases it. It used to be told, and the lease it was given was ended
// at once (an attacker's finding: rule 6 broken for an acknowledged
// lease). The release and the retry share one Batch, so the hand-off
// lands between the retry and its cancel every time.
func TestSupersededWaiterIsNotToldOfTheGrant(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	h := c.mustAcquire("r", "holder", 30*time.Second)
	type answer struct {
		lease *wardenv1.AcquireResponse
		err   error
	}
	done := make(chan answer, 1)
	go func() {
		l, err := c.acquireWait(ctx(t), "r", "w", 30*time.Second, 20*time.Second)
		done <- answer{l, err}
	}()
	waitFor(t, func() bool { return c.describe("r").GetWaiters() == 1 })
	out, err := c.batch(
		&wardenv1.BatchOp{Op: &wardenv1.BatchOp_Acquire{Acquire: &wardenv1.AcquireRequest{
			Resource: "r", RequestId: "w", LeaseTtl: durationpb.New(30 * time.Second)}}},
		releaseOp("r", h.GetLeaseId()),
	)
	if err != nil {
		t.Fatal(err)
	}
	if out[0].GetCode() != "deadline_exceeded" || !out[1].GetRelease().GetReleased() {
		t.Fatalf("batch: %v", out)
	}
	var a answer
	select {
	case a = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the superseded waiter was not answered")
	}
	if a.err == nil {
		// Whoever is told it holds the lock must hold it (rule 6).
		if d := c.describe("r"); !d.GetHeld() || d.GetFencingToken() != a.lease.GetFencingToken() {
			t.Fatalf("the waiter was told it holds r (token %d), but r is %v", a.lease.GetFencingToken(), d)
		}
		t.Fatal("the superseded waiter was told it holds the lock")
	}
	if code := connect.CodeOf(a.err); code != connect.CodeUnavailable {
		t.Errorf("superseded waiter: %v, want unavailable", a.err)
	}
	// The grant went to nobody and was released: the lock is free.
	waitFor(t, func() bool { return !c.describe("r").GetHeld() })
}

// A retry of a waiting request waits for the wait_timeout it carries (the
// time its caller has left), not for the deadline the first attempt set;
// when it runs out, the place is given up and the first attempt, still
// waiting, is answered too.
func TestRetryWaitsForItsOwnTimeout(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	c.mustAcquire("r", "holder", 30*time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := c.acquireWait(ctx(t), "r", "w", 5*time.Second, 30*time.Second)
		done <- err
	}()
	waitFor(t, func() bool { return c.describe("r").GetWaiters() == 1 })
	start := time.Now()
	_, err := c.acquireWait(ctx(t), "r", "w", 5*time.Second, 500*time.Millisecond)
	if took := time.Since(start); connect.CodeOf(err) != connect.CodeDeadlineExceeded || took > 10*time.Second {
		t.Fatalf("retry with a 500 ms wait: %v after %v, want deadline_exceeded well before the first attempt's 30 s", err, took)
	}
	select {
	case err := <-done:
		if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
			t.Errorf("the first attempt: %v, want deadline_exceeded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first attempt was not answered when the retry gave the place up")
	}
	if d := c.describe("r"); d.GetWaiters() != 0 {
		t.Errorf("r: %v, want no waiter left", d)
	}
}

// Case L18's other half: a waiter whose shard loses its quorum is told
// unavailable about a second after (router.waitRideThrough) — never a
// silent wait to its 30 s deadline — and its retry with the same request
// id, once the quorum is back, keeps its place ahead of a later waiter.
func TestWaiterWithoutQuorumAnswersUnavailable(t *testing.T) {
	c := startCluster(t, server.DevConfig{Router: router.Config{ProposeTimeout: time.Second, LeaderWait: time.Second}})
	c.settled()
	h := c.mustAcquire("r", "holder", 30*time.Second)
	answers := make(chan error, 2)
	for _, id := range []string{"w1", "w2"} {
		go func() {
			_, err := c.acquireWait(ctx(t), "r", id, 5*time.Second, 30*time.Second)
			answers <- err
		}()
		waitFor(t, func() bool { return c.attempt("r", id) != nil })
	}
	lead := c.leader()
	c.stopReplica((lead + 1) % server.DevNodes)
	c.stopReplica((lead + 2) % server.DevNodes)
	lost := time.Now()
	for range 2 {
		select {
		case err := <-answers:
			if took := time.Since(lost); connect.CodeOf(err) != connect.CodeUnavailable || took > 5*time.Second {
				t.Fatalf("a waiter without quorum: %v after %v, want unavailable within seconds", err, took)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("a waiter without quorum was not answered")
		}
	}
	c.startReplica((lead + 1) % server.DevNodes)
	c.startReplica((lead + 2) % server.DevNodes)
	// Both retry, W2's retry applied first: W1 keeps the head of the queue.
	got := make(chan *wardenv1.AcquireResponse, 2)
	order := make(chan string, 2)
	for _, id := range []string{"w2", "w1"} {
		before := c.attempt("r", id)
		go func() {
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
				l, err := c.acquireWait(ctx(t), "r", id, 5*time.Second, 10*time.Second)
				if err == nil {
					order <- id
					got <- l
					return
				}
				if connect.CodeOf(err) != connect.CodeUnavailable {
					t.Errorf("%s's retry: %v", id, err)
					return
				}
			}
			t.Errorf("%s's retry: still unavailable", id)
		}()
		waitFor(t, func() bool { a := c.attempt("r", id); return a != nil && !bytes.Equal(a, before) })
	}
	waitFor(t, func() bool { return c.describe("r").GetWaiters() == 2 })
	if ok, err := c.release("r", h.GetLeaseId()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if first := <-order; first != "w1" {
		t.Fatalf("%s was granted first; W1 queued first and kept its place", first)
	}
	l := <-got
	if ok, err := c.release("r", l.GetLeaseId()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if second := <-order; second != "w2" {
		t.Fatalf("then %s", second)
	}
}

// A waiter whose RPC is gone (its node died before it could cancel) is
// dropped by the leader once its wait is over, so it holds no place in
// the queue. Here the waiter is proposed with no RPC waiting at all.
func TestLeaderDropsWaitersWhoseCallIsGone(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.locks.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "r", RequestId: "holder", LeaseTtl: durationpb.New(time.Minute)})); err != nil {
		t.Fatal(err)
	}
	res, err := rpc.ProposeAcquire(ctx, c.dev.Router, &wardenv1.AcquireRequest{Resource: "r", RequestId: "gone", LeaseTtl: durationpb.New(time.Minute), WaitTimeout: durationpb.New(300 * time.Millisecond)})
	if err != nil || res.GetCode() != shardv1.Code_CODE_QUEUED {
		t.Fatalf("premise: the waiter is queued: %v, %v", res, err)
	}
	waiters := func() uint32 {
		d, err := c.locks.Describe(ctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: "r"}))
		if err != nil {
			t.Fatal(err)
		}
		return d.Msg.GetWaiters()
	}
	if n := waiters(); n != 1 {
		t.Fatalf("premise: %d waiters, want 1", n)
	}
	for deadline := time.Now().Add(10 * time.Second); waiters() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter whose call is gone is still queued 10 s after its wait ended")
		}
	}
}
