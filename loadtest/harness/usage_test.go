package harness

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

// TestMeterSamples measures a real process (a busy child of this test)
// through a pids script and a fake server's counters, and checks the
// figures per commit.
func TestMeterSamples(t *testing.T) {
	var scrapes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := scrapes.Add(1)
		// Between the two samples: 5,000 allocations and 50 proposals
		// (a histogram's count), the way Warden exports them.
		fmt.Fprintf(w, "# TYPE go_memstats_mallocs_total counter\ngo_memstats_mallocs_total %d\n", 1000+5000*(n-1))
		fmt.Fprintf(w, "# TYPE warden_proposal_duration_seconds histogram\nwarden_proposal_duration_seconds_bucket{le=\"+Inf\"} %d\nwarden_proposal_duration_seconds_sum 1\nwarden_proposal_duration_seconds_count %d\n", 10+50*(n-1), 10+50*(n-1))
	}))
	defer srv.Close()
	dir := t.TempDir()
	script := filepath.Join(dir, "cluster.sh")
	if err := os.WriteFile(script, []byte(fmt.Sprintf("[[ $1 == pids ]] && echo %d\n", os.Getpid())), 0o755); err != nil {
		t.Fatal(err)
	}
	m := &Meter{PIDs: ScriptPIDs(script), MetricsURLs: []string{srv.URL}, Entries: "warden_proposal_duration_seconds"}
	ctx := context.Background()
	a := m.sample(ctx)
	spin(t, 200*time.Millisecond)
	b := m.sample(ctx)
	if len(a.errs)+len(b.errs) > 0 {
		t.Fatalf("sample errors: %v %v", a.errs, b.errs)
	}
	u := m.usage(a, b, 100/b.at.Sub(a.at).Seconds()) // 100 commits in the window
	if u.Commits < 99.9 || u.Commits > 100.1 {
		t.Fatalf("commits %v, want 100", u.Commits)
	}
	if len(u.Processes) != 1 || u.Processes[0].PID != os.Getpid() || u.Processes[0].RSSBytes <= 0 {
		t.Fatalf("processes %+v, want this one with its RSS", u.Processes)
	}
	// The test used 200 ms of CPU: at least 100 ms of it counted (ticks
	// are 10 ms), which is 1,000 µs a commit.
	if u.NodeCPUMicrosPerCommit < 1000 || u.NodeCPUCores <= 0 || u.GeneratorCPUCores <= 0 {
		t.Fatalf("node %.0f µs/commit (%.2f cores), generator %.2f cores; want ≥ 1,000 µs and cores above 0", u.NodeCPUMicrosPerCommit, u.NodeCPUCores, u.GeneratorCPUCores)
	}
	if u.AllocsPerCommit == nil || math.Abs(*u.AllocsPerCommit-50) > 1e-9 {
		t.Fatalf("allocs/commit %v, want 50", optF(u.AllocsPerCommit, "%v"))
	}
	if u.RaftEntriesPerCommit == nil || math.Abs(*u.RaftEntriesPerCommit-0.5) > 1e-9 {
		t.Fatalf("entries/commit %v, want 0.5", optF(u.RaftEntriesPerCommit, "%v"))
	}
}

// spin keeps a core busy until this process has used d of CPU time
// since the call, so that a machine busy with other tests (which would
// give a spin of fixed length less CPU) cannot thin the premise; it
// fails t if that takes more than 20 s.
func spin(t *testing.T, d time.Duration) {
	t.Helper()
	used := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start, deadline := used(), time.Now().Add(20*time.Second)
	for used()-start < d {
		if time.Now().After(deadline) {
			t.Fatalf("premise: %v of CPU not used within 20 s", d)
		}
		for end := time.Now().Add(time.Millisecond); time.Now().Before(end); {
		}
	}
}

// TestMeterFailures: what cannot be read is named and left out, never
// made up.
func TestMeterFailures(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.sh")
	if err := os.WriteFile(bad, []byte("echo 12x\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m := &Meter{PIDs: ScriptPIDs(bad), MetricsURLs: []string{"http://127.0.0.1:1/metrics"}, Entries: "x"}
	s := m.sample(context.Background())
	joined := strings.Join(s.errs, "; ")
	if !strings.Contains(joined, `"12x" is not a pid`) || !strings.Contains(joined, "127.0.0.1:1") {
		t.Fatalf("errors %q, want the bad pid and the unreachable server named", joined)
	}
	u := m.usage(s, s, 10)
	if u.AllocsPerCommit != nil || u.RaftEntriesPerCommit != nil || len(u.Errors) != 4 {
		t.Fatalf("usage %+v: want no counters and both samples' 2 errors each", u)
	}
	// A process the start's sample could not read is left out, not
	// counted whole as if it had started during the phase; one the
	// start's sample listed without it started meanwhile and counts.
	self := os.Getpid()
	end := usageSample{at: time.Unix(10, 0), procs: map[int]procSample{self: {cpuS: 100}}, pidsRead: true}
	for _, c := range []struct {
		name  string
		start usageSample
		want  int
	}{
		{"pid list failed", usageSample{at: time.Unix(0, 0)}, 0},
		{"pid unread", usageSample{at: time.Unix(0, 0), pidsRead: true, unread: map[int]bool{self: true}}, 0},
		{"started meanwhile", usageSample{at: time.Unix(0, 0), pidsRead: true}, 1},
	} {
		if u := m.usage(c.start, end, 10); len(u.Processes) != c.want {
			t.Errorf("%s: %d processes counted (%v), want %d", c.name, len(u.Processes), u.Errors, c.want)
		}
	}
	if _, err := readProc(1 << 30); err == nil {
		t.Fatal("readProc of a pid that cannot exist: no error")
	}
	var nilMeter *Meter // the generator alone
	if u := nilMeter.usage(nilMeter.sample(context.Background()), nilMeter.sample(context.Background()), 1); len(u.Processes) != 0 || u.AllocsPerCommit != nil {
		t.Fatalf("a nil Meter measured servers: %+v", u)
	}
}

func TestMachineShares(t *testing.T) {
	a := procfs.CPUStat{User: 1, System: 0.5, Idle: 8, Iowait: 0.1, SoftIRQ: 0.05, Steal: 0.35}
	b := procfs.CPUStat{User: 2, System: 0.7, Idle: 9, Iowait: 0.1, SoftIRQ: 0.05, Steal: 1.35}
	u := (&Meter{}).usage(usageSample{machine: a, at: time.Unix(0, 0)}, usageSample{machine: b, at: time.Unix(1, 0)}, 1)
	// 3.2 s passed: 1.2 busy (user 1, system 0.2), 1 idle, 1 stolen.
	const eps = 1e-9
	if math.Abs(u.MachineBusy-1.2/3.2) > eps || math.Abs(u.MachineSteal-1/3.2) > eps {
		t.Fatalf("busy %v steal %v, want %v and %v", u.MachineBusy, u.MachineSteal, 1.2/3.2, 1/3.2)
	}
	if machineCPU().Idle <= 0 {
		t.Fatal("this machine's /proc/stat read no idle time")
	}
}

func TestCounterDelta(t *testing.T) {
	for _, c := range []struct {
		a, b    []float64
		largest bool
		want    float64
		ok      bool
	}{
		{[]float64{10, 20}, []float64{15, 40}, false, 25, true},
		{[]float64{10, 20}, []float64{15, 40}, true, 20, true},
		{[]float64{100, 20}, []float64{30, 40}, false, 50, true}, // the first restarted: 30 since
		{[]float64{-1, 20}, []float64{30, -1}, false, 0, false},  // no server read twice
	} {
		got, ok := counterDelta(c.a, c.b, c.largest)
		if got != c.want || ok != c.ok {
			t.Errorf("counterDelta(%v, %v, %v) = %v, %v; want %v, %v", c.a, c.b, c.largest, got, ok, c.want, c.ok)
		}
	}
}

// TestComparisonMedian: with three runs, each target's row is its median
// run's, and every run's max is listed.
func TestComparisonMedian(t *testing.T) {
	run := func(target string, scale, commits float64) *Report {
		return &Report{Target: target, Profile: Reference(0.125), Steps: []Step{
			{Scale: 1, CommitsPerSec: 6000, Passed: scale >= 1, Usage: &Usage{NodeCPUMicrosPerCommit: 210, NodeCPUCores: 1.3, GeneratorCPUCores: 0.3, NodeRSSBytes: 300e6}},
			{Scale: scale, CommitsPerSec: commits, AcquiresPerSec: commits / 3, Passed: true},
		}}
	}
	reps := []*Report{
		run("warden", 2, 12000), run("zk", 0.7, 4200),
		run("warden", 2.4, 14400), run("zk", 0.6, 3600),
		run("warden", 1.7, 10200), run("zk", 0.8, 4800),
	}
	runs, err := GroupRuns(reps, 3)
	if err != nil || len(runs) != 3 {
		t.Fatalf("GroupRuns: %d runs, %v", len(runs), err)
	}
	var b strings.Builder
	WriteComparison(&b, runs)
	out := b.String()
	for _, want := range []string{
		"| warden | 2 | 4000 | 12000 |", "| 2, 2.4, 1.7 |", // the median run, then each run's max
		"| zk | 0.7 | 1400 | 4200 |", "| 0.7, 0.6, 0.8 |",
		"| zk | 2.86× | 2.86× |",
		"| warden | ref ×1 | 210.0 | 1.30 | 0.30 | – | – | 300 |",
		"| zk | ref ×1 | 210.0 |", // a failed step's cost still shows
	} {
		if !strings.Contains(out, want) {
			t.Errorf("comparison lacks %q:\n%s", want, out)
		}
	}
	if _, err := GroupRuns([]*Report{run("warden", 1, 1), run("zk", 1, 1), run("warden", 1, 1), run("etcd", 1, 1)}, 2); err == nil || !strings.Contains(err.Error(), "run 2 has targets warden etcd, want warden zk") {
		t.Fatalf("GroupRuns of mismatched runs: %v", err)
	}
	// Two runs of one target compared side by side (two configurations)
	// stay two rows in one run.
	if runs, err := GroupRuns([]*Report{run("warden", 1, 1), run("warden", 2, 2)}, 1); err != nil || len(runs) != 1 || len(runs[0]) != 2 {
		t.Fatalf("GroupRuns of one run of two Warden reports: %v, %v", runs, err)
	}
	if _, err := GroupRuns(reps, 4); err == nil {
		t.Fatal("6 reports grouped into 4 runs")
	}
}
