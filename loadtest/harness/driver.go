package harness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Driver runs a profile against a target. Its state (the held locks, the
// resources in use, the checker and the recorder) lives across phases, so
// a find-max run steps the rate up on the same held locks. One Driver
// serves one run.
type Driver struct {
	t   Target
	q   QuotaTarget // nil when the target has no quota
	rec *Recorder
	chk *Checker
	log *slog.Logger
	// opTimeout bounds each operation, retries included.
	opTimeout time.Duration
	deadlines deadlines

	start time.Time
	stop  chan struct{} // closed by Close: lease goroutines end
	wg    sync.WaitGroup

	// inFlight bounds the operations started by arrivals; an arrival that
	// finds it full is recorded as an "overload" error.
	inFlight chan struct{}

	// resources[i] is 1 while the harness is acquiring, holding or
	// releasing resource i; freeAt[i] (Unix ns) keeps it unused until a
	// lease the harness lost track of (an operation with an unknown
	// outcome) has surely expired.
	resources []atomic.Int32
	freeAt    []atomic.Int64

	mu   sync.Mutex
	held []*heldLease // random pick for releases

	hot sync.Map // hot resource name → *hotLock
}

// heldLease is one held uncontended lock, owned by its goroutine.
type heldLease struct {
	lease   Lease
	index   int            // resource index
	pos     int            // position in Driver.held
	release chan time.Time // the release's intended time
}

// hotLock tracks when a contended lock's last release was sent, for the
// hand-off latency.
type hotLock struct {
	mu          sync.Mutex
	releaseSent time.Time
}

// deadlineStep is how far an operation's deadline may lie past
// opTimeout: operations started within one step share a context.
const deadlineStep = 250 * time.Millisecond

// deadlines hands out shared operation contexts. A context with a timeout
// per operation was 15 % of the generator's CPU at the reference rate (a
// runtime timer each, in a heap that also holds every held lock's renewal
// timer), on the two cores the servers under test need.
type deadlines struct {
	mu      sync.Mutex
	ctx     context.Context
	at      time.Time            // ctx's deadline
	cancels []context.CancelFunc // every context handed out, for Close
}

// opCtx returns a context whose deadline is between d.opTimeout and
// d.opTimeout+deadlineStep from now, shared with the operations started
// around the same time. Its callers must not cancel it.
func (d *Driver) opCtx() context.Context {
	now := time.Now()
	dl := &d.deadlines
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if dl.ctx == nil || dl.at.Sub(now) < d.opTimeout {
		dl.at = now.Add(d.opTimeout + deadlineStep)
		var cancel context.CancelFunc
		dl.ctx, cancel = context.WithDeadline(context.Background(), dl.at)
		dl.cancels = append(dl.cancels, cancel)
	}
	return dl.ctx
}

// errOverload is recorded when an arrival finds maxInFlight operations
// outstanding: the harness cannot start it on time.
var errOverload = CodedError{Kind: "overload", Err: errors.New("too many operations in flight")}

// DriverConfig configures a Driver.
type DriverConfig struct {
	// MaxInFlight bounds outstanding operations (default 20,000).
	MaxInFlight int
	// OpTimeout bounds one operation with its retries (default 10 s).
	OpTimeout time.Duration
	// Resources is the size of the uncontended name space; the driver
	// sizes itself for the largest profile it will run.
	Resources int
	Log       *slog.Logger
}

// NewDriver returns a driver for t whose clock starts now.
func NewDriver(t Target, cfg DriverConfig) *Driver {
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 20000
	}
	if cfg.OpTimeout == 0 {
		cfg.OpTimeout = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	start := time.Now()
	d := &Driver{
		t:         t,
		rec:       NewRecorder(start),
		chk:       NewChecker(),
		log:       cfg.Log,
		opTimeout: cfg.OpTimeout,
		start:     start,
		stop:      make(chan struct{}),
		inFlight:  make(chan struct{}, cfg.MaxInFlight),
		resources: make([]atomic.Int32, cfg.Resources),
		freeAt:    make([]atomic.Int64, cfg.Resources),
	}
	d.q, _ = t.(QuotaTarget)
	return d
}

// Recorder returns the driver's recorder.
func (d *Driver) Recorder() *Recorder { return d.rec }

// Checker returns the driver's safety checker.
func (d *Driver) Checker() *Checker { return d.chk }

// Elapsed is the time since the driver started, the report's time axis.
func (d *Driver) Elapsed() time.Duration { return time.Since(d.start) }

// Held is how many uncontended locks are held now.
func (d *Driver) Held() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.held)
}

// Close ends every lease goroutine (without releasing: the service ends
// the leases by expiry or the run's end) and waits for the operations in
// flight.
func (d *Driver) Close() {
	close(d.stop)
	d.wg.Wait()
	d.deadlines.mu.Lock()
	defer d.deadlines.mu.Unlock()
	for _, cancel := range d.deadlines.cancels {
		cancel()
	}
}

// poisson calls fire at the arrival times of a Poisson stream of rate
// per second until ctx ends. fire gets the intended time and must not
// block. A rate of 0 fires nothing.
func poisson(ctx context.Context, rate float64, fire func(intended time.Time)) {
	if rate <= 0 {
		<-ctx.Done()
		return
	}
	next := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		next = next.Add(time.Duration(rand.ExpFloat64() / rate * float64(time.Second)))
		if wait := time.Until(next); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		fire(next)
	}
}

// Ramp acquires locks at p's acquire rate (at least a tenth of the target
// per second) until p.HeldLocks are held or timeout passes. Above the
// target (a find-max bisection steps down) it releases the extra, at p's
// release rate or more, so that the renewals are p's too.
func (d *Driver) Ramp(ctx context.Context, p Profile, timeout time.Duration) error {
	need := p.HeldLocks - d.Held()
	if need < 0 {
		return d.shrink(ctx, p, timeout)
	}
	if need == 0 {
		return nil
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rate := math.Max(p.AcquireRate, float64(p.HeldLocks)/10)
	go poisson(ctx, rate, func(at time.Time) {
		if d.Held() < p.HeldLocks {
			d.acquire(p, at)
		}
	})
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for d.Held() < p.HeldLocks {
		select {
		case <-ctx.Done():
			why := fmt.Sprintf("after %s", timeout)
			if parent.Err() != nil {
				why = "when interrupted"
			}
			return fmt.Errorf("ramp: %d of %d locks held %s; acquire errors so far: %v", d.Held(), p.HeldLocks, why, d.rec.Summary(0, 0)[OpAcquire].Errors)
		case <-tick.C:
		}
	}
	return nil
}

// shrink releases held locks until p.HeldLocks are left, or timeout
// passes.
func (d *Driver) shrink(ctx context.Context, p Profile, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	go poisson(ctx, math.Max(p.ReleaseRate, float64(p.HeldLocks)/10), func(at time.Time) {
		if d.Held() > p.HeldLocks {
			d.releaseOne(at)
		}
	})
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for d.Held() > p.HeldLocks {
		select {
		case <-ctx.Done():
			return fmt.Errorf("ramp down: %d locks held, want %d, after %s", d.Held(), p.HeldLocks, timeout)
		case <-tick.C:
		}
	}
	return nil
}

// Steady runs p's arrival streams for duration.
func (d *Driver) Steady(ctx context.Context, p Profile, duration time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, duration)
	defer cancel()
	var wg sync.WaitGroup
	run := func(rate float64, fire func(time.Time)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			poisson(ctx, rate, fire)
		}()
	}
	run(p.AcquireRate, func(at time.Time) { d.acquire(p, at) })
	// Releases keep the held count near its target: acquires that fail
	// would otherwise drain it.
	floor := p.HeldLocks * 98 / 100
	run(p.ReleaseRate, func(at time.Time) {
		if d.Held() >= floor {
			d.releaseOne(at)
		}
	})
	run(p.ContendedRate, func(at time.Time) { d.contend(p, at) })
	if d.q != nil {
		run(p.QuotaRate, func(at time.Time) { d.reserve(p, at) })
	}
	wg.Wait()
}

// begin takes an in-flight slot, or records an overload and returns false.
func (d *Driver) begin(op string, at time.Time) bool {
	select {
	case d.inFlight <- struct{}{}:
		d.wg.Add(1)
		return true
	default:
		d.rec.Record(op, at, time.Now(), errOverload)
		return false
	}
}

func (d *Driver) end() {
	<-d.inFlight
	d.wg.Done()
}

func resourceName(i int) string { return fmt.Sprintf("res-%07d", i) }

// pick claims a free resource index below n, or returns -1.
func (d *Driver) pick(n int) int {
	now := time.Now().UnixNano()
	n = min(n, len(d.resources))
	for range 16 {
		i := rand.IntN(n)
		if d.freeAt[i].Load() > now {
			continue
		}
		if d.resources[i].CompareAndSwap(0, 1) {
			return i
		}
	}
	return -1
}

// unknown marks resource i unusable until a lease that an operation with
// an unknown outcome may have left behind has surely expired.
func (d *Driver) unknown(i int, ttl time.Duration) {
	d.freeAt[i].Store(time.Now().Add(ttl + 2*time.Second).UnixNano())
}

// acquire starts one uncontended acquire intended at at.
func (d *Driver) acquire(p Profile, at time.Time) {
	if !d.begin(OpAcquire, at) {
		return
	}
	go func() {
		defer d.end()
		i := d.pick(p.Resources)
		if i < 0 {
			d.rec.Record(OpAcquire, at, time.Now(), CodedError{Kind: "no_free_resource", Err: errors.New("no free resource found in 16 tries")})
			return
		}
		sent := time.Now()
		l, err := d.t.Acquire(d.opCtx(), resourceName(i), p.LeaseTTL, 0)
		done := time.Now()
		d.rec.Record(OpAcquire, at, done, err)
		if err != nil {
			if !errors.Is(err, ErrHeld) {
				d.unknown(i, p.LeaseTTL)
			}
			d.resources[i].Store(0)
			return
		}
		d.chk.Granted(l, sent, done)
		d.hold(p, l, i)
	}()
}

// hold keeps l renewed by its own goroutine until it is released, lost,
// or the driver closes.
func (d *Driver) hold(p Profile, l Lease, i int) {
	h := &heldLease{lease: l, index: i, release: make(chan time.Time, 1)}
	d.mu.Lock()
	h.pos = len(d.held)
	d.held = append(d.held, h)
	d.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		period := func() time.Duration {
			j := 1 + p.RenewJitter*(2*rand.Float64()-1)
			return time.Duration(float64(p.RenewEvery) * j)
		}
		// The first renewal comes at a random phase of the period, so the
		// held locks renew at HeldLocks/RenewEvery per second however long
		// each is held. (Renewing a full period after the grant would
		// skip the many locks released before then: with random releases
		// a lock lives 10 s on average, and only 58 % of the profile's
		// renewals would happen.)
		next := time.Now().Add(time.Duration(rand.Int64N(int64(p.RenewEvery))))
		timer := time.NewTimer(time.Until(next))
		defer timer.Stop()
		for {
			select {
			case <-d.stop:
				return
			case at := <-h.release:
				d.release(p, h, at)
				return
			case <-timer.C:
				sent := time.Now()
				err := d.t.Renew(d.opCtx(), l)
				done := time.Now()
				d.rec.Record(OpRenew, next, done, err)
				d.chk.Renewed(l, sent, done, err)
				switch {
				case errors.Is(err, ErrLost):
					d.forget(h)
					d.unknown(i, p.LeaseTTL)
					d.resources[i].Store(0)
					return
				case err != nil:
					next = done.Add(time.Second) // retry soon: the lease is at risk
				default:
					next = next.Add(period())
				}
				timer.Reset(time.Until(next))
			}
		}
	}()
}

// forget removes h from the held set; false if a release already took it.
func (d *Driver) forget(h *heldLease) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h.pos < 0 {
		return false
	}
	last := d.held[len(d.held)-1]
	d.held[h.pos] = last
	last.pos = h.pos
	d.held = d.held[:len(d.held)-1]
	h.pos = -1
	return true
}

// releaseOne releases a random held lock, intended at at.
func (d *Driver) releaseOne(at time.Time) {
	d.mu.Lock()
	if len(d.held) == 0 {
		d.mu.Unlock()
		return
	}
	h := d.held[rand.IntN(len(d.held))]
	d.mu.Unlock()
	if d.forget(h) {
		h.release <- at
	}
}

// release runs on h's goroutine.
func (d *Driver) release(p Profile, h *heldLease, at time.Time) {
	sent := time.Now()
	d.chk.Releasing(h.lease, sent)
	err := d.t.Release(d.opCtx(), h.lease)
	done := time.Now()
	d.rec.Record(OpRelease, at, done, err)
	d.chk.Released(h.lease, done, err)
	if err != nil && !errors.Is(err, ErrLost) {
		d.unknown(h.index, p.LeaseTTL)
	}
	d.resources[h.index].Store(0)
}

// contend starts one acquire on a hot resource that queues, holds the
// grant for p.HoldTime and releases it.
func (d *Driver) contend(p Profile, at time.Time) {
	if !d.begin(OpAcquireContended, at) {
		return
	}
	go func() {
		defer d.end()
		name := fmt.Sprintf("hot-%04d", rand.IntN(p.HotResources))
		v, _ := d.hot.LoadOrStore(name, &hotLock{})
		hl := v.(*hotLock)
		ctx, cancel := context.WithTimeout(context.Background(), p.WaitTimeout+d.opTimeout)
		defer cancel()
		sent := time.Now()
		l, err := d.t.Acquire(ctx, name, p.LeaseTTL, p.WaitTimeout)
		done := time.Now()
		d.rec.Record(OpAcquireContended, at, done, err)
		if err != nil {
			return
		}
		d.chk.Granted(l, sent, done)
		hl.mu.Lock()
		if rs := hl.releaseSent; rs.After(sent) {
			d.rec.Record(OpHandoff, rs, done, nil)
		}
		hl.mu.Unlock()
		select {
		case <-time.After(p.HoldTime):
		case <-d.stop:
			return
		}
		rsent := time.Now()
		d.chk.Releasing(l, rsent)
		hl.mu.Lock()
		hl.releaseSent = rsent
		hl.mu.Unlock()
		err = d.t.Release(d.opCtx(), l)
		rdone := time.Now()
		d.rec.Record(OpRelease, rsent, rdone, err)
		d.chk.Released(l, rdone, err)
	}()
}

// reserve starts one reservation, then commits or releases it after a
// random hold.
func (d *Driver) reserve(p Profile, at time.Time) {
	if !d.begin(OpReserve, at) {
		return
	}
	go func() {
		defer d.end()
		key := fmt.Sprintf("pool-%02d/tenant-%02d/job-%d", rand.IntN(p.QuotaPools), rand.IntN(p.QuotaTenants), rand.IntN(1000))
		r, err := d.q.Reserve(d.opCtx(), key, 1+rand.Int64N(10), time.Minute)
		d.rec.Record(OpReserve, at, time.Now(), err)
		if err != nil {
			return
		}
		hold := time.Duration(rand.Int64N(int64(p.HoldTime) + 1))
		select {
		case <-time.After(hold):
		case <-d.stop:
			return
		}
		cctx := d.opCtx()
		t0 := time.Now()
		if rand.Float64() < p.CommitShare {
			err := d.q.Commit(cctx, r)
			d.rec.Record(OpCommit, t0, time.Now(), err)
		} else {
			err := d.q.ReleaseReservation(cctx, r)
			d.rec.Record(OpReleaseQuota, t0, time.Now(), err)
		}
	}()
}
