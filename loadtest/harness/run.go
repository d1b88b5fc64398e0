package harness

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"
)

// FaultSpec is a fault to inject At after the steady phase starts.
type FaultSpec struct {
	Kind string
	At   time.Duration
}

// ParseFault parses "kind@seconds", for example "kill@30s" or
// "snapshot@35s".
func ParseFault(s string) (FaultSpec, error) {
	kind, at, ok := strings.Cut(s, "@")
	if !ok || kind == "" {
		return FaultSpec{}, fmt.Errorf("fault: want kind@duration (kill@30s), got %q", s)
	}
	d, err := time.ParseDuration(at)
	if err != nil || d < 0 {
		return FaultSpec{}, fmt.Errorf("fault %q: bad time %q: want a duration like 30s", s, at)
	}
	return FaultSpec{Kind: kind, At: d}, nil
}

// FaultEvent is an injected fault in the report: at_s on the report's
// time axis (seconds since the driver started), how long the injection
// took, and its error if it failed.
type FaultEvent struct {
	Kind  string  `json:"kind"`
	AtS   float64 `json:"at_s"`
	TookS float64 `json:"took_s"`
	Error string  `json:"error,omitempty"`
	// Detail is what the fault measured (mass-expiry: how long after
	// their expiry the fleet's leases were all free).
	Detail string `json:"detail,omitempty"`
	// Ops summarises the profile's operations while the fault ran (from
	// its start to its end, whole seconds): how the other clients fared.
	Ops opSummary `json:"ops,omitempty"`
}

// Config is one run.
type Config struct {
	Profile Profile
	// Duration is the steady phase (or, with FindMax, each step's).
	Duration time.Duration
	// RampTimeout bounds the ramp to the profile's held locks.
	RampTimeout time.Duration
	Faults      []FaultSpec
	// MassExpiry sizes the mass-expiry fault, which the harness injects
	// itself on any target.
	MassExpiry MassExpiryConfig
	// FindMax steps the scale up by StepFactor from Profile.Scale until
	// p99 acquire passes MaxP99 or errors pass MaxErrorRate twice in a row
	// at one scale, at most MaxSteps scales; then it bisects between the
	// last scale that passed and the first that failed until they are
	// within Precision of each other (0.05 by default: 5 %; below 0, no
	// bisection), each probe with the same two tries.
	FindMax      bool
	StepFactor   float64
	MaxSteps     int
	Precision    float64
	MaxP99       time.Duration
	MaxErrorRate float64
	Driver       DriverConfig
	// Meter, if set, measures what each measured phase costs the
	// target's servers and the generator (Usage).
	Meter *Meter
}

// Step is one rate of a find-max run.
type Step struct {
	Scale          float64 `json:"scale"`
	FromS          float64 `json:"from_s"`
	ToS            float64 `json:"to_s"`
	AcquiresPerSec float64 `json:"acquires_per_sec"`
	CommitsPerSec  float64 `json:"commits_per_sec"`
	WritesPerSec   float64 `json:"writes_per_sec"`
	P99AcquireMS   float64 `json:"p99_acquire_ms"`
	ErrorRate      float64 `json:"error_rate"`
	Passed         bool    `json:"passed"`
	Reason         string  `json:"reason,omitempty"`
	// Bisect marks a step of the bisection that follows the first
	// failing scale.
	Bisect bool      `json:"bisect,omitempty"`
	Ops    opSummary `json:"ops"`
	// Usage is what the step cost (Config.Meter).
	Usage *Usage `json:"usage,omitempty"`
}

type opSummary = map[string]OpSummary

// Report is report.json.
type Report struct {
	Target  string  `json:"target"`
	Profile Profile `json:"profile"`
	// DurationS is the measured (steady) phase; RampS the ramp before it.
	DurationS float64 `json:"duration_s"`
	RampS     float64 `json:"ramp_s"`
	// CommitsPerSec counts acknowledged state changes per second of the
	// steady phase: grants, renewals, releases, reserves, commits and
	// reservation releases. WritesPerSec weighs them by the target's
	// Costs: its own replicated writes.
	CommitsPerSec  float64      `json:"commits_per_sec"`
	WritesPerSec   float64      `json:"writes_per_sec"`
	AcquiresPerSec float64      `json:"acquires_per_sec"`
	HeldAtEnd      int          `json:"held_at_end"`
	Ops            opSummary    `json:"ops"`
	Faults         []FaultEvent `json:"faults"`
	// MaxCommitsPerSec and MaxAcquiresPerSec are the best passing step of
	// a find-max run.
	MaxCommitsPerSec  *float64 `json:"max_commits_per_sec,omitempty"`
	MaxAcquiresPerSec *float64 `json:"max_acquires_per_sec,omitempty"`
	Steps             []Step   `json:"steps,omitempty"`
	// Usage is what the steady phase cost (Config.Meter); with FindMax,
	// each step has its own.
	Usage  *Usage `json:"usage,omitempty"`
	Safety Safety `json:"safety"`
	Costs  Costs  `json:"costs"`
	// Series is each operation's per-second count and latency, for the
	// chart; SteadyFromS marks where the steady phase starts.
	Series      map[string][]Point `json:"series"`
	SteadyFromS float64            `json:"steady_from_s"`
	Machine     string             `json:"machine"`
	StartedAt   time.Time          `json:"started_at"`
}

// stateChanges are the operations that count as commits.
var stateChanges = []string{OpAcquire, OpAcquireContended, OpRenew, OpRelease, OpReserve, OpCommit, OpReleaseQuota}

func secs(d time.Duration) float64 { return d.Seconds() }

// Run ramps up, runs the steady phase (or the find-max steps) with the
// faults, and returns the report.
func Run(ctx context.Context, t Target, cfg Config, log *slog.Logger) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	top := cfg.Profile.Scale
	if cfg.FindMax {
		top *= pow(cfg.StepFactor, cfg.MaxSteps)
	}
	cfg.Driver.Resources = cfg.Profile.Rescaled(top).Resources
	cfg.Driver.Log = log
	d := NewDriver(t, cfg.Driver)
	defer d.Close()
	rep := newReport(t, cfg.Profile)
	p := cfg.Profile
	if p.QuotaRate > 0 {
		if err := setupQuota(ctx, t, p); err != nil {
			return nil, err
		}
	}
	log.Info("ramp", "target", t.Name(), "profile", p.Name, "held_locks", p.HeldLocks)
	if err := d.Ramp(ctx, p, cfg.RampTimeout); err != nil {
		return nil, err
	}
	before := cfg.Meter.sample(ctx) // the steady phase's, without FindMax
	steadyFrom := d.Elapsed()
	rep.RampS, rep.SteadyFromS = secs(steadyFrom), secs(steadyFrom)
	log.Info("steady", "ramp_s", fmt.Sprintf("%.1f", rep.RampS), "held", d.Held())
	stopFaults, faultsDone, err := startFaults(ctx, t, cfg, d, rep, log)
	if err != nil {
		return nil, err
	}
	defer stopFaults()
	if !cfg.FindMax {
		d.Steady(ctx, p, cfg.Duration)
	} else {
		findMax(ctx, d, cfg, rep, log)
	}
	steadyTo := d.Elapsed()
	after := cfg.Meter.sample(ctx)
	stopFaults() // faults scheduled past the end do not start
	<-faultsDone
	whole := step(d, p, steadyFrom, steadyTo, cfg)
	rep.DurationS = secs(steadyTo - steadyFrom)
	rep.Ops = whole.Ops
	rep.CommitsPerSec = whole.CommitsPerSec
	rep.AcquiresPerSec = whole.AcquiresPerSec
	if !cfg.FindMax {
		rep.Usage = cfg.Meter.usage(before, after, rep.CommitsPerSec)
	}
	// The same whole seconds as the step's other rates.
	rep.WritesPerSec = writes(rep.Costs, whole.Ops) / max(whole.ToS-whole.FromS, 1)
	rep.HeldAtEnd = d.Held()
	rep.Safety = d.chk.Safety()
	rep.Series = chartSeries(d.rec)
	return rep, nil
}

// newReport is the report of a run of profile p on t starting now, on
// this machine.
func newReport(t Target, p Profile) *Report {
	return &Report{
		Target:    t.Name(),
		Profile:   p,
		Costs:     t.Costs(),
		Machine:   fmt.Sprintf("%d CPUs, %s/%s, %s", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version()),
		StartedAt: time.Now().UTC(),
	}
}

// chartSeries is rec's per-second points of the state changes and the
// hand-offs, by operation; one with none is left out.
func chartSeries(rec *Recorder) map[string][]Point {
	series := map[string][]Point{}
	for _, op := range append(stateChanges, OpHandoff) {
		if s := rec.Series(op); s != nil {
			series[op] = s
		}
	}
	return series
}

// withDefaults is cfg with its unset settings given their defaults.
func (cfg Config) withDefaults() Config {
	if cfg.RampTimeout == 0 {
		cfg.RampTimeout = 2 * time.Minute
	}
	if cfg.StepFactor <= 1 {
		cfg.StepFactor = 1.25
	}
	if cfg.MaxSteps == 0 {
		cfg.MaxSteps = 12
	}
	if cfg.MaxP99 == 0 {
		cfg.MaxP99 = 200 * time.Millisecond
	}
	if cfg.MaxErrorRate == 0 {
		cfg.MaxErrorRate = 0.001
	}
	if cfg.Precision == 0 {
		cfg.Precision = 0.05
	}
	return cfg
}

// setupQuota creates profile p's quota pools and tenants on t, with
// limits no run reaches.
func setupQuota(ctx context.Context, t Target, p Profile) error {
	q, ok := t.(QuotaTarget)
	if !ok {
		return fmt.Errorf("profile quota: target %s has no quota service", t.Name())
	}
	if err := q.SetupQuota(ctx, p.QuotaPools, p.QuotaTenants, 1<<50, 1<<45); err != nil {
		return fmt.Errorf("quota setup: %w", err)
	}
	return nil
}

// startFaults starts injecting cfg's faults, each At after now, and
// records each in rep.Faults as it ends. Faults run one after the other,
// in schedule order: one that takes long (a slow cluster answers its
// admin calls slowly) delays the next rather than overlapping it (a
// restart must follow its kill). stop keeps the faults not yet started
// from starting; done is closed once none will run.
func startFaults(ctx context.Context, t Target, cfg Config, d *Driver, rep *Report, log *slog.Logger) (stop func(), done <-chan struct{}, err error) {
	faultsDone := make(chan struct{})
	if len(cfg.Faults) == 0 {
		close(faultsDone)
		return func() {}, faultsDone, nil
	}
	f, ok := t.(Faulter)
	if !ok && slices.ContainsFunc(cfg.Faults, func(fs FaultSpec) bool { return fs.Kind != MassExpiry }) {
		return nil, nil, fmt.Errorf("faults: target %s cannot inject faults", t.Name())
	}
	fctx, cancel := context.WithCancel(ctx)
	plan := slices.Clone(cfg.Faults)
	slices.SortStableFunc(plan, func(a, b FaultSpec) int { return cmp.Compare(a.At, b.At) })
	begin := time.Now()
	go func() {
		defer close(faultsDone)
		for _, fs := range plan {
			select {
			case <-time.After(time.Until(begin.Add(fs.At))):
			case <-fctx.Done():
				return
			}
			at := d.Elapsed()
			log.Info("fault", "kind", fs.Kind, "at_s", fmt.Sprintf("%.1f", secs(at)))
			// A fault under way finishes even if the run ends meanwhile.
			detail, err := injectFault(ctx, t, f, fs.Kind, cfg.MassExpiry, rep.StartedAt)
			end := d.Elapsed()
			ev := FaultEvent{Kind: fs.Kind, AtS: secs(at), TookS: secs(end - at), Detail: detail,
				Ops: d.rec.Summary(int(at/time.Second), int(end/time.Second)+1)}
			if err != nil {
				ev.Error = err.Error()
				log.Warn("fault failed", "kind", fs.Kind, "err", err)
			}
			rep.Faults = append(rep.Faults, ev)
		}
	}()
	return cancel, faultsDone, nil
}

// injectFault injects one fault of kind, a mass expiry (sized by mass,
// its resources named after the run's start) or one of f's, and returns
// what it measured. Its time is bounded: 5 minutes for a mass expiry, a
// minute for f's.
func injectFault(ctx context.Context, t Target, f Faulter, kind string, mass MassExpiryConfig, started time.Time) (detail string, err error) {
	if kind == MassExpiry {
		ictx, icancel := context.WithTimeout(ctx, 5*time.Minute)
		defer icancel()
		return massExpiry(ictx, t, mass, started.Format("150405"))
	}
	ictx, icancel := context.WithTimeout(ctx, time.Minute)
	defer icancel()
	if m, ok := f.(Measurer); ok {
		return m.Measure(ictx, kind)
	}
	return "", f.Fault(ictx, kind)
}

// findMax runs find-max's scales (search) from the profile's, each
// ramped to and then measured up to twice (a step that fails is run
// once more before it counts as failed: one noisy interval on a shared
// machine should not decide the search). It records every try in
// rep.Steps and the highest scale that passed as rep's maximum.
func findMax(ctx context.Context, d *Driver, cfg Config, rep *Report, log *slog.Logger) {
	p := cfg.Profile
	bisecting := false
	search(p.Scale, cfg.StepFactor, cfg.Precision, cfg.MaxSteps, func(scale float64, bisect bool) (passed, stop bool) {
		bisecting = bisecting || bisect
		sp := p.Rescaled(scale)
		if err := d.Ramp(ctx, sp, cfg.RampTimeout); err != nil {
			rep.Steps = append(rep.Steps, Step{Scale: sp.Scale, Reason: err.Error(), Bisect: bisecting})
			return false, true
		}
		var st Step
		for try := range 2 {
			st = measureStep(ctx, d, cfg, rep.Costs, sp)
			st.Bisect = bisecting
			log.Info("step", "scale", fmt.Sprintf("%.3g", sp.Scale), "try", try+1, "bisect", bisecting, "acquires_per_sec", int(st.AcquiresPerSec), "commits_per_sec", int(st.CommitsPerSec),
				"p99_acquire_ms", st.P99AcquireMS, "error_rate", st.ErrorRate, "passed", st.Passed)
			rep.Steps = append(rep.Steps, st)
			if st.Passed || ctx.Err() != nil {
				break
			}
		}
		if st.Passed {
			if b, ok := rep.best(); !ok || b.Scale <= st.Scale {
				c, a := st.CommitsPerSec, st.AcquiresPerSec
				rep.MaxCommitsPerSec, rep.MaxAcquiresPerSec = &c, &a
			}
		}
		return st.Passed, ctx.Err() != nil
	})
}

// measureStep runs profile sp's steady phase for cfg.Duration on the
// driver, ramped to sp already, and summarises it (step) with what it
// cost and its writes at costs. The meter's samples fall outside the
// step's window: no load is offered while they are taken.
func measureStep(ctx context.Context, d *Driver, cfg Config, costs Costs, sp Profile) Step {
	before := cfg.Meter.sample(ctx)
	from := d.Elapsed()
	d.Steady(ctx, sp, cfg.Duration)
	to := d.Elapsed()
	after := cfg.Meter.sample(ctx)
	st := step(d, sp, from, to, cfg)
	st.Usage = cfg.Meter.usage(before, after, st.CommitsPerSec)
	st.WritesPerSec = writes(costs, st.Ops) / (st.ToS - st.FromS)
	return st
}

// search is find-max's order of scales: from start, up by factor until
// probe fails one or maxSteps scales were probed; then, between the last
// scale that passed and the first that failed, the geometric middle of
// the two, until they are within precision of each other (hi/lo ≤
// 1+precision; a precision below 0 skips this). probe runs a scale (bisect
// says the stepping is over) and says whether it passed, and whether the
// search must stop at once (a ramp that failed, an interrupted run). It
// returns the highest scale that passed, 0 if none did.
func search(start, factor, precision float64, maxSteps int, probe func(scale float64, bisect bool) (passed, stop bool)) float64 {
	lo, hi := 0.0, 0.0
	for i := range maxSteps {
		scale := start * pow(factor, i)
		passed, stop := probe(scale, false)
		if stop {
			if passed {
				lo = scale
			}
			return lo
		}
		if !passed {
			hi = scale
			break
		}
		lo = scale
	}
	if lo == 0 || hi == 0 || precision < 0 {
		return lo // none passed, or none failed
	}
	for hi/lo > 1+precision {
		mid := math.Sqrt(lo * hi)
		passed, stop := probe(mid, true)
		if passed {
			lo = mid
		} else {
			hi = mid
		}
		if stop {
			break
		}
	}
	return lo
}

func pow(f float64, n int) float64 {
	r := 1.0
	for range n {
		r *= f
	}
	return r
}

// step summarises [from, to) of the driver's time axis.
func step(d *Driver, p Profile, from, to time.Duration, cfg Config) Step {
	// Whole seconds inside the window: the first partial second is left out.
	f, t := int(from/time.Second)+1, int(to/time.Second)
	span := float64(t - f)
	if span <= 0 {
		span = 1
	}
	ops := d.rec.Summary(f, t)
	acq := ops[OpAcquire]
	st := Step{
		Scale:          p.Scale,
		FromS:          float64(f),
		ToS:            float64(t),
		AcquiresPerSec: float64(acq.Count) / span,
		CommitsPerSec:  float64(d.rec.Successes(f, t, stateChanges...)) / span,
		P99AcquireMS:   acq.P99MS,
		Ops:            ops,
	}
	var bad, all int64
	for _, s := range ops {
		for code, n := range s.Errors {
			if failure(code) {
				bad += n
			}
		}
		all += s.Count
	}
	if all+bad > 0 {
		st.ErrorRate = float64(bad) / float64(all+bad)
	}
	switch {
	case st.P99AcquireMS > float64(cfg.MaxP99.Milliseconds()):
		st.Reason = fmt.Sprintf("p99 acquire %.1f ms > %d ms", st.P99AcquireMS, cfg.MaxP99.Milliseconds())
	case st.ErrorRate > cfg.MaxErrorRate:
		st.Reason = fmt.Sprintf("error rate %.4f > %.4f", st.ErrorRate, cfg.MaxErrorRate)
	case st.AcquiresPerSec < 0.9*p.AcquireRate:
		st.Reason = fmt.Sprintf("%.0f acquires/s granted of %.0f offered", st.AcquiresPerSec, p.AcquireRate)
	default:
		st.Passed = true
	}
	return st
}

// writes is the target's replicated writes for ops.
func writes(c Costs, ops opSummary) float64 {
	return c.Acquire*float64(ops[OpAcquire].Count+ops[OpAcquireContended].Count) +
		c.Renew*float64(ops[OpRenew].Count) + c.Release*float64(ops[OpRelease].Count) +
		c.Quota*float64(ops[OpReserve].Count+ops[OpCommit].Count+ops[OpReleaseQuota].Count)
}

// Validate checks cfg before anything runs: errors name the setting.
func (cfg Config) Validate() error {
	switch {
	case cfg.Duration <= 0:
		return fmt.Errorf("duration: must be positive, got %s", cfg.Duration)
	case cfg.FindMax && cfg.StepFactor != 0 && cfg.StepFactor <= 1:
		return fmt.Errorf("step-factor: must be above 1, got %v", cfg.StepFactor)
	case cfg.Precision > 1 || math.IsNaN(cfg.Precision):
		return fmt.Errorf("precision: must be at most 1 (below 0: no bisection), got %v", cfg.Precision)
	}
	for _, f := range cfg.Faults {
		if !slices.Contains(FaultKinds, f.Kind) {
			return fmt.Errorf("fault %s@%s: unknown kind (%s)", f.Kind, f.At, strings.Join(FaultKinds, ", "))
		}
		if !cfg.FindMax && f.At >= cfg.Duration {
			return fmt.Errorf("fault %s@%s: at or past the end of the measured phase (duration %s)", f.Kind, f.At, cfg.Duration)
		}
	}
	return nil
}
