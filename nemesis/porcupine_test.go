//go:build linux

package nemesis

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// A lock model for porcupine over the workload's hot resources. Unlike
// router's lease model (whose server clock is the test's own and whose
// expiry it infers from the TTL), it takes each lease's end from the
// server's expires_at. A call whose outcome is unknown (a deadline, a
// transport error, unavailable; a Release answered released: false) is
// not an operation of its own, which would stay open to the end of the
// history and make the search explode: the model lets it take effect
// just before any later call that returned after it was invoked — an
// unknown Acquire as a grant to a holder nobody knows (each at most
// once), an unknown Renew as an expiry nobody knows, an unknown Release
// as the end of its lease. That errs towards finding a linearization,
// never towards a false alarm. Times are nanoseconds of the Unix clock;
// margin and skew as for checkLeases.

const never = math.MaxInt64

type lockState struct {
	// holder is the lease id; "" free; "?" a grant of an unknown Acquire,
	// not seen yet (its token is above token); "!" that grant once a
	// Describe has shown it (token is its token). A "!" lease may end
	// before its expiry: its caller gave up, and its router cancels it.
	holder string
	token  uint64 // the holder's token, or the last one (a lower bound for "?")
	// The holder's lease ends in [expLow, expHigh] on the server's clock
	// (never: no bound known).
	expLow, expHigh int64
	// used counts the unknown Acquires taken as grants.
	used int
}

type lockIn struct {
	kind  string // acquire, renew, release, describe
	res   string
	lease string // renew, release
	call  int64
	// unknown is what the calls of unknown outcome on res invoked before
	// this call returned may have done.
	unknown *unknowns
}

// unknowns are the calls of unknown outcome on one resource invoked
// before the moment at.
type unknowns struct {
	at       int64
	acquires int // unknown Acquires invoked before at
	// renews and releases map a lease id to the first invoke of an
	// unknown Renew, Release of it (shared by the resource's calls).
	renews, releases map[string]int64
}

// renewed and released report whether an unknown Renew, Release of
// lease was invoked before u.at.
func (u *unknowns) renewed(lease string) bool {
	t, ok := u.renews[lease]
	return ok && t < u.at
}

func (u *unknowns) released(lease string) bool {
	t, ok := u.releases[lease]
	return ok && t < u.at
}

type lockOut struct {
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
	// step is one known call's effect on st: the states it may leave.
	step := func(st lockState, i lockIn, o lockOut) []lockState {
		freed := lockState{token: st.token, used: st.used}
		switch i.kind {
		case "acquire":
			switch {
			case o.ok:
				if o.token > st.token && mayEnd(st, o.ret) {
					return []lockState{{holder: o.lease, token: o.token, expLow: o.expires, expHigh: o.expires, used: st.used}}
				}
			case mayHold(st, i.call):
				return []lockState{st}
			}
		case "renew":
			switch {
			case o.ok:
				if st.holder == i.lease && i.call <= after(st.expHigh, margin) {
					st.expLow, st.expHigh = o.expires, o.expires
					return []lockState{st}
				}
			case st.holder != i.lease || after(o.ret, margin) >= st.expLow:
				return []lockState{st}
			}
		case "release":
			if st.holder == i.lease && i.call <= after(st.expHigh, margin) {
				return []lockState{freed}
			}
		case "describe":
			switch {
			case o.token < st.token:
			case o.token > st.token:
				if st.holder == "?" { // the unknown grant, now seen
					h := lockState{holder: "!", token: o.token, expLow: 0, expHigh: o.expires, used: st.used}
					if !o.held {
						h.holder = ""
					}
					return []lockState{h}
				}
			case st.holder == "?":
				// The unknown grant has a higher token: not made yet.
			case o.held && st.holder != "":
				// Held at the shard's time (DESIGN.md §3), which stands
				// still while nothing applies (a restart, an election):
				// until a release or a later grant, not bounded in time.
				return []lockState{st}
			case !o.held && mayEnd(st, o.ret):
				return []lockState{freed}
			}
		}
		return nil
	}
	// before is st and every state the unknown calls of u may have led
	// it to.
	before := func(st lockState, u *unknowns) []lockState {
		out := []lockState{st}
		for k := 0; k < len(out); k++ {
			s := out[k]
			var next []lockState
			if s.holder != "" && s.holder != "?" && u.released(s.holder) {
				next = append(next, lockState{token: s.token, used: s.used})
			}
			if s.holder != "" && s.holder != "?" && u.renewed(s.holder) && s.expHigh != never {
				s2 := s
				s2.expHigh = never
				next = append(next, s2)
			}
			if s.used < u.acquires && s.holder != "?" {
				next = append(next, lockState{holder: "?", token: s.token, expLow: 0, expHigh: never, used: s.used + 1})
			}
			for _, n := range next {
				if !slices.Contains(out, n) {
					out = append(out, n)
				}
			}
		}
		return out
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
			i := in.(lockIn)
			var next []any
			for _, b := range before(s.(lockState), i.unknown) {
				for _, n := range step(b, i, out.(lockOut)) {
					if !slices.Contains(next, any(n)) {
						next = append(next, n)
					}
				}
			}
			return next
		},
		DescribeOperation: func(in, out any) string { return fmt.Sprintf("%+v -> %+v", in, out) },
	}
}

// lockOperations turns the history's calls on the hot resources into
// porcupine's operations: the calls whose answer was learned, each with
// the calls of unknown outcome invoked before it returned.
func lockOperations(ops []op, hot []string) []porcupine.Operation {
	isUnknown := func(o op) bool {
		return o.outcome != okOutcome && o.outcome != refused || o.kind == "release" && !o.released
	}
	type perRes struct {
		acquires         []int64 // invokes, sorted
		renews, releases map[string]int64
	}
	unknown := map[string]*perRes{}
	for _, x := range ops {
		if !isUnknown(x) {
			continue
		}
		r := unknown[x.res]
		if r == nil {
			r = &perRes{renews: map[string]int64{}, releases: map[string]int64{}}
			unknown[x.res] = r
		}
		first := func(m map[string]int64) {
			if t, ok := m[x.lease]; !ok || x.invoke.UnixNano() < t {
				m[x.lease] = x.invoke.UnixNano()
			}
		}
		switch x.kind {
		case "acquire":
			r.acquires = append(r.acquires, x.invoke.UnixNano())
		case "renew":
			first(r.renews)
		case "release":
			first(r.releases)
		}
	}
	for _, r := range unknown {
		slices.Sort(r.acquires)
	}
	var out []porcupine.Operation
	for _, o := range ops {
		if o.client < 0 || !slices.Contains(hot, o.res) || isUnknown(o) {
			continue
		}
		u := &unknowns{at: o.done.UnixNano()}
		if r := unknown[o.res]; r != nil {
			u.acquires, _ = slices.BinarySearch(r.acquires, u.at)
			u.renews, u.releases = r.renews, r.releases
		}
		in := lockIn{kind: o.kind, res: o.res, lease: o.lease, call: o.invoke.UnixNano(), unknown: u}
		res := lockOut{ok: o.outcome == okOutcome, lease: o.lease, token: o.token, held: o.held, ret: o.done.UnixNano()}
		if !o.expires.IsZero() {
			res.expires = o.expires.UnixNano()
		}
		out = append(out, porcupine.Operation{ClientId: max(0, o.client), Input: in, Call: in.call, Output: res, Return: res.ret})
	}
	return out
}

// checkLinearizable checks the lock history with porcupine, for at most
// timeout; a check that runs out of time is reported, not failed.
func checkLinearizable(ops []op, hot []string, cfg checkConfig, timeout time.Duration) (string, []violation) {
	m := lockModel(cfg.skew, cfg.margin)
	res, info := porcupine.CheckOperationsVerbose(m.ToModel(), lockOperations(ops, hot), timeout)
	switch res {
	case porcupine.Ok:
		return "linearizable", nil
	case porcupine.Illegal:
		return "NOT linearizable", []violation{{"linearizable", time.Now(), "porcupine found no linearization of the lock history" + stuck(ops, info)}}
	}
	return fmt.Sprintf("unknown (no answer in %v)", timeout), nil
}

// stuck describes where porcupine's search stopped, so that a failure
// seen once (in CI) can be read without a replay: for each resource
// whose history has no linearization, the last operations of the
// longest linearized prefix and every call on the resource (unknown
// outcomes included) from shortly before the prefix ended to shortly
// after the first operation it could not place returned.
func stuck(ops []op, info porcupine.LinearizationInfo) string {
	var b strings.Builder
	for _, parts := range info.PartialLinearizationsOperations() {
		var longest []porcupine.Operation
		for _, p := range parts {
			if len(p) > len(longest) {
				longest = p
			}
		}
		if len(longest) == 0 {
			continue
		}
		res := longest[0].Input.(lockIn).res
		all := lockOperations(ops, []string{res})
		if len(longest) == len(all) {
			continue
		}
		placed := map[int64]bool{}
		var end int64
		for _, o := range longest {
			placed[o.Call] = true
			end = max(end, o.Return)
		}
		var next porcupine.Operation // the earliest operation not placed
		for _, o := range all {
			if !placed[o.Call] && (next.Input == nil || o.Call < next.Call) {
				next = o
			}
		}
		fmt.Fprintf(&b, "\n%s: %d of %d operations linearized; the prefix ends with:", res, len(longest), len(all))
		for _, o := range longest[max(0, len(longest)-6):] {
			fmt.Fprintf(&b, "\n  %s", describeOp(o))
		}
		if next.Input != nil {
			fmt.Fprintf(&b, "\nfirst operation not placed:\n  %s", describeOp(next))
			end = max(end, next.Return)
		}
		from, to := time.Unix(0, end).Add(-3*time.Second), time.Unix(0, end).Add(time.Second)
		b.WriteString("\ncalls on it around then (client node kind lease outcome token expires held released):")
		n := 0
		for _, o := range ops {
			if o.res != res || o.done.Before(from) || o.invoke.After(to) {
				continue
			}
			if n++; n > 80 {
				b.WriteString("\n  …")
				break
			}
			fmt.Fprintf(&b, "\n  %s-%s c%d n%d %s %s %s/%v t%d exp %s held=%v rel=%v", stamp(o.invoke), stamp(o.done), o.client, o.node, o.kind, o.lease, o.outcome, o.code, o.token, stamp(o.expires), o.held, o.released)
		}
	}
	return b.String()
}

// describeOp prints a porcupine operation of the lock model.
func describeOp(o porcupine.Operation) string {
	i, r := o.Input.(lockIn), o.Output.(lockOut)
	return fmt.Sprintf("%s-%s %s %s ok=%v lease=%s t%d exp %s held=%v", stamp(time.Unix(0, o.Call)), stamp(time.Unix(0, o.Return)), i.kind, i.lease, r.ok, r.lease, r.token, stamp(time.Unix(0, r.expires)), r.held)
}
