//go:build linux

package nemesis

import (
	"testing"
	"time"
)

// The checkers catch what they are meant to: each case is a hand-made
// history, bad or good, and the rules it must break (none for a good one).
func TestCheckersCatchViolations(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	grant := func(lease string, token uint64, invoke, done, expires int) op {
		return op{kind: "acquire", res: "r", lease: lease, token: token, invoke: at(invoke), done: at(done), expires: at(expires), outcome: okOutcome}
	}
	release := func(lease string, invoke, done int, released bool) op {
		return op{kind: "release", res: "r", lease: lease, invoke: at(invoke), done: at(done), released: released, outcome: okOutcome}
	}
	describe := func(invoke, done int, held bool, token uint64) op {
		return op{kind: "describe", res: "r", invoke: at(invoke), done: at(done), held: held, token: token, outcome: okOutcome}
	}
	renew := func(lease string, invoke, done, expires int) op {
		return op{kind: "renew", res: "r", lease: lease, invoke: at(invoke), done: at(done), expires: at(expires), outcome: okOutcome}
	}
	cfg := checkConfig{skew: 500 * time.Millisecond, margin: 50 * time.Millisecond}
	for _, tc := range []struct {
		name string
		ops  []op
		want []string // the rules broken
	}{
		{"second grant inside the first lease", []op{grant("a", 1, 0, 10, 2000), grant("b", 2, 1000, 1010, 3000)}, []string{"one holder"}},
		{"second grant inside the skew bound", []op{grant("a", 1, 0, 10, 2000), grant("b", 2, 2200, 2210, 4200)}, []string{"one holder"}},
		{"second grant after expiry and skew", []op{grant("a", 1, 0, 10, 2000), grant("b", 2, 2460, 2470, 4470)}, nil},
		{"second grant after a release was tried", []op{grant("a", 1, 0, 10, 2000), release("a", 500, 3000, false), grant("b", 2, 600, 610, 2610)}, nil},
		{"renewal extends the lease", []op{grant("a", 1, 0, 10, 2000), renew("a", 1000, 1010, 3010), grant("b", 2, 2600, 2610, 4610)}, []string{"one holder"}},
		{"renewal after the next grant", []op{grant("a", 1, 0, 10, 2000), grant("b", 2, 2600, 2610, 4610), renew("a", 2700, 2710, 4710)}, []string{"one holder"}},
		{"token lower than an earlier grant's", []op{grant("a", 5, 0, 10, 100), grant("b", 4, 3000, 3010, 5010)}, []string{"tokens", "one holder"}},
		{"token repeated", []op{grant("a", 1, 0, 10, 100), grant("b", 1, 3000, 3010, 5010)}, []string{"tokens"}},
		{"grant not visible", []op{grant("a", 1, 0, 10, 2000), describe(500, 510, false, 1)}, []string{"visibility"}},
		{"token goes back", []op{grant("a", 7, 0, 10, 100), describe(3000, 3010, false, 6)}, []string{"visibility"}},
		{"grant visible", []op{grant("a", 1, 0, 10, 2000), describe(500, 510, true, 1)}, nil},
		{"release undone", []op{grant("a", 1, 0, 10, 2000), release("a", 100, 110, true), describe(200, 210, true, 1)}, []string{"releases"}},
		{"renewed after its release", []op{grant("a", 1, 0, 10, 2000), release("a", 100, 110, true), renew("a", 200, 210, 2210)}, []string{"releases"}},
		{"released: false is unknown", []op{grant("a", 1, 0, 10, 2000), release("a", 100, 110, false), describe(200, 210, false, 1)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]bool{}
			for _, v := range checkLeases(tc.ops, cfg) {
				got[v.rule] = true
			}
			// porcupine's lock model finds the same histories bad.
			_, lin := checkLinearizable(tc.ops, []string{"r"}, cfg, 10*time.Second)
			if (len(lin) > 0) != (len(tc.want) > 0) {
				t.Errorf("porcupine: %v, want a violation: %v", lin, len(tc.want) > 0)
			}
			want := map[string]bool{}
			for _, r := range tc.want {
				want[r] = true
			}
			if len(got) != len(want) {
				t.Fatalf("broken rules %v, want %v", got, want)
			}
			for r := range want {
				if !got[r] {
					t.Fatalf("broken rules %v, want %v", got, want)
				}
			}
		})
	}

	// Calls of unknown outcome may explain what the known ones saw.
	lost := op{kind: "acquire", res: "r", invoke: at(2600), done: at(5600), outcome: unknown}
	for _, tc := range []struct {
		name string
		ops  []op
		bad  bool
	}{
		{"a token from an unknown grant", []op{grant("a", 1, 0, 10, 2000), lost, describe(3000, 3010, true, 2)}, false},
		{"a token from nowhere", []op{grant("a", 1, 0, 10, 2000), describe(3000, 3010, true, 2)}, true},
		// Seen once, an unknown grant is the holder, under its token, for
		// every later Describe until it ends (a run in CI failed here: the
		// second Describe found the grant "not made yet").
		{"an unknown grant seen twice", []op{grant("a", 1, 0, 10, 2000), lost, describe(3000, 3010, true, 2), describe(3500, 3510, true, 2)}, false},
		// Its caller's router may cancel it (the caller gave up), so it
		// may end before its expires_at.
		{"an unknown grant cancelled early", []op{grant("a", 1, 0, 10, 2000), lost,
			{kind: "describe", res: "r", invoke: at(3000), done: at(3010), held: true, token: 2, expires: at(5000), outcome: okOutcome},
			grant("b", 3, 3100, 3110, 5110)}, false},
		{"an unknown grant seen, then a lower token", []op{grant("a", 1, 0, 10, 2000), lost, describe(3000, 3010, true, 2), describe(3500, 3510, true, 1)}, true},
		{"a lost release explains a free lock", []op{grant("a", 1, 0, 10, 2000), {kind: "release", res: "r", lease: "a", invoke: at(100), done: at(3100), outcome: unknown}, describe(500, 510, false, 1)}, false},
	} {
		if _, vs := checkLinearizable(tc.ops, []string{"r"}, cfg, 10*time.Second); (len(vs) > 0) != tc.bad {
			t.Errorf("porcupine, %s: %v, want a violation: %v", tc.name, vs, tc.bad)
		}
	}

	w := []window{{from: at(1000), to: at(5000), minority: map[int]bool{0: true}}}
	for _, tc := range []struct {
		name string
		o    op
		bad  bool
	}{
		{"grant on the minority", op{kind: "acquire", node: 0, invoke: at(1500), done: at(1600), outcome: okOutcome}, true},
		{"release on the minority", op{kind: "release", node: 0, invoke: at(1500), done: at(1600), outcome: okOutcome, released: true}, true},
		{"grant on the majority", op{kind: "acquire", node: 1, invoke: at(1500), done: at(1600), outcome: okOutcome}, false},
		{"minority refuses", op{kind: "acquire", node: 0, invoke: at(1500), done: at(1600), outcome: unavailable}, false},
		{"answered after the heal", op{kind: "renew", node: 0, invoke: at(4500), done: at(5100), outcome: okOutcome}, false},
		{"invoked before the cut", op{kind: "renew", node: 0, invoke: at(900), done: at(1100), outcome: okOutcome}, false},
	} {
		if got := len(checkMinority([]op{tc.o}, w)) > 0; got != tc.bad {
			t.Errorf("%s: violation %v, want %v", tc.name, got, tc.bad)
		}
	}

	reserve := func(id string, amount int64, invoke, done, expires int) qop {
		return qop{kind: "reserve", pool: "p", id: id, amount: amount, invoke: at(invoke), done: at(done), expires: at(expires), outcome: okOutcome}
	}
	end := func(kind, id string, amount int64, invoke, done int) qop {
		return qop{kind: kind, pool: "p", id: id, amount: amount, invoke: at(invoke), done: at(done), outcome: okOutcome}
	}
	for _, tc := range []struct {
		name string
		ops  []qop
		bad  bool
	}{
		{"two live reservations over the limit", []qop{reserve("a", 3, 0, 10, 2000), reserve("b", 2, 20, 30, 2030)}, true},
		{"a commit and a live reservation over the limit", []qop{reserve("a", 3, 0, 10, 2000), end("commit", "a", 3, 20, 30), reserve("b", 2, 40, 50, 2050)}, true},
		{"the first released before the second", []qop{reserve("a", 3, 0, 10, 2000), end("release", "a", 3, 15, 300), reserve("b", 2, 20, 30, 2030)}, false},
		{"the first expired before the second", []qop{reserve("a", 3, 0, 10, 2000), reserve("b", 2, 2000, 2010, 4010)}, false},
		{"within the limit", []qop{reserve("a", 2, 0, 10, 2000), end("commit", "a", 2, 20, 30), reserve("b", 2, 40, 50, 2050)}, false},
	} {
		if got := len(checkPool(tc.ops, "p", 4, 50*time.Millisecond)) > 0; got != tc.bad {
			t.Errorf("%s: violation %v, want %v", tc.name, got, tc.bad)
		}
	}
}
