package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/warden-dev/warden/auth"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/shard"
)

// MaxBatchOps is the most ops one LockService.Batch call carries.
const MaxBatchOps = shard.MaxBatch

// Batch implements LockService.Batch. The ops of each shard go in one
// BatchCmd to that shard's leader, one Raft entry for all of them:
// proposed here when this node leads it, else forwarded as a smaller
// Batch to the node that does. Each op answers exactly what its own call
// (Acquire or Release) would have, and is audited and counted under that
// call's method, so a bad field is named as that call names it
// (resource, lease_ttl). An op the router refuses and an op whose key
// left the shard on the way (a split or move) go through their own
// call's path instead; so does every
// op while a replica of the shard runs a binary that predates BatchCmd
// (a rolling upgrade), or when the leader's node does not serve Batch.
// An acquire that asks to wait (it would hold the whole batch) fails
// alone, naming wait_timeout; an op with neither an acquire nor a
// release names ops[i]. What a batch saves is the RPC per op and the
// Raft entry per op, which cost more than the ops' own work.
func (s *LockServer) Batch(ctx context.Context, req *connect.Request[wardenv1.BatchRequest]) (*connect.Response[wardenv1.BatchResponse], error) {
	ops := req.Msg.GetOps()
	if n := len(ops); n == 0 || n > MaxBatchOps {
		err := &shard.FieldError{Field: "ops", Reason: fmt.Sprintf("must hold 1 to %d ops, not %d", MaxBatchOps, n)}
		return nil, err
	}
	out := make([]*wardenv1.BatchOutcome, len(ops))
	groups := map[uint64][]int{} // shard id → indexes into ops
	m := s.r.Map()
	var denied deniedOps
	defer denied.audit(ctx, s.r, req.Peer(), "Batch")
	for i, op := range ops {
		if err := validateOp(i, op); err != nil {
			out[i] = failedOp(err)
			continue
		}
		if err := authorize(ctx, s.r, auth.Lock, "", opResource(op)); err != nil {
			method := "Acquire"
			if op.GetAcquire() == nil {
				method = "Release"
			}
			denied.add(ctx, s.r, req.Peer(), method, opResource(op), time.Now(), err) // denied alone
			out[i] = failedOp(err)
			continue
		}
		rg, err := m.ShardFor(opResource(op))
		if err != nil {
			out[i] = s.runOp(ctx, req, op) // answers the routing error as its own call would
			continue
		}
		groups[rg.GetShardId()] = append(groups[rg.GetShardId()], i)
	}
	serveGroups(s.r, groups, out, failedOp, func(shardID uint64, idx []int) { s.batchGroup(ctx, req, shardID, idx, out) })
	return connect.NewResponse(&wardenv1.BatchResponse{Outcomes: out}), nil
}

// opResource is the resource op acts on.
func opResource(op *wardenv1.BatchOp) string {
	if m := op.GetAcquire(); m != nil {
		return m.GetResource()
	}
	return op.GetRelease().GetResource()
}

// batchGroup runs req's ops at idx, which the map places in shardID, and
// fills their outcomes in out.
func (s *LockServer) batchGroup(ctx context.Context, req *connect.Request[wardenv1.BatchRequest], shardID uint64, idx []int, out []*wardenv1.BatchOutcome) {
	ops := req.Msg.GetOps()
	sub := &wardenv1.BatchRequest{Ops: make([]*wardenv1.BatchOp, len(idx))}
	for j, i := range idx {
		sub.Ops[j] = ops[i]
	}
	resp, where, err := forward(ctx, s.r, sameHopReq(sub, req.Header()), opResource(sub.Ops[0]), func(p *peer) peerCall[wardenv1.BatchRequest, wardenv1.BatchResponse] {
		return p.Locks.Batch
	})
	ok := where != servedHere
	if ok && connect.CodeOf(err) == connect.CodeUnimplemented {
		s.runEach(ctx, req, idx, out) // the leader's node predates Batch
		return
	}
	if ok {
		// The node that served them audited and counted them.
		spreadForwarded(idx, out, err, func() []*wardenv1.BatchOutcome { return resp.Msg.GetOutcomes() }, failedOp)
		return
	}
	env := &shardv1.Envelope{Command: &shardv1.Envelope_Batch{Batch: &shardv1.BatchCmd{}}}
	if !s.r.Applies(shardID, shard.VersionOf(env)) {
		s.runEach(ctx, req, idx, out) // a replica's node predates BatchCmd
		return
	}
	cmd := env.GetBatch()
	var sent []int // indexes into ops of cmd's items
	for _, i := range idx {
		item, err := s.batchItem(ctx, ops[i])
		if err != nil {
			out[i] = s.runOp(ctx, req, ops[i]) // refused as its own call refuses it
			continue
		}
		cmd.Items = append(cmd.Items, item)
		sent = append(sent, i)
	}
	if len(sent) == 0 {
		return
	}
	metrics.batchOps.Observe(float64(len(sent)))
	start := time.Now()
	res, err := s.r.Propose(ctx, opResource(ops[sent[0]]), env)
	if err == nil && len(res.GetItems()) != len(sent) {
		err = fmt.Errorf("router: shard answered %d results for %d ops", len(res.GetItems()), len(sent))
	}
	var again []int // ops to send through their own call's path
	for j, i := range sent {
		var item *shardv1.Result
		opErr := err
		if err == nil {
			item = res.GetItems()[j]
			switch {
			case router.MovedOn(item.GetCode()):
				// The key left this shard after the map was read: its own
				// call finds the new shard.
				again = append(again, i)
				continue
			case item.GetCode() == shardv1.Code_CODE_QUEUED:
				opErr = s.giveUpQueued(ops[i].GetAcquire(), cmd.GetItems()[j].GetAcquire().GetLeaseId())
			}
		}
		out[i] = s.opDone(ctx, req.Peer(), ops[i], item, opErr, start)
	}
	// In the batch's order: an op on the same resource as another went
	// the same way.
	for _, i := range again {
		out[i] = s.runOp(ctx, req, ops[i])
	}
}

// serveGroups runs serve for each shard's group of a batch (shard id →
// indexes into out) and waits: in this goroutine when there is one group,
// the usual case, else each in its own through goServe, where a panic
// fills the group's outcomes with failed(err).
func serveGroups[O any](r *node, groups map[uint64][]int, out []O, failed func(error) O, serve func(shardID uint64, idx []int)) {
	var wg sync.WaitGroup
	for shardID, idx := range groups {
		if len(groups) == 1 {
			serve(shardID, idx)
			break
		}
		goServe(r.Config().Logger, &wg, func() { serve(shardID, idx) }, func(err error) {
			for _, i := range idx {
				out[i] = failed(err)
			}
		})
	}
	wg.Wait()
}

// spreadForwarded fills out at idx with the outcomes of the items a
// forwarded batch carried: got's, in order, when the call answered one
// for each item (err nil), else failed(err) for every item.
func spreadForwarded[O any](idx []int, out []O, err error, got func() []O, failed func(error) O) {
	var outcomes []O
	if err == nil {
		if outcomes = got(); len(outcomes) != len(idx) {
			err = fmt.Errorf("router: the forwarded batch answered %d outcomes for %d items", len(outcomes), len(idx))
		}
	}
	for j, i := range idx {
		if err != nil {
			out[i] = failed(err)
		} else {
			out[i] = outcomes[j]
		}
	}
}

// batchItem validates op as its own call would and returns its BatchCmd
// item.
func (s *LockServer) batchItem(ctx context.Context, op *wardenv1.BatchOp) (*shardv1.BatchItem, error) {
	if m := op.GetAcquire(); m != nil {
		cmd, err := s.acquireCmd(ctx, m)
		if err != nil {
			return nil, err
		}
		return &shardv1.BatchItem{Command: &shardv1.BatchItem_Acquire{Acquire: cmd}}, nil
	}
	cmd, err := releaseCmd(op.GetRelease())
	if err != nil {
		return nil, err
	}
	return &shardv1.BatchItem{Command: &shardv1.BatchItem_Release{Release: cmd}}, nil
}

// opDone audits and counts op, proposed at start in a BatchCmd whose
// result for it is res (err: the command failed), and returns its
// outcome.
func (s *LockServer) opDone(ctx context.Context, from connect.Peer, op *wardenv1.BatchOp, res *shardv1.Result, err error, start time.Time) *wardenv1.BatchOutcome {
	if err == nil && res.GetCode() != shardv1.Code_CODE_OK {
		err = &router.ResultError{Res: res}
	}
	if m := op.GetAcquire(); m != nil {
		var msg *wardenv1.AcquireResponse
		if err == nil {
			msg = acquireResponse(res.GetLease()).Msg
		}
		return acquireOutcome(s.r, ctx, from, m, start, msg, err, true)
	}
	var msg *wardenv1.ReleaseResponse
	if err == nil {
		msg = releaseResponse(res).Msg
	}
	return releaseOutcome(s.r, ctx, from, op.GetRelease(), start, msg, err, true)
}

// acquireOutcome returns the outcome of acquire op m of a Batch from the
// caller from, begun at start and answered msg or err, and, with served
// set (this node served it), records it as its own Acquire call would be.
func acquireOutcome(r *node, ctx context.Context, from connect.Peer, m *wardenv1.AcquireRequest, start time.Time, msg *wardenv1.AcquireResponse, err error, served bool) *wardenv1.BatchOutcome {
	if served {
		record(ctx, r, from, "Acquire", start, acquireEntry(m, msg), err)
	}
	if err != nil {
		return failedOp(err)
	}
	return &wardenv1.BatchOutcome{Result: &wardenv1.BatchOutcome_Acquire{Acquire: msg}}
}

// releaseOutcome is acquireOutcome for release op m.
func releaseOutcome(r *node, ctx context.Context, from connect.Peer, m *wardenv1.ReleaseRequest, start time.Time, msg *wardenv1.ReleaseResponse, err error, served bool) *wardenv1.BatchOutcome {
	if served {
		record(ctx, r, from, "Release", start, releaseEntry(m, msg), err)
	}
	if err != nil {
		return failedOp(err)
	}
	return &wardenv1.BatchOutcome{Result: &wardenv1.BatchOutcome_Release{Release: msg}}
}

// runEach runs req's ops at idx through their own call's path,
// concurrently.
func (s *LockServer) runEach(ctx context.Context, req *connect.Request[wardenv1.BatchRequest], idx []int, out []*wardenv1.BatchOutcome) {
	var wg sync.WaitGroup
	for _, i := range idx {
		goServe(s.r.Config().Logger, &wg, func() { out[i] = s.runOp(ctx, req, req.Msg.GetOps()[i]) }, func(err error) { out[i] = failedOp(err) })
	}
	wg.Wait()
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

// runOp runs one op of req through its own call's path (its route, as
// the routing interceptor would, then its handler), as req's caller and
// on req's forwarding hop count, and records it as that call, unless
// another node served it.
func (s *LockServer) runOp(ctx context.Context, req *connect.Request[wardenv1.BatchRequest], op *wardenv1.BatchOp) *wardenv1.BatchOutcome {
	start := time.Now()
	if m := op.GetAcquire(); m != nil {
		resp, where, err := acquireRoute.run(ctx, s.r, sameHopReq(m, req.Header()), s.Acquire)
		return acquireOutcome(s.r, ctx, req.Peer(), m, start, msgOf(resp, err), err, where != servedThere)
	}
	resp, where, err := releaseRoute.run(ctx, s.r, sameHopReq(op.GetRelease(), req.Header()), s.Release)
	return releaseOutcome(s.r, ctx, req.Peer(), op.GetRelease(), start, msgOf(resp, err), err, where != servedThere)
}

// msgOf is resp's message, or nil when the call failed.
func msgOf[Resp any](resp *connect.Response[Resp], err error) *Resp {
	if err != nil {
		return nil
	}
	return resp.Msg
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

// goServe runs f on wg in a goroutine of its own, serving part of a call
// as net/http serves a whole one: a panic in f is logged and fails that
// part alone (failed answers it with the error), where it would
// otherwise stop the node, and then the next leader the call is
// forwarded to.
func goServe(log *slog.Logger, wg *sync.WaitGroup, f func(), failed func(error)) {
	wg.Go(func() {
		defer func() {
			if p := recover(); p != nil {
				log.Error("panic serving part of a call", "panic", p, "stack", string(debug.Stack()))
				failed(fmt.Errorf("router: internal error: %v", p))
			}
		}()
		f()
	})
}
