package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/procfs"
)

// Meter samples what a run costs: the CPU time and resident memory of the
// target's server processes and of the generator itself, and counters the
// servers export in Prometheus's text format. Run takes a sample before
// and after each measured phase (each find-max try, or the steady phase)
// and reports the difference as Usage.
type Meter struct {
	// PIDs lists the target's server processes (ScriptPIDs reads them
	// from a cluster script); nil measures the generator alone.
	PIDs func(ctx context.Context) ([]int, error)
	// MetricsURLs are the servers' Prometheus endpoints (a Warden node's
	// or an etcd member's /metrics); none for ZooKeeper.
	MetricsURLs []string
	// Client fetches MetricsURLs (TLS, a bearer token); nil is
	// http.DefaultClient.
	Client *http.Client
	// Entries is the counter that counts the target's Raft log entries,
	// and EntriesPerNode says each server counts the whole log (etcd's
	// committed proposals: the largest count is the log's) rather than
	// its own share (Warden's proposals, made on the shard leader's node:
	// the sum is the log's).
	Entries        string
	EntriesPerNode bool
}

// Allocations are counted by the Go runtime's go_memstats_mallocs_total,
// which Warden and etcd export; a server in another language (ZooKeeper)
// reports none.
const mallocsMetric = "go_memstats_mallocs_total"

// ScriptPIDs returns a Meter.PIDs that runs `bash script pids` (the
// cluster scripts print one running server's pid a line).
func ScriptPIDs(script string) func(ctx context.Context) ([]int, error) {
	return func(ctx context.Context) ([]int, error) {
		out, err := exec.CommandContext(ctx, "bash", script, "pids").Output()
		if err != nil {
			return nil, fmt.Errorf("%s pids: %w", script, err)
		}
		var pids []int
		for _, f := range strings.Fields(string(out)) {
			pid, err := strconv.Atoi(f)
			if err != nil || pid <= 0 {
				return nil, fmt.Errorf("%s pids: %q is not a pid", script, f)
			}
			pids = append(pids, pid)
		}
		return pids, nil
	}
}

// ProcessUsage is one server process over a measured phase.
type ProcessUsage struct {
	PID int `json:"pid"`
	// CPUS is the process's user and system CPU time in the phase, in
	// seconds; CPUMicrosPerCommit divides it by the phase's commits.
	CPUS               float64 `json:"cpu_s"`
	CPUMicrosPerCommit float64 `json:"cpu_us_per_commit"`
	// RSSBytes is its resident set at the end of the phase.
	RSSBytes int64 `json:"rss_bytes"`
}

// Usage is what a measured phase cost. Rates are per second of the
// phase's wall time (WallS) and per commit of its acknowledged state
// changes. A process that started during the phase (a restarted node)
// counts all its CPU; one that ended during it counts none of its last
// interval, which /proc no longer shows.
type Usage struct {
	WallS   float64 `json:"wall_s"`
	Commits float64 `json:"commits"`
	// Processes are the target's servers; NodeCPUMicrosPerCommit is their
	// CPU together per commit, and NodeCPUCores their CPU per second.
	Processes              []ProcessUsage `json:"processes,omitempty"`
	NodeCPUMicrosPerCommit float64        `json:"node_cpu_us_per_commit"`
	NodeCPUCores           float64        `json:"node_cpu_cores"`
	NodeRSSBytes           int64          `json:"node_rss_bytes"`
	// GeneratorCPUCores is the load generator's own CPU per second (it
	// shares the machine with the servers).
	GeneratorCPUCores           float64 `json:"generator_cpu_cores"`
	GeneratorCPUMicrosPerCommit float64 `json:"generator_cpu_us_per_commit"`
	// AllocsPerCommit is the servers' heap allocations together per
	// commit; RaftEntriesPerCommit their log entries per commit (below 1:
	// commands batched into one entry). Absent when the servers do not
	// export the counter.
	AllocsPerCommit      *float64 `json:"allocs_per_commit,omitempty"`
	RaftEntriesPerCommit *float64 `json:"raft_entries_per_commit,omitempty"`
	// MachineBusy and MachineSteal are the shares of the machine's CPU
	// time (all CPUs, from /proc/stat) spent busy (user, system, irq)
	// and stolen by the hypervisor from a virtual machine: a run with
	// much stolen time had fewer cores than the machine shows, and its
	// latencies say more about the host than about the target.
	MachineBusy  float64 `json:"machine_busy"`
	MachineSteal float64 `json:"machine_steal"`
	// Errors are what could not be sampled (the phase's figures leave
	// those parts out).
	Errors []string `json:"errors,omitempty"`
}

type procSample struct {
	cpuS float64
	rss  int64
}

// usageSample is one reading of the Meter.
type usageSample struct {
	at   time.Time
	self float64
	// machine is the CPUs' time by state (machineCPU).
	machine procfs.CPUStat
	procs   map[int]procSample
	// pidsRead: the pid list was read; unread holds the pids whose /proc
	// entry could not be. A process missing from a sample that read
	// both started after it; one missing otherwise is left out.
	pidsRead bool
	unread   map[int]bool
	// counters[name][i] is the counter of MetricsURLs[i] (absent: -1).
	counters map[string][]float64
	errs     []string
}

// sample reads the Meter now; what fails is named in errs.
func (m *Meter) sample(ctx context.Context) usageSample {
	s := usageSample{at: time.Now(), self: selfCPU(), procs: map[int]procSample{}, counters: map[string][]float64{}}
	s.machine = machineCPU()
	if m == nil {
		return s
	}
	if m.PIDs != nil {
		pids, err := m.PIDs(ctx)
		if err != nil {
			s.errs = append(s.errs, err.Error())
		}
		s.pidsRead, s.unread = err == nil, map[int]bool{}
		for _, pid := range pids {
			p, err := readProc(pid)
			if err != nil {
				s.errs = append(s.errs, err.Error())
				s.unread[pid] = true
				continue
			}
			s.procs[pid] = p
		}
	}
	names := []string{mallocsMetric}
	if m.Entries != "" {
		names = append(names, m.Entries)
	}
	for _, n := range names {
		s.counters[n] = slices.Repeat([]float64{-1}, len(m.MetricsURLs))
	}
	for i, u := range m.MetricsURLs {
		fams, err := m.scrape(ctx, u)
		if err != nil {
			s.errs = append(s.errs, err.Error())
			continue
		}
		for _, n := range names {
			if v, ok := counterSum(fams[n]); ok {
				s.counters[n][i] = v
			}
		}
	}
	return s
}

func (m *Meter) scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	c := m.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return fams, nil
}

// counterSum adds up a family's series: a counter's or untyped value, a
// histogram's or summary's observation count.
func counterSum(f *dto.MetricFamily) (float64, bool) {
	if f == nil || len(f.GetMetric()) == 0 {
		return 0, false
	}
	var sum float64
	for _, m := range f.GetMetric() {
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.Summary != nil:
			sum += float64(m.GetSummary().GetSampleCount())
		}
	}
	return sum, true
}

// readProc reads a process's CPU time (user and system) and resident
// set from /proc.
func readProc(pid int) (procSample, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return procSample{}, fmt.Errorf("process %d: %w", pid, err)
	}
	st, err := p.Stat()
	if err != nil {
		return procSample{}, fmt.Errorf("process %d: %w", pid, err)
	}
	return procSample{cpuS: st.CPUTime(), rss: int64(st.ResidentMemory())}, nil
}

// machineCPU is /proc/stat's time of all CPUs by state (zero when it
// cannot be read).
func machineCPU() procfs.CPUStat {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return procfs.CPUStat{}
	}
	st, err := fs.Stat()
	if err != nil {
		return procfs.CPUStat{}
	}
	return st.CPUTotal
}

// cpuTotal is all the time in c (guest time is counted in user already).
func cpuTotal(c procfs.CPUStat) float64 {
	return c.User + c.Nice + c.System + c.Idle + c.Iowait + c.IRQ + c.SoftIRQ + c.Steal
}

// cpuBusy is the time in c neither idle, waiting for I/O nor stolen.
func cpuBusy(c procfs.CPUStat) float64 { return cpuTotal(c) - c.Idle - c.Iowait - c.Steal }

// selfCPU is the generator's own CPU time so far, in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// usage is what happened between samples a and b, in which commitsPerSec
// state changes a second were acknowledged.
func (m *Meter) usage(a, b usageSample, commitsPerSec float64) *Usage {
	wall := b.at.Sub(a.at).Seconds()
	u := &Usage{WallS: wall, Commits: commitsPerSec * wall, Errors: append(slices.Clone(a.errs), b.errs...)}
	if wall <= 0 {
		return u
	}
	per := func(x float64) float64 {
		if u.Commits <= 0 {
			return 0
		}
		return x / u.Commits
	}
	var cpu float64
	for _, pid := range slices.Sorted(maps.Keys(b.procs)) {
		end := b.procs[pid]
		start, ok := a.procs[pid]
		if !ok && (!a.pidsRead || a.unread[pid]) {
			// Not known to be new: its CPU before the phase would count.
			u.Errors = append(u.Errors, fmt.Sprintf("process %d: not read at the start of the phase, left out", pid))
			continue
		}
		d := end.cpuS - start.cpuS // a process started meanwhile: all of it
		cpu += d
		u.NodeRSSBytes += end.rss
		u.Processes = append(u.Processes, ProcessUsage{PID: pid, CPUS: d, CPUMicrosPerCommit: per(d) * 1e6, RSSBytes: end.rss})
	}
	u.NodeCPUCores = cpu / wall
	u.NodeCPUMicrosPerCommit = per(cpu) * 1e6
	if total := cpuTotal(b.machine) - cpuTotal(a.machine); total > 0 {
		u.MachineBusy = (cpuBusy(b.machine) - cpuBusy(a.machine)) / total
		u.MachineSteal = (b.machine.Steal - a.machine.Steal) / total
	}
	self := b.self - a.self
	u.GeneratorCPUCores = self / wall
	u.GeneratorCPUMicrosPerCommit = per(self) * 1e6
	if m == nil || u.Commits <= 0 {
		return u
	}
	if d, ok := counterDelta(a.counters[mallocsMetric], b.counters[mallocsMetric], false); ok {
		v := d / u.Commits
		u.AllocsPerCommit = &v
	}
	if m.Entries != "" {
		if d, ok := counterDelta(a.counters[m.Entries], b.counters[m.Entries], m.EntriesPerNode); ok {
			v := d / u.Commits
			u.RaftEntriesPerCommit = &v
		}
	}
	return u
}

// counterDelta is how much the servers' counters grew: the sum of their
// growths, or with largest the largest. A counter that went down was
// reset (its server restarted) and grew by its new value. It is not ok
// when no server has both readings.
func counterDelta(a, b []float64, largest bool) (float64, bool) {
	var out float64
	ok := false
	for i := range min(len(a), len(b)) {
		if a[i] < 0 || b[i] < 0 {
			continue
		}
		d := b[i] - a[i]
		if d < 0 {
			d = b[i]
		}
		if largest {
			out = max(out, d)
		} else {
			out += d
		}
		ok = true
	}
	return out, ok
}
