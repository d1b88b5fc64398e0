package lockmodel

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// op is client c's call on resource "r" over [call, ret].
func op(c int, call, ret int64, in Input, out Output) porcupine.Operation {
	in.Resource = "r"
	return porcupine.Operation{ClientId: c, Input: in, Output: out, Call: call, Return: ret}
}

func released(b bool) *bool { return &b }

// The model refuses histories that break mutual exclusion or token order,
// ghosts (Acquires that ended without a lease) included, and accepts a
// ghost's grant that others saw held during its call and that it gave
// back by the call's end. (Cases after the review of the first model,
// which took a ghost's grant and give-back as one step.)
func TestModel(t *testing.T) {
	acq := Input{Op: "acquire"}
	desc := Input{Op: "describe"}
	rel := func(l string) Input { return Input{Op: "release", LeaseID: l} }
	with := func(h []porcupine.Operation, ghost ...porcupine.Operation) []porcupine.Operation {
		return append(h, ghost...)
	}
	for _, tc := range []struct {
		name string
		want bool
		h    []porcupine.Operation
	}{
		{"two holders around a ghost", false, with([]porcupine.Operation{
			op(1, 0, 1, acq, Output{Granted: true, LeaseID: "a", Token: 5}),
			op(3, 4, 5, acq, Output{Granted: true, LeaseID: "b", Token: 9}),
		}, Ghost(2, "r", "w", 2, 3)...)},
		{"a grant below a token seen after a ghost", false, with([]porcupine.Operation{
			op(1, 0, 1, acq, Output{Granted: true, LeaseID: "a", Token: 5}),
			op(1, 2, 3, rel("a"), Output{Released: released(true)}),
			op(3, 6, 7, desc, Output{Token: 7}),
			op(3, 8, 9, acq, Output{Granted: true, LeaseID: "b", Token: 6}),
		}, Ghost(2, "r", "w", 4, 5)...)},
		{"a conflict with a released lease's token", false, []porcupine.Operation{
			op(1, 0, 1, acq, Output{Granted: true, LeaseID: "a", Token: 5}),
			op(1, 2, 3, rel("a"), Output{Released: released(true)}),
			op(3, 4, 5, acq, Output{Token: 5}),
		}},
		{"a free lock's token rising with no ghost", false, []porcupine.Operation{
			op(1, 0, 1, acq, Output{Granted: true, LeaseID: "a", Token: 5}),
			op(1, 2, 3, rel("a"), Output{Released: released(true)}),
			op(3, 4, 5, desc, Output{Token: 7}),
		}},
		{"a ghost raising a free lock's token unseen", true, with([]porcupine.Operation{
			op(1, 0, 1, acq, Output{Granted: true, LeaseID: "a", Token: 5}),
			op(1, 2, 3, rel("a"), Output{Released: released(true)}),
			op(3, 6, 7, desc, Output{Token: 7}),
			op(3, 8, 9, acq, Output{Granted: true, LeaseID: "b", Token: 8}),
		}, Ghost(2, "r", "w", 4, 5)...)},
		{"a ghost seen held during its call, free after it", true, with([]porcupine.Operation{
			op(1, 0, 1, acq, Output{Granted: true, LeaseID: "a", Token: 5}),
			op(1, 3, 4, rel("a"), Output{Released: released(true)}),
			op(3, 5, 6, desc, Output{Held: true, Token: 6}),
			op(3, 7, 8, acq, Output{Token: 6}),
			op(3, 21, 22, desc, Output{Token: 6}),
			op(3, 23, 24, acq, Output{Granted: true, LeaseID: "b", Token: 9}),
		}, Ghost(2, "r", "w", 2, 20)...)},
		{"a ghost still held after its call", false, with([]porcupine.Operation{
			op(3, 21, 22, desc, Output{Held: true, Token: 6}),
		}, Ghost(2, "r", "w", 2, 20)...)},
		{"a ghost taking the lock after its end", false, with([]porcupine.Operation{
			op(1, 0, 1, acq, Output{Granted: true, LeaseID: "a", Token: 5}),
			op(1, 12, 13, rel("a"), Output{Released: released(true)}),
			op(3, 14, 15, desc, Output{Held: true, Token: 6}),
		}, Ghost(2, "r", "w", 2, 10)...)},
	} {
		if got := porcupine.CheckOperations(Model, tc.h); got != tc.want {
			t.Errorf("%s: linearizable %v, want %v", tc.name, got, tc.want)
		}
	}
}
