//go:build linux

package nemesis

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// A lock model for porcupine over the workload's hot resources. Unlike
// router's lease model (whose server clock is the test's own and whose
// expiry it infers from the TTL), it takes each lease's expiry from the
// server's expires_at, and it admits calls whose outcome is unknown:
// such a call may take effect at any moment after its invoke (its
// Return is the end of time), an unknown Acquire as a grant to a holder
// nobody knows, an unknown Renew as an expiry nobody knows, an unknown
// Release (or one answered released: false) as a release or nothing.
// Times are nanoseconds of the Unix clock; margin and skew as for
// checkLeases.

const never = math.MaxInt64

type lockState struct {
	holder string // lease id; "" free; "?" a grant whose lease nobody knows
	token  uint64 // the holder's token, or the last one (a lower bound for "?")
	// The holder's lease ends in [expLow, expHigh] on the server's clock
	// (never: no bound known).
	expLow, expHigh int64
}

type lockIn struct {
	kind  string // acquire, renew, release, describe
	res   string
	lease string // renew, release
	call  int64
}

type lockOut struct {
	known   bool // the answer was learned (for release: released: true)
	ok      bool
	lease   string
	token   uint64
	expires int64 // acquire, renew: expires_at
	held    bool  // describe
	ret     int64
}

// after is a + d, saturating at never.
func after(a int64, d time.Duration) int64 {
	if a == never || a > never-int64(d) {
		return never
	}
	return a + int64(d)
}

// lockModel is the model for a cluster whose max_clock_skew is skew and
// whose node clocks are within margin of the test's.
func lockModel(skew, margin time.Duration) porcupine.NondeterministicModel {
	// mayEnd: the lease may have ended, and the lock be grantable, by t.
	mayEnd := func(st lockState, t int64) bool {
		return st.holder == "" || st.holder == "?" || after(t, margin) >= after(st.expLow, skew)
	}
	// mayHold: the lease may still keep others out at t.
	mayHold := func(st lockState, t int64) bool {
		return st.holder != "" && (st.holder == "?" || t <= after(st.expHigh, skew+margin))
	}
	return porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			var keys []string
			for _, o := range h {
				r := o.Input.(lockIn).res
				if _, ok := by[r]; !ok {
					keys = append(keys, r)
				}
				by[r] = append(by[r], o)
			}
			var out [][]porcupine.Operation
			for _, k := range keys {
				out = append(out, by[k])
			}
			return out
		},
		Init: func() []any { return []any{lockState{}} },
		Step: func(s, in, out any) []any {
			st, i, o := s.(lockState), in.(lockIn), out.(lockOut)
			freed := lockState{token: st.token}
			switch i.kind {
			case "acquire":
				switch {
				case !o.known:
					return []any{st, lockState{holder: "?", token: st.token, expLow: 0, expHigh: never}}
				case o.ok:
					if o.token <= st.token || !mayEnd(st, o.ret) {
						return nil
					}
					return []any{lockState{holder: o.lease, token: o.token, expLow: o.expires, expHigh: o.expires}}
				case mayHold(st, i.call):
					return []any{st}
				}
			case "renew":
				switch {
				case !o.known:
					if st.holder == i.lease {
						st2 := st
						st2.expHigh = never
						return []any{st, st2}
					}
					return []any{st}
				case o.ok:
					if st.holder != i.lease || i.call > after(st.expHigh, margin) {
						return nil
					}
					st.expLow, st.expHigh = o.expires, o.expires
					return []any{st}
				case st.holder != i.lease || after(o.ret, margin) >= st.expLow:
					return []any{st}
				}
			case "release":
				switch {
				case !o.known:
					if st.holder == i.lease {
						return []any{st, freed}
					}
					return []any{st}
				case st.holder == i.lease && i.call <= after(st.expHigh, margin):
					return []any{freed}
				}
			case "describe":
				switch {
				case o.token < st.token:
				case o.token > st.token:
					if st.holder == "?" { // the unknown grant, now seen
						h := lockState{holder: "?", token: o.token, expLow: o.expires, expHigh: o.expires}
						if !o.held {
							h.holder = ""
						}
						return []any{h}
					}
				case st.holder == "?":
					// The unknown grant has a higher token: not yet made.
				case o.held && mayHold(st, i.call):
					return []any{st}
				case !o.held && mayEnd(st, o.ret):
					return []any{freed}
				}
			}
			return nil
		},
		DescribeOperation: func(in, out any) string { return fmt.Sprintf("%+v -> %+v", in, out) },
	}
}

// lockOperations turns the history's calls on the hot resources into
// porcupine's operations: a call whose outcome is unknown returns never,
// a Describe whose answer was lost is left out (a read changes nothing).
func lockOperations(ops []op, hot []string) []porcupine.Operation {
	var out []porcupine.Operation
	for _, o := range ops {
		if o.client < 0 || !slices.Contains(hot, o.res) {
			continue
		}
		in := lockIn{kind: o.kind, res: o.res, lease: o.lease, call: o.invoke.UnixNano()}
		res := lockOut{known: o.outcome == okOutcome || o.outcome == refused, ok: o.outcome == okOutcome, lease: o.lease,
			token: o.token, held: o.held, ret: o.done.UnixNano()}
		if !o.expires.IsZero() {
			res.expires = o.expires.UnixNano()
		}
		ret := res.ret
		switch {
		case o.kind == "describe" && !res.known:
			continue
		case o.kind == "release" && res.known && !o.released:
			res.known = false // released: false counts as unknown (see checkLeases)
		case !res.known:
			ret = never
		}
		out = append(out, porcupine.Operation{ClientId: max(0, o.client), Input: in, Call: in.call, Output: res, Return: ret})
	}
	return out
}

// checkLinearizable checks the lock history with porcupine, for at most
// timeout; a check that runs out of time is reported, not failed.
func checkLinearizable(ops []op, hot []string, cfg checkConfig, timeout time.Duration) (string, []violation) {
	m := lockModel(cfg.skew, cfg.margin)
	res := porcupine.CheckOperationsTimeout(m.ToModel(), lockOperations(ops, hot), timeout)
	switch res {
	case porcupine.Ok:
		return "linearizable", nil
	case porcupine.Illegal:
		return "NOT linearizable", []violation{{"linearizable", time.Now(), "porcupine found no linearization of the lock history"}}
	}
	return fmt.Sprintf("unknown (no answer in %v)", timeout), nil
}
