package rpc_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/rpc"
	"github.com/warden-dev/warden/server"
)

func acquireOp(resource, requestID string) *wardenv1.BatchOp {
	return &wardenv1.BatchOp{Op: &wardenv1.BatchOp_Acquire{Acquire: &wardenv1.AcquireRequest{
		Resource: resource, RequestId: requestID, LeaseTtl: durationpb.New(10 * time.Second)}}}
}

func releaseOp(resource, leaseID string) *wardenv1.BatchOp {
	return &wardenv1.BatchOp{Op: &wardenv1.BatchOp_Release{Release: &wardenv1.ReleaseRequest{Resource: resource, LeaseId: leaseID}}}
}

// batch sends one Batch of ops.
func (c *cluster) batch(ops ...*wardenv1.BatchOp) ([]*wardenv1.BatchOutcome, error) {
	resp, err := c.locks.Batch(ctx(c.t), connect.NewRequest(&wardenv1.BatchRequest{Ops: ops}))
	if err != nil {
		return nil, err
	}
	if len(resp.Msg.GetOutcomes()) != len(ops) {
		c.t.Fatalf("%d outcomes for %d ops", len(resp.Msg.GetOutcomes()), len(ops))
	}
	return resp.Msg.GetOutcomes(), nil
}

// Each op of a Batch answers what its own call would have: grants,
// refusals with their details, releases of current and stale leases,
// and invalid ops naming their field as their own call does; and the
// grants hold.
func TestBatch(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	held := c.mustAcquire("b/held", "rh", 10*time.Second)
	busy := c.mustAcquire("b/busy", "rb", 10*time.Second)
	gone := c.mustAcquire("b/gone", "rg", 10*time.Second)
	if ok, err := c.release("b/gone", gone.GetLeaseId()); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	waiting := acquireOp("b/wait", "rw")
	waiting.GetAcquire().WaitTimeout = durationpb.New(time.Second)
	commands, proposed := c.metric("warden_batch_command_ops_count"), c.metric("warden_batch_command_ops_sum")
	out, err := c.batch(
		acquireOp("b/a", "ra"),
		acquireOp("b/busy", "other"),
		releaseOp("b/held", held.GetLeaseId()),
		releaseOp("b/gone", gone.GetLeaseId()),
		waiting,
		acquireOp("", "rx"),
		releaseOp("b/a", "not-hex"),
		&wardenv1.BatchOp{},
		acquireOp("b/c", "rc"),
	)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ code, field string }{
		{"", ""},
		{"aborted", ""},
		{"", ""},
		{"", ""},
		{"invalid_argument", "wait_timeout"},
		{"invalid_argument", "resource"},
		{"invalid_argument", "lease_id"},
		{"invalid_argument", "ops[7]"},
		{"", ""},
	}
	for i, w := range want {
		if o := out[i]; o.GetCode() != w.code || !strings.Contains(o.GetMessage(), w.field) {
			t.Errorf("op %d: %q %q, want code %q naming %q", i, o.GetCode(), o.GetMessage(), w.code, w.field)
		}
	}
	// The five ops that reached the shard (the router refused the
	// others) went in one BatchCmd, one Raft entry.
	if n, sum := c.metric("warden_batch_command_ops_count")-commands, c.metric("warden_batch_command_ops_sum")-proposed; n != 1 || sum != 5 {
		t.Errorf("%v BatchCmds of %v ops in all, want 1 of 5", n, sum)
	}
	// An invalid op answers exactly what its own call does, whether the
	// router or the shard refuses it.
	long := acquireOp("b/long", "rl")
	long.GetAcquire().LeaseTtl = durationpb.New(11 * time.Minute)
	for _, op := range []*wardenv1.BatchOp{acquireOp("", "rx"), long} {
		got, err := c.batch(op)
		if err != nil {
			t.Fatal(err)
		}
		_, want := c.locks.Acquire(ctx(t), connect.NewRequest(op.GetAcquire()))
		var ce *connect.Error
		if !errors.As(want, &ce) || got[0].GetCode() != ce.Code().String() || got[0].GetMessage() != ce.Message() || len(got[0].GetDetails()) != len(ce.Details()) {
			t.Errorf("invalid op: %q %q with %d details, want %v with %d", got[0].GetCode(), got[0].GetMessage(), len(got[0].GetDetails()), want, len(ce.Details()))
		}
	}
	// The refused Acquire carries the holder's details, as Acquire's
	// error does.
	var h wardenv1.LockHeld
	if d := out[1].GetDetails(); len(d) != 1 || d[0].UnmarshalTo(&h) != nil || h.GetFencingToken() != busy.GetFencingToken() {
		t.Errorf("aborted acquire: details %v, want the holder's LockHeld with token %d", d, busy.GetFencingToken())
	}
	if !out[2].GetRelease().GetReleased() || out[3].GetRelease().GetReleased() {
		t.Errorf("releases: current %v, stale %v; want true, false", out[2].GetRelease(), out[3].GetRelease())
	}
	for _, i := range []int{0, 8} {
		a := out[i].GetAcquire()
		if a.GetLeaseId() == "" || a.GetFencingToken() == 0 {
			t.Errorf("op %d: grant %v", i, a)
		}
	}
	if d := c.describe("b/a"); !d.GetHeld() || d.GetFencingToken() != out[0].GetAcquire().GetFencingToken() {
		t.Errorf("b/a: %v, want held with the batch's token", d)
	}
	if d := c.describe("b/held"); d.GetHeld() && d.GetFencingToken() == held.GetFencingToken() {
		t.Errorf("b/held: still held by the released lease: %v", d)
	}

	// A retry of the batch's acquire (same request id) returns the same
	// lease, in a batch or alone.
	again, err := c.batch(acquireOp("b/a", "ra"))
	if err != nil || again[0].GetAcquire().GetLeaseId() != out[0].GetAcquire().GetLeaseId() {
		t.Errorf("retried acquire: %v %v, want lease %s", again, err, out[0].GetAcquire().GetLeaseId())
	}

	_, err = c.batch()
	wantCode(t, err, connect.CodeInvalidArgument)
	many := make([]*wardenv1.BatchOp, rpc.MaxBatchOps+1)
	for i := range many {
		many[i] = releaseOp("b/a", held.GetLeaseId())
	}
	_, err = c.batch(many...)
	wantCode(t, err, connect.CodeInvalidArgument)
	if err != nil && !strings.Contains(err.Error(), "ops") {
		t.Errorf("oversized batch: %v, want the error to name ops", err)
	}
	if d := c.describe("b/a"); !d.GetHeld() {
		t.Error("a refused batch released b/a")
	}
}
