// Package realtime checks the real-time liveness bounds of tests that
// run real clusters (a waiter granted within rule 6's bound after its
// holder's lease expired, a backlog of expired leases gone within
// seconds). Such a bound holds on a machine that gives the test its CPUs;
// on one that is busier than it has CPUs (load average 15 on 2 cores, as
// a developer's machine running other work), the time is the machine's,
// not Warden's. A bound checked here states that assumption: past it on
// a loaded machine, the test logs the figure and the load instead of
// failing. Safety bounds (never granted before the expiry plus the skew
// bound, tokens only increase) never come here: they hold however slow
// the machine, and the tests assert them unconditionally. The speed
// itself is measured by make bench and make loadtest.
package realtime

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Within asserts took <= bound for what, unless the machine is loaded
// past its CPU count (Load), in which case it logs what it saw.
func Within(t testing.TB, what string, took, bound time.Duration) {
	t.Helper()
	if took <= bound {
		t.Logf("%s: %v (bound %v)", what, took.Round(time.Millisecond), bound)
		return
	}
	if load, cpus, ok := Load(); ok && load > float64(cpus) {
		t.Logf("%s: %v, past its %v bound on a machine at load %.1f on %d CPUs; the bound assumes a load of at most the CPU count and is not checked",
			what, took.Round(time.Millisecond), bound, load, cpus)
		return
	}
	t.Errorf("%s: %v, past its bound of %v", what, took.Round(time.Millisecond), bound)
}

// Load returns the machine's one-minute load average (/proc/loadavg) and
// its CPU count; ok is false where the load cannot be read.
func Load() (load float64, cpus int, ok bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, runtime.NumCPU(), false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, runtime.NumCPU(), false
	}
	load, err = strconv.ParseFloat(f[0], 64)
	return load, runtime.NumCPU(), err == nil
}
