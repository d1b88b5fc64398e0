// Package lockmodel is the exclusive lock as porcupine checks histories
// of it: the API tests' histories of real clusters (rpc) and the routing
// core's simulated ones (router) share it. Leases are long enough never to
// expire during a history.
package lockmodel

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"
)

// State is one resource's lock: who holds it and the last token.
type State struct {
	Holder string // lease id, "ghost:" and a request id for a ghost, "" when free
	Token  uint64
	// Loose: Token is only a lower bound: a ghost took the lock unseen
	// (its token is learned when a call sees it).
	Loose bool
	// Gone lists the request ids (each followed by a NUL) whose ghosts
	// have ended: a ghost never takes the lock after its end.
	Gone string
}

// Input is one call: Op is acquire, release or describe; ghost and
// unghost are the two halves of an acquire that Ended (Ghost).
type Input struct {
	Op       string
	Resource string
	LeaseID  string // release; the request id for ghost and unghost
}

// Output is what the call answered.
type Output struct {
	Granted  bool   // acquire: granted (else held by another)
	LeaseID  string // acquire
	Token    uint64 // acquire: the grant's; conflict: the holder's; describe: the lock's
	Released *bool  // release: nil when the outcome was learned only through retries
	Held     bool   // describe
	// Ended: an acquire that left the caller no lease: its wait ran out
	// (deadline_exceeded from the server), or the request's grant ended
	// before the caller heard of it (failed_precondition on a retry).
	// Meanwhile the request may have held the lock, seen by others,
	// until the server gave it back: record it with Ghost.
	Ended bool
}

// Ghost returns the two operations that record an acquire of request id
// on resource that Ended, over its call's interval [call, ret]: the
// request may take the lock (a ghost: a grant its caller never heard
// of, with a token nobody saw granted) and give it back, each at most
// once and in that order, both within the interval.
func Ghost(client int, resource, id string, call, ret int64) []porcupine.Operation {
	op := func(kind string) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: Input{Op: kind, Resource: resource, LeaseID: id}, Output: Output{Ended: true}, Call: call, Return: ret}
	}
	return []porcupine.Operation{op("ghost"), op("unghost")}
}

// ByResource partitions a history by the resource each input names:
// locks on different resources are independent.
func ByResource(resource func(in any) string) func([]porcupine.Operation) [][]porcupine.Operation {
	return func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		for _, op := range h {
			r := resource(op.Input)
			by[r] = append(by[r], op)
		}
		out := make([][]porcupine.Operation, 0, len(by))
		for _, ops := range by {
			out = append(out, ops)
		}
		return out
	}
}

// Model is the lock's porcupine model over Input and Output, partitioned
// by resource.
var Model = (&porcupine.NondeterministicModel{
	Partition: ByResource(func(in any) string { return in.(Input).Resource }),
	Init:      func() []any { return []any{State{}} },
	Step: func(s, in, out any) []any {
		st, i, o := s.(State), in.(Input), out.(Output)
		// seen is whether token t may be the lock's last token.
		seen := func(t uint64) bool { return t == st.Token || st.Loose && t > st.Token }
		ok := func(cond bool, next State) []any {
			if cond {
				return []any{next}
			}
			return nil
		}
		ghost := "ghost:" + i.LeaseID
		switch i.Op {
		case "acquire":
			if o.Granted {
				// Rules 1 and 2: only when free, with a strictly higher token.
				return ok(st.Holder == "" && o.Token > st.Token, State{Holder: o.LeaseID, Token: o.Token, Gone: st.Gone})
			}
			return ok(st.Holder != "" && seen(o.Token), State{Holder: st.Holder, Token: o.Token, Gone: st.Gone})
		case "ghost":
			if st.Holder != "" || strings.Contains(st.Gone, i.LeaseID+"\x00") {
				return []any{st}
			}
			took := st
			took.Holder, took.Loose = ghost, true
			return []any{st, took}
		case "unghost":
			next := st
			next.Gone += i.LeaseID + "\x00"
			if st.Holder == ghost {
				next.Holder = ""
			}
			return []any{next}
		case "release":
			isHolder := st.Holder == i.LeaseID
			if o.Released != nil && *o.Released != isHolder {
				return nil
			}
			if isHolder {
				return []any{State{Token: st.Token, Gone: st.Gone}}
			}
			return []any{st}
		case "describe":
			return ok(o.Held == (st.Holder != "") && seen(o.Token), State{Holder: st.Holder, Token: o.Token, Gone: st.Gone})
		}
		return nil
	},
	DescribeOperation: func(in, out any) string {
		return fmt.Sprintf("%+v -> %+v", in, out)
	},
}).ToModel()

// Explain logs, through logf, where a history that is not linearizable
// stops: the end of each partition's longest linearization (at most 15
// calls), then the calls on its last call's resource under way then or
// within window after it (in the unit of the history's times). info is
// CheckOperationsVerbose's.
func Explain(ops []porcupine.Operation, info porcupine.LinearizationInfo, window int64, logf func(format string, args ...any)) {
	show := func(op porcupine.Operation) {
		o := op.Output.(Output)
		rel := "?"
		if o.Released != nil {
			rel = fmt.Sprint(*o.Released)
		}
		logf("c%d %d-%d %+v -> granted %v ended %v lease %s token %d released %s held %v", op.ClientId, op.Call, op.Return,
			op.Input, o.Granted, o.Ended, o.LeaseID, o.Token%(1<<40), rel, o.Held)
	}
	byCall := slices.Clone(ops)
	slices.SortFunc(byCall, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	for _, part := range info.PartialLinearizationsOperations() {
		if len(part) == 0 {
			continue
		}
		longest := part[0]
		for _, l := range part {
			if len(l) > len(longest) {
				longest = l
			}
		}
		if len(longest) == 0 {
			continue
		}
		last := longest[len(longest)-1]
		if len(longest) > 15 {
			longest = longest[len(longest)-15:]
		}
		logf("the longest linearization's end:")
		for _, op := range longest {
			show(op)
		}
		logf("the calls under way then or soon after:")
		for _, op := range byCall {
			if op.Input.(Input).Resource == last.Input.(Input).Resource && op.Return >= last.Call && op.Call <= last.Return+window {
				show(op)
			}
		}
	}
}
