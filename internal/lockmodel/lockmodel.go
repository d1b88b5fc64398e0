// Package lockmodel is the exclusive lock as porcupine checks histories
// of it: the API tests' histories of real clusters (rpc) and the routing
// core's simulated ones (router) share it. Leases are long enough never to
// expire during a history.
package lockmodel

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// State is one resource's lock: who holds it and the last token.
type State struct {
	Holder string // lease id, "" when free
	Token  uint64
}

// Input is one call: Op is acquire, release or describe.
type Input struct {
	Op       string
	Resource string
	LeaseID  string // release
}

// Output is what the call answered.
type Output struct {
	Granted  bool   // acquire: granted (else held by another)
	LeaseID  string // acquire
	Token    uint64 // acquire: the grant's; conflict: the holder's; describe: the lock's
	Released *bool  // release: nil when the outcome was learned only through retries
	Held     bool   // describe
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
var Model = porcupine.Model{
	Partition: ByResource(func(in any) string { return in.(Input).Resource }),
	Init:      func() any { return State{} },
	Step: func(s, in, out any) (bool, any) {
		st, i, o := s.(State), in.(Input), out.(Output)
		switch i.Op {
		case "acquire":
			if o.Granted {
				// Rules 1 and 2: only when free, with a strictly higher token.
				return st.Holder == "" && o.Token > st.Token, State{o.LeaseID, o.Token}
			}
			return st.Holder != "" && o.Token == st.Token, st
		case "release":
			isHolder := st.Holder == i.LeaseID
			if o.Released != nil && *o.Released != isHolder {
				return false, st
			}
			if isHolder {
				return true, State{"", st.Token}
			}
			return true, st
		case "describe":
			return o.Held == (st.Holder != "") && o.Token == st.Token, st
		}
		return false, st
	},
	DescribeOperation: func(in, out any) string {
		return fmt.Sprintf("%+v -> %+v", in, out)
	},
}
