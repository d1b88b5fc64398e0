package realtime

import (
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB that keeps what Within reports.
type recorder struct {
	testing.TB
	logs, errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Logf(f string, a ...any) {
	r.logs = append(r.logs, f)
}
func (r *recorder) Errorf(f string, a ...any) {
	r.errs = append(r.errs, f)
}

// Within a bound: logged. Past it: an error on a machine at most as
// loaded as its CPU count, a log naming the load otherwise.
func TestWithin(t *testing.T) {
	r := &recorder{TB: t}
	Within(r, "grant", time.Second, 2*time.Second)
	if len(r.errs) != 0 || len(r.logs) != 1 {
		t.Fatalf("within the bound: errors %q, logs %q", r.errs, r.logs)
	}
	load, cpus, ok := Load()
	if !ok {
		t.Skip("no /proc/loadavg here")
	}
	r = &recorder{TB: t}
	Within(r, "grant", 3*time.Second, 2*time.Second)
	if load > float64(cpus) {
		if len(r.errs) != 0 || len(r.logs) != 1 || !strings.Contains(r.logs[0], "load") {
			t.Fatalf("past the bound at load %.1f on %d CPUs: errors %q, logs %q", load, cpus, r.errs, r.logs)
		}
		return
	}
	if len(r.errs) != 1 {
		t.Fatalf("past the bound at load %.1f on %d CPUs: errors %q, want one", load, cpus, r.errs)
	}
}
