package harness

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Operation names, as they appear under ops in report.json.
const (
	OpAcquire          = "acquire"           // uncontended acquire (wait 0)
	OpAcquireContended = "acquire_contended" // acquire that queues behind a holder
	OpHandoff          = "handoff"           // a holder's release sent → the next waiter's grant received
	OpRenew            = "renew"
	OpRelease          = "release"
	OpReserve          = "reserve"
	OpCommit           = "commit"
	OpReleaseQuota     = "release_reservation"
)

// Latencies are recorded in microseconds, from 1 µs to 2 minutes, to three
// significant digits over the whole run and two per one-second interval.
const (
	histMinUS = 1
	histMaxUS = int64(2 * time.Minute / time.Microsecond)
)

// opStats is one operation's record: the whole run's histogram, the
// per-second histograms for the chart, successes and errors by code.
type opStats struct {
	all      *hdrhistogram.Histogram
	perSec   map[int]*hdrhistogram.Histogram
	okPerSec map[int]int64
	errs     map[int]map[string]int64 // by second, then code
}

// Recorder collects every operation's latency and outcome. Latencies are
// measured from the moment the open-loop schedule meant the operation to
// start, not from when it could start, so a stalled service cannot hide
// its queueing (no coordinated omission). It is safe for concurrent use.
type Recorder struct {
	mu    sync.Mutex
	start time.Time
	ops   map[string]*opStats
}

// NewRecorder returns a recorder whose time axis starts at start.
func NewRecorder(start time.Time) *Recorder {
	return &Recorder{start: start, ops: map[string]*opStats{}}
}

func (r *Recorder) stats(op string) *opStats {
	s := r.ops[op]
	if s == nil {
		s = &opStats{
			all:      hdrhistogram.New(histMinUS, histMaxUS, 3),
			perSec:   map[int]*hdrhistogram.Histogram{},
			okPerSec: map[int]int64{},
			errs:     map[int]map[string]int64{},
		}
		r.ops[op] = s
	}
	return s
}

// Record adds one operation that was scheduled at intended and finished at
// done. A nil err is a success; an error is counted under ErrorCode(err).
// Only successes enter the latency histograms.
func (r *Recorder) Record(op string, intended, done time.Time, err error) {
	us := done.Sub(intended).Microseconds()
	us = max(histMinUS, min(us, histMaxUS))
	sec := int(done.Sub(r.start) / time.Second)
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats(op)
	if err != nil {
		if s.errs[sec] == nil {
			s.errs[sec] = map[string]int64{}
		}
		s.errs[sec][ErrorCode(err)]++
		return
	}
	s.okPerSec[sec]++
	_ = s.all.RecordValue(us) // in range by the clamp above
	h := s.perSec[sec]
	if h == nil {
		h = hdrhistogram.New(histMinUS, histMaxUS, 2)
		s.perSec[sec] = h
	}
	_ = h.RecordValue(us)
}

// ErrorCode names an error for the report: ErrHeld is "held", ErrLost
// "lost", ErrExhausted "exhausted", a Coder its code, a context deadline "deadline_exceeded",
// anything else "other".
func ErrorCode(err error) string {
	var c Coder
	switch {
	case errors.Is(err, ErrHeld):
		return "held"
	case errors.Is(err, ErrLost):
		return "lost"
	case errors.Is(err, ErrExhausted):
		return "exhausted"
	case errors.As(err, &c):
		return c.Code()
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "other"
}

// OpSummary is one operation's line in report.json: counts, latency
// percentiles in milliseconds, and errors by code.
type OpSummary struct {
	Count  int64            `json:"count"`
	P50MS  float64          `json:"p50_ms"`
	P95MS  float64          `json:"p95_ms"`
	P99MS  float64          `json:"p99_ms"`
	MaxMS  float64          `json:"max_ms"`
	Errors map[string]int64 `json:"errors"`
}

// failure says whether an error code counts against the error rate:
// "held" and "exhausted" are refusals, answers rather than failures.
func failure(code string) bool { return code != "held" && code != "exhausted" }

func msOf(us int64) float64 { return float64(us) / 1000 }

// Summary returns every operation's summary over successes whose finish
// time lies in [from, to) seconds of the time axis, or all of them when
// to is 0.
func (r *Recorder) Summary(from, to int) map[string]OpSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]OpSummary{}
	for name, s := range r.ops {
		h := s.all
		if to > 0 {
			h = hdrhistogram.New(histMinUS, histMaxUS, 2)
			for sec, sh := range s.perSec {
				if sec >= from && sec < to {
					h.Merge(sh)
				}
			}
		}
		errs := map[string]int64{}
		for sec, codes := range s.errs {
			if to == 0 || sec >= from && sec < to {
				for c, n := range codes {
					errs[c] += n
				}
			}
		}
		out[name] = OpSummary{
			Count:  h.TotalCount(),
			P50MS:  msOf(h.ValueAtQuantile(50)),
			P95MS:  msOf(h.ValueAtQuantile(95)),
			P99MS:  msOf(h.ValueAtQuantile(99)),
			MaxMS:  msOf(h.Max()),
			Errors: errs,
		}
	}
	return out
}

// Point is one second of one operation on the chart.
type Point struct {
	Second int     `json:"s"`
	Count  int64   `json:"count"`
	P50MS  float64 `json:"p50_ms"`
	P99MS  float64 `json:"p99_ms"`
}

// Series returns op's per-second points in time order.
func (r *Recorder) Series(op string) []Point {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.ops[op]
	if s == nil {
		return nil
	}
	var pts []Point
	for sec, h := range s.perSec {
		pts = append(pts, Point{Second: sec, Count: s.okPerSec[sec], P50MS: msOf(h.ValueAtQuantile(50)), P99MS: msOf(h.ValueAtQuantile(99))})
	}
	sort.Slice(pts, func(i, j int) bool { return pts[i].Second < pts[j].Second })
	return pts
}

// Successes returns how many operations named in ops succeeded with a
// finish time in [from, to) seconds.
func (r *Recorder) Successes(from, to int, ops ...string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	for _, op := range ops {
		if s := r.ops[op]; s != nil {
			for sec, c := range s.okPerSec {
				if sec >= from && sec < to {
					n += c
				}
			}
		}
	}
	return n
}
