package harness

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

// memTarget is an in-memory lock service: correct, or broken in one way.
type memTarget struct {
	mu      sync.Mutex
	locks   map[string]*memLock
	tokens  map[string]uint64
	changed *sync.Cond
	// grantAlways grants every acquire (double grants); constToken gives
	// every grant token 1 (token regressions); loseRenewals answers every
	// renewal after the first two seconds "lost" (lost acknowledged leases).
	grantAlways, constToken, loseRenewals bool
	born                                  time.Time
	next                                  int
}

type memLock struct {
	id      int
	expires time.Time
}

func newMemTarget() *memTarget {
	t := &memTarget{locks: map[string]*memLock{}, tokens: map[string]uint64{}, born: time.Now()}
	t.changed = sync.NewCond(&t.mu)
	return t
}

func (t *memTarget) Name() string { return "mem" }
func (t *memTarget) Costs() Costs { return Costs{Acquire: 1, Renew: 1, Release: 1, Note: "in memory"} }
func (t *memTarget) Close() error { return nil }
func (t *memTarget) held(r string) bool {
	l := t.locks[r]
	return l != nil && time.Now().Before(l.expires)
}

func (t *memTarget) Acquire(ctx context.Context, r string, ttl, wait time.Duration) (Lease, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	deadline := time.Now().Add(wait)
	for t.held(r) && !t.grantAlways {
		if wait == 0 || time.Now().After(deadline) {
			return Lease{}, ErrHeld
		}
		t.mu.Unlock()
		time.Sleep(time.Millisecond)
		t.mu.Lock()
	}
	t.next++
	t.tokens[r]++
	tok := t.tokens[r]
	if t.constToken {
		tok = 1
	}
	t.locks[r] = &memLock{id: t.next, expires: time.Now().Add(ttl)}
	return Lease{Resource: r, Token: tok, TTL: ttl, Handle: t.next}, nil
}

func (t *memTarget) Renew(ctx context.Context, l Lease) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.locks[l.Resource]
	if t.loseRenewals && time.Since(t.born) > 2*time.Second || cur == nil || cur.id != l.Handle.(int) || !t.held(l.Resource) {
		return ErrLost
	}
	cur.expires = time.Now().Add(l.TTL)
	return nil
}

func (t *memTarget) Release(ctx context.Context, l Lease) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.locks[l.Resource]
	if cur == nil || cur.id != l.Handle.(int) {
		return ErrLost
	}
	delete(t.locks, l.Resource)
	return nil
}

// tiny is a contended profile small and fast enough for a unit test: 100
// locks held and renewed every 200 ms, 100 acquires/s, and 200 acquires/s
// queueing on one hot lock held 20 ms each.
func tiny() Profile {
	p := Contended(0.02)
	p.AcquireRate, p.ReleaseRate = 100, 100
	p.RenewEvery = 200 * time.Millisecond
	p.LeaseTTL = 2 * time.Second
	p.ContendedRate = 200
	p.HoldTime = 20 * time.Millisecond
	p.WaitTimeout = time.Second
	return p
}

func runMem(t *testing.T, target *memTarget) *Report {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rep, err := Run(context.Background(), target, Config{Profile: tiny(), Duration: 2 * time.Second, RampTimeout: 10 * time.Second}, log)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestCorrectTargetHasNoViolations(t *testing.T) {
	rep := runMem(t, newMemTarget())
	if s := rep.Safety; s.DoubleGrants+s.TokenRegressions+s.LostAcknowledgedLeases != 0 {
		t.Fatalf("violations on a correct target: %+v", s)
	}
	for _, op := range []string{OpAcquire, OpRenew, OpRelease, OpAcquireContended} {
		if rep.Ops[op].Count == 0 {
			t.Errorf("no successful %s in %+v", op, rep.Ops)
		}
	}
	if rep.CommitsPerSec <= 0 || rep.HeldAtEnd == 0 {
		t.Errorf("commits/s %v, held at end %d", rep.CommitsPerSec, rep.HeldAtEnd)
	}
	// Every operation costs the in-memory target one write, so its writes
	// per second are its commits per second, over the same seconds.
	if d := rep.WritesPerSec - rep.CommitsPerSec; d > 0.01*rep.CommitsPerSec || d < -0.01*rep.CommitsPerSec {
		t.Errorf("writes/s %v, commits/s %v", rep.WritesPerSec, rep.CommitsPerSec)
	}
}

func TestCheckerCatchesBrokenTargets(t *testing.T) {
	for name, broken := range map[string]func(*memTarget){
		"double grants":            func(m *memTarget) { m.grantAlways = true },
		"token regressions":        func(m *memTarget) { m.constToken = true },
		"lost acknowledged leases": func(m *memTarget) { m.loseRenewals = true },
	} {
		t.Run(name, func(t *testing.T) {
			m := newMemTarget()
			broken(m)
			s := runMem(t, m).Safety
			got := map[string]int64{"double grants": s.DoubleGrants, "token regressions": s.TokenRegressions, "lost acknowledged leases": s.LostAcknowledgedLeases}[name]
			if got == 0 {
				t.Fatalf("%s not counted: %+v", name, s)
			}
		})
	}
}

func TestCheckerAllowsReleaseThenGrant(t *testing.T) {
	c := NewChecker()
	t0 := time.Now()
	a := Lease{Resource: "r", Token: 5, TTL: time.Minute}
	c.Granted(a, t0, t0.Add(time.Millisecond))
	c.Releasing(a, t0.Add(2*time.Millisecond))
	c.Released(a, t0.Add(3*time.Millisecond), nil)
	b := Lease{Resource: "r", Token: 6, TTL: time.Minute}
	c.Granted(b, t0.Add(3*time.Millisecond), t0.Add(4*time.Millisecond))
	// A renewal sent in time but answered lost after the lease's certain
	// time (an overloaded service handled it late) is no violation.
	c.Renewed(b, t0.Add(30*time.Second), t0.Add(2*time.Minute), ErrLost)
	// Nor is a grant after the last lease's TTL ran out.
	d := Lease{Resource: "r", Token: 7, TTL: time.Minute}
	c.Granted(d, t0.Add(3*time.Minute), t0.Add(3*time.Minute))
	if s := c.Safety(); s.DoubleGrants+s.TokenRegressions+s.LostAcknowledgedLeases != 0 {
		t.Fatalf("%+v", s)
	}
	c.Granted(Lease{Resource: "r", Token: 8, TTL: time.Minute}, t0.Add(3*time.Minute), t0.Add(3*time.Minute+time.Second))
	if s := c.Safety(); s.DoubleGrants != 1 {
		t.Fatalf("a grant while the last lease is current: %+v", s)
	}
}

func TestRecorderWindows(t *testing.T) {
	start := time.Now()
	r := NewRecorder(start)
	for i := range 100 { // latencies 1..100 ms, all done within second 0
		at := start.Add(time.Duration(i) * time.Millisecond)
		r.Record(OpAcquire, at, at.Add(time.Duration(i+1)*time.Millisecond), nil)
	}
	r.Record(OpAcquire, start, start.Add(1500*time.Millisecond), errors.New("boom"))
	all := r.Summary(0, 0)[OpAcquire]
	if all.Count != 100 || all.MaxMS < 99 || all.MaxMS > 101 || all.P50MS < 49 || all.P50MS > 52 {
		t.Fatalf("whole run: %+v", all)
	}
	if all.Errors["other"] != 1 {
		t.Fatalf("errors: %v", all.Errors)
	}
	if n := r.Successes(0, 1, OpAcquire); n != 100 {
		t.Fatalf("second 0 holds %d successes", n)
	}
	if w := r.Summary(1, 2)[OpAcquire]; w.Count != 0 || w.Errors["other"] != 1 {
		t.Fatalf("second 1: %+v", w)
	}
}

func TestParseFault(t *testing.T) {
	f, err := ParseFault("kill@30s")
	if err != nil || f.Kind != "kill" || f.At != 30*time.Second {
		t.Fatalf("%+v %v", f, err)
	}
	for _, bad := range []string{"kill", "@3s", "kill@soon", "kill@-1s"} {
		if _, err := ParseFault(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestComparisonRatios(t *testing.T) {
	w := &Report{Target: "warden", Profile: Reference(0.125), Steps: []Step{
		{Scale: 0.5, AcquiresPerSec: 1000, CommitsPerSec: 3000, Passed: true},
		{Scale: 1, AcquiresPerSec: 1100, P99AcquireMS: 900, Reason: "p99"},
		{Scale: 1, AcquiresPerSec: 1900, CommitsPerSec: 5600, P99AcquireMS: 80, Passed: true}, // the retry passed
		{Scale: 1.41, P99AcquireMS: 900},
	}}
	e := &Report{Target: "etcd", Profile: Reference(0.125), Steps: []Step{
		{Scale: 0.5, AcquiresPerSec: 500, CommitsPerSec: 1400, Passed: true},
		{Scale: 1, AcquiresPerSec: 700, P99AcquireMS: 320},
	}}
	if st, ok := w.AtScale(1); !ok || !st.Passed {
		t.Fatalf("AtScale(1) = %+v, %v; want the passing retry", st, ok)
	}
	var b strings.Builder
	WriteComparison(&b, [][]*Report{{w, e}})
	out := b.String()
	for _, want := range []string{"| etcd | 3.80× | 4.00× | 0.25× |", "| warden | 1 | 1900 | 5600 |"} {
		if !strings.Contains(out, want) {
			t.Errorf("comparison lacks %q:\n%s", want, out)
		}
	}
}

func TestTargetCheck(t *testing.T) {
	r := &Report{Profile: Reference(0.5), CommitsPerSec: 3100, Ops: map[string]OpSummary{OpAcquire: {P99MS: 150}}}
	if got := r.TargetCheck(); !strings.Contains(got, ": met") {
		t.Fatalf("%s", got)
	}
	r.Ops[OpAcquire] = OpSummary{P99MS: 250}
	if got := r.TargetCheck(); !strings.Contains(got, "NOT met") {
		t.Fatalf("p99 250 ms: %s", got)
	}
	r.Ops[OpAcquire] = OpSummary{P99MS: 150}
	r.CommitsPerSec = 2900
	if got := r.TargetCheck(); !strings.Contains(got, "NOT met") {
		t.Fatalf("2,900 of 3,000 commits/s: %s", got)
	}
	// Over 60 s at scale 1, the Poisson arrivals' count varies by about
	// 8 commits/s (one standard deviation): three of them are allowed.
	r = &Report{Profile: Reference(1), DurationS: 60, CommitsPerSec: 5980, Ops: map[string]OpSummary{OpAcquire: {P99MS: 150}}}
	if got := r.TargetCheck(); !strings.Contains(got, ": met") {
		t.Fatalf("5,980 commits/s over 60 s: %s", got)
	}
	r.CommitsPerSec = 5970
	if got := r.TargetCheck(); !strings.Contains(got, "NOT met") {
		t.Fatalf("5,970 commits/s over 60 s: %s", got)
	}
}

func TestHandleOf(t *testing.T) {
	type h struct{ id int }
	if got, err := HandleOf[*h]("x", Lease{Handle: &h{7}}); err != nil || got.id != 7 {
		t.Fatalf("own handle: %v %v", got, err)
	}
	for _, l := range []Lease{{Resource: "r"}, {Resource: "r", Handle: (*h)(nil)}, {Resource: "r", Handle: "other"}} {
		if _, err := HandleOf[*h]("x", l); err == nil || !strings.Contains(err.Error(), `x: lease for "r"`) {
			t.Errorf("handle %#v: %v", l.Handle, err)
		}
	}
}

// Operations started together share a context whose deadline is at least
// the operation timeout away; Close cancels every one handed out.
func TestOpContexts(t *testing.T) {
	d := NewDriver(nil, DriverConfig{OpTimeout: time.Second, Resources: 1})
	before := time.Now()
	a, b := d.opCtx(), d.opCtx()
	if a != b {
		t.Fatal("two operations started together got separate contexts")
	}
	at, ok := a.Deadline()
	if !ok || at.Before(before.Add(time.Second)) || at.After(time.Now().Add(time.Second+deadlineStep)) {
		t.Fatalf("deadline %v after the start, want between 1s and 1s+%v", at.Sub(before), deadlineStep)
	}
	time.Sleep(deadlineStep + 10*time.Millisecond)
	c := d.opCtx()
	if c == a {
		t.Fatal("an operation got a context with less than the operation timeout left")
	}
	d.Close()
	if a.Err() == nil || c.Err() == nil {
		t.Fatal("Close left contexts running")
	}
}

// The mass-expiry fault runs on any target (this one injects no faults
// of its own): its fleet's leases are taken, left to expire, and found
// free again; the report gives what it measured and how the profile's
// clients fared meanwhile.
func TestMassExpiryFault(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rep, err := Run(context.Background(), newMemTarget(), Config{Profile: tiny(), Duration: 4 * time.Second, RampTimeout: 10 * time.Second,
		Faults:     []FaultSpec{{Kind: MassExpiry, At: 500 * time.Millisecond}},
		MassExpiry: MassExpiryConfig{Leases: 500, TTL: time.Second, Workers: 8}}, log)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Faults) != 1 {
		t.Fatalf("faults %+v", rep.Faults)
	}
	f := rep.Faults[0]
	if f.Error != "" || !strings.Contains(f.Detail, "500 leases of 1s") || f.TookS < 1 {
		t.Fatalf("mass-expiry: %+v", f)
	}
	if f.Ops[OpRenew].Count == 0 {
		t.Fatalf("no renewal of the profile's clients recorded during the fault: %+v", f.Ops)
	}
	if s := rep.Safety; s.DoubleGrants+s.TokenRegressions+s.LostAcknowledgedLeases != 0 {
		t.Fatalf("violations: %+v", s)
	}
}

// find-max steps up by the factor until a scale fails, then bisects to
// within the precision: the max it reports is at most the true one and
// within 5 % of it, for thresholds anywhere between the steps.
func TestSearchBisects(t *testing.T) {
	for _, limit := range []float64{0.9, 1.0, 1.3, 2.2, 2.9, 3.05, 5.6} {
		var probes []float64
		got := search(0.125, math.Sqrt2, 0.05, 12, func(scale float64, bisect bool) (bool, bool) {
			probes = append(probes, scale)
			return scale <= limit, false
		})
		if got > limit || got < limit/1.05 {
			t.Errorf("limit %.3g: search found %.4g (probes %.3g), want within 5 %% below it", limit, got, probes)
		}
		if len(probes) > 12+4 {
			t.Errorf("limit %.3g: %d probes, want at most 16 (12 steps, then log2(ln √2 / ln 1.05) bisections)", limit, len(probes))
		}
	}
	// Nothing passes: 0. Everything passes: the last step, no bisection.
	if got := search(1, 2, 0.05, 5, func(float64, bool) (bool, bool) { return false, false }); got != 0 {
		t.Errorf("none passing: %v", got)
	}
	if got := search(1, 2, 0.05, 5, func(float64, bool) (bool, bool) { return true, false }); got != 16 {
		t.Errorf("all passing: %v, want 16", got)
	}
	// Below 0: no bisection, the old √2 answer.
	if got := search(1, math.Sqrt2, -1, 10, func(s float64, _ bool) (bool, bool) { return s <= 3.9, false }); math.Abs(got-2*math.Sqrt2) > 1e-9 {
		t.Errorf("without bisection: %v, want 2.83", got)
	}
	// A stop ends the search at once.
	n := 0
	search(1, 2, 0.05, 10, func(float64, bool) (bool, bool) { n++; return true, n == 3 })
	if n != 3 {
		t.Errorf("a stop at the third probe: %d probes", n)
	}
}

// A bisection steps down: the driver releases the locks above the lower
// scale's target, so that the renewals are that scale's, and the report's
// max is the highest passing scale, not the last.
func TestRampDownAndBest(t *testing.T) {
	d := NewDriver(newMemTarget(), DriverConfig{Resources: 1000, Log: slog.New(slog.DiscardHandler)})
	defer d.Close()
	p := tiny()
	big := p
	big.HeldLocks = 2 * p.HeldLocks
	ctx := context.Background()
	if err := d.Ramp(ctx, big, 10*time.Second); err != nil || d.Held() < big.HeldLocks {
		t.Fatalf("ramp up: %v, %d held", err, d.Held())
	}
	if err := d.Ramp(ctx, p, 10*time.Second); err != nil || d.Held() > p.HeldLocks {
		t.Fatalf("ramp down: %v, %d held, want at most %d", err, d.Held(), p.HeldLocks)
	}
	r := &Report{Steps: []Step{{Scale: 1, Passed: true}, {Scale: 1.41}, {Scale: 1.19, Passed: true}, {Scale: 1.30}}}
	if b, ok := r.best(); !ok || b.Scale != 1.19 {
		t.Fatalf("best of %v: %v", r.Steps, b)
	}
}
