package router

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/anypb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/shard"
)

// MaxBatchOps is the most ops one LockService.Batch call carries.
const MaxBatchOps = 1000

// Batch implements LockService.Batch. Each op goes through its own
// call's path (Acquire or Release), all of them concurrently: that path
// validates the op, routes it to its shard's leader, forwards it when the
// leader is on another node, and audits and counts it under its own
// method, so a failed op answers exactly what its own call would have (a
// bad field is named as that call names it: resource, lease_ttl). What
// the batch saves is the RPC per op, which costs the client and this
// node more than the op's Raft commit does. An Acquire that asks to wait
// (it would hold the whole batch) fails alone, naming wait_timeout; an
// op with neither an acquire nor a release names ops[i].
func (s *LockServer) Batch(ctx context.Context, req *connect.Request[wardenv1.BatchRequest]) (*connect.Response[wardenv1.BatchResponse], error) {
	start := time.Now()
	ops := req.Msg.GetOps()
	if n := len(ops); n == 0 || n > MaxBatchOps {
		err := &shard.FieldError{Field: "ops", Reason: fmt.Sprintf("must hold 1 to %d ops, not %d", MaxBatchOps, n)}
		return nil, observe("Batch", start, err)
	}
	out := make([]*wardenv1.BatchOutcome, len(ops))
	var wg sync.WaitGroup
	for i, op := range ops {
		if err := validateOp(i, op); err != nil {
			out[i] = failedOp(err)
			continue
		}
		wg.Go(func() { out[i] = s.runOp(ctx, req, op) })
	}
	wg.Wait()
	return connect.NewResponse(&wardenv1.BatchResponse{Outcomes: out}), observe("Batch", start, nil)
}

// validateOp checks what only a Batch asks of op i: that it holds an
// op, and that an acquire does not wait. Everything else is checked by
// the op's own call's path, which answers as that call would.
func validateOp(i int, op *wardenv1.BatchOp) error {
	switch {
	case op.GetAcquire() != nil:
		if op.GetAcquire().GetWaitTimeout().AsDuration() != 0 {
			return &shard.FieldError{Field: "wait_timeout", Reason: "must be unset in a Batch, whose ops do not wait; call Acquire to wait"}
		}
		return nil
	case op.GetRelease() != nil:
		return nil
	}
	return &shard.FieldError{Field: fmt.Sprintf("ops[%d]", i), Reason: "must hold an acquire or a release"}
}

// runOp runs one op of req through its own call's path, as req's caller
// and on req's forwarding hop count.
func (s *LockServer) runOp(ctx context.Context, req *connect.Request[wardenv1.BatchRequest], op *wardenv1.BatchOp) *wardenv1.BatchOutcome {
	if m := op.GetAcquire(); m != nil {
		resp, err := s.acquireFrom(ctx, sameHopReq(m, req.Header()), req.Peer())
		if err != nil {
			return failedOp(err)
		}
		return &wardenv1.BatchOutcome{Result: &wardenv1.BatchOutcome_Acquire{Acquire: resp.Msg}}
	}
	resp, err := s.releaseFrom(ctx, sameHopReq(op.GetRelease(), req.Header()), req.Peer())
	if err != nil {
		return failedOp(err)
	}
	return &wardenv1.BatchOutcome{Result: &wardenv1.BatchOutcome_Release{Release: resp.Msg}}
}

// failedOp is the outcome of an op that failed with err, with the code,
// message and details its own call would have answered.
func failedOp(err error) *wardenv1.BatchOutcome {
	ce := asConnect(err)
	out := &wardenv1.BatchOutcome{Code: ce.Code().String(), Message: ce.Message()}
	for _, d := range ce.Details() {
		out.Details = append(out.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	return out
}

// asConnect is err as its call answers it: a *connect.Error, of code
// unknown when toConnect leaves err without one.
func asConnect(err error) *connect.Error {
	var ce *connect.Error
	if errors.As(toConnect(err), &ce) {
		return ce
	}
	return connect.NewError(connect.CodeUnknown, err)
}
