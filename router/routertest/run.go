package routertest

import (
	"fmt"
	"testing"
	"testing/synctest"
)

// Run runs sim once for each seed, each as a subtest in a synctest
// bubble of its own, then check (outside the bubble, so that a check's
// own time limit is real time) with what sim returned, and returns the
// counts sim reported, summed over the runs. Each subtest is named for
// its seed, and logs it first, so a failure shows what to replay.
func Run[H any](t *testing.T, seeds []uint64, sim func(t *testing.T, seed uint64) (H, map[string]int), check func(t *testing.T, seed uint64, h H)) map[string]int {
	total := map[string]int{}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Logf("seed %d", seed)
			var h H
			var counts map[string]int
			synctest.Test(t, func(t *testing.T) { h, counts = sim(t, seed) })
			t.Logf("seed %d: %v", seed, counts)
			for k, v := range counts {
				total[k] += v
			}
			check(t, seed, h)
		})
	}
	return total
}

// Happened fails t when one of kinds never happened in total (Run's
// counts) although at least min seeds ran: the premise that the runs
// exercised what they claim to.
func Happened(t *testing.T, total map[string]int, seeds, min int, kinds ...string) {
	if t.Failed() || seeds < min {
		return
	}
	for _, k := range kinds {
		if total[k] == 0 {
			t.Errorf("no %q in %d runs: the simulation did not exercise it (%v)", k, seeds, total)
		}
	}
}
