package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// MaxBatchOps is the most ops one Batch call carries (the server's
// bound).
const MaxBatchOps = 1000

// DefaultBatchCalls is how many Batch calls a Client's Batcher keeps in
// flight to one endpoint.
const DefaultBatchCalls = 4

// Batcher sends the Acquire calls without a wait and the Release calls
// that many goroutines make through one LockService client in Batch
// calls, so that a busy process pays one RPC for the calls it makes at
// about the same time (TigerBeetle's clients batch the same way). It
// never holds a call back to wait for others: a call is sent at once
// while fewer than the Batcher's limit of Batch calls are in flight, and
// otherwise goes in the next call, sent as soon as one returns, with
// whatever else queued meanwhile (at most 1,000 ops and 48 KiB). A lone
// call goes as its own Acquire or Release. A server without Batch
// (Unimplemented), or a call refused as a whole for another reason than
// Unavailable or a deadline, gets plain calls instead. Each call answers
// exactly what its own RPC would have, error details included. Safe for
// concurrent use; a Client keeps one per endpoint.
type Batcher struct {
	locks wardenv1connect.LockServiceClient
	calls int

	mu       sync.Mutex
	queue    []*batchOp
	inFlight int
	single   bool // the server answered Unimplemented to Batch
}

// batchOp is one queued op.
type batchOp struct {
	ctx  context.Context
	op   *wardenv1.BatchOp
	done chan struct{} // closed when out or err is set
	out  *wardenv1.BatchOutcome
	err  error
	// state says which came first: the outcome (opDelivered) or its
	// caller giving up (opAbandoned).
	state atomic.Int32
	// orphaned, when set, gets the outcome of an op that succeeded after
	// its caller gave up (see Batcher.acquire).
	orphaned func(*wardenv1.BatchOutcome)
}

// callerCtx is the context of o's caller.
func callerCtx(o *batchOp) context.Context { return o.ctx }

// A batchOp's state.
const (
	opWaiting int32 = iota
	opDelivered
	opAbandoned
)

// finish hands o's outcome (out or err, already set) to its caller, or,
// when the caller gave up first and the op succeeded, to o.orphaned.
func (o *batchOp) finish() {
	close(o.done)
	if !o.state.CompareAndSwap(opWaiting, opDelivered) && o.orphaned != nil && o.err == nil && o.out.GetCode() == "" {
		o.orphaned(o.out)
	}
}

// NewBatcher returns a Batcher that sends through locks with at most
// calls Batch calls in flight (at least 1).
func NewBatcher(locks wardenv1connect.LockServiceClient, calls int) *Batcher {
	return &Batcher{locks: locks, calls: max(calls, 1)}
}

// Acquire is LockService.Acquire, batched with other calls when its
// request does not wait (wait_timeout unset); a waiting Acquire is sent
// alone.
func (b *Batcher) Acquire(ctx context.Context, req *wardenv1.AcquireRequest) (*wardenv1.AcquireResponse, error) {
	return b.acquire(ctx, req, nil)
}

// acquire is Acquire. When orphaned is set, it gets the lease of a
// batched acquire that the server granted after ctx ended and the call
// had returned ctx's error: a lease nobody holds, which stays held until
// its TTL runs out unless released. (The Batch call that carried it went
// on for the other callers in it. A call sent alone ends with ctx, and
// what the server did with it is unknown.)
func (b *Batcher) acquire(ctx context.Context, req *wardenv1.AcquireRequest, orphaned func(*wardenv1.AcquireResponse)) (*wardenv1.AcquireResponse, error) {
	if req.GetWaitTimeout().AsDuration() != 0 {
		resp, err := b.locks.Acquire(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	var orphanedOut func(*wardenv1.BatchOutcome)
	if orphaned != nil {
		orphanedOut = func(out *wardenv1.BatchOutcome) { orphaned(out.GetAcquire()) }
	}
	out, err := b.do(ctx, &wardenv1.BatchOp{Op: &wardenv1.BatchOp_Acquire{Acquire: req}}, orphanedOut)
	if err != nil {
		return nil, err
	}
	return out.GetAcquire(), nil
}

// Release is LockService.Release, batched with other calls.
func (b *Batcher) Release(ctx context.Context, req *wardenv1.ReleaseRequest) (*wardenv1.ReleaseResponse, error) {
	out, err := b.do(ctx, &wardenv1.BatchOp{Op: &wardenv1.BatchOp_Release{Release: req}}, nil)
	if err != nil {
		return nil, err
	}
	return out.GetRelease(), nil
}

// do queues op, starts a Batch call if fewer than b.calls are in flight,
// and waits for op's outcome; orphaned (may be nil) gets a successful
// outcome that comes after ctx ended and do returned.
func (b *Batcher) do(ctx context.Context, op *wardenv1.BatchOp, orphaned func(*wardenv1.BatchOutcome)) (*wardenv1.BatchOutcome, error) {
	o := &batchOp{ctx: ctx, op: op, done: make(chan struct{}), orphaned: orphaned}
	b.mu.Lock()
	b.queue = append(b.queue, o)
	var batch []*batchOp
	if b.inFlight < b.calls {
		if batch = b.take(); batch != nil {
			b.inFlight++
		}
	}
	b.mu.Unlock()
	if batch != nil {
		go b.send(batch)
	}
	select {
	case <-o.done:
	case <-ctx.Done():
		if o.state.CompareAndSwap(opWaiting, opAbandoned) {
			return nil, contextError(ctx)
		}
		<-o.done // the outcome came first: it is this caller's
	}
	if o.err == nil {
		return o.out, outcomeError(o.out.GetCode(), o.out.GetMessage(), o.out)
	}
	// The call that carried it ended with the latest of its callers'
	// deadlines, or when all of them gave up: if that is this caller's
	// own, say so as its own call would have.
	if d, ok := ctx.Deadline(); ok && connect.CodeOf(o.err) == connect.CodeDeadlineExceeded && !time.Now().Before(d) {
		<-ctx.Done()
	}
	if ctx.Err() != nil {
		return nil, contextError(ctx)
	}
	return nil, o.err
}

// contextError is ctx's error as a Connect call ended by ctx answers it:
// deadline_exceeded or canceled, wrapping ctx.Err().
func contextError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return connect.NewError(connect.CodeCanceled, ctx.Err())
}

// take removes the next call's ops from the queue: up to MaxBatchOps and
// maxBatchBytes, skipping those whose caller gave up while they queued.
// It returns nil when none are left. b.mu must be held.
func (b *Batcher) take() []*batchOp {
	var batch []*batchOp
	size, n := 0, 0
	for ; n < len(b.queue) && len(batch) < MaxBatchOps; n++ {
		o := b.queue[n]
		if o.ctx.Err() != nil {
			continue
		}
		size += proto.Size(o.op) + 3 // the op's tag and length
		if len(batch) > 0 && size > maxBatchBytes {
			break
		}
		batch = append(batch, o)
	}
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil
	}
	return batch
}

// send sends batch, then whatever queued meanwhile, until the queue is
// empty; it holds one of the in-flight slots throughout.
func (b *Batcher) send(batch []*batchOp) {
	for batch != nil {
		b.mu.Lock()
		single := b.single
		b.mu.Unlock()
		switch {
		case single:
			b.sendEach(batch)
		case len(batch) == 1:
			b.sendOne(batch[0])
		default:
			b.sendBatch(batch)
		}
		b.mu.Lock()
		if batch = b.take(); batch == nil {
			b.inFlight--
		}
		b.mu.Unlock()
	}
}

// orphanLinger is how long a call that carries an op with an orphaned
// handler goes on after its callers gave up, to learn whether the server
// granted it anyway (and so hand the lease to that handler rather than
// leave it held until its TTL runs out).
const orphanLinger = 2 * time.Second

// lingerFor is how long a call for batch goes on after its callers gave
// up: orphanLinger when an op has an orphaned handler, else 0.
func lingerFor(batch []*batchOp) time.Duration {
	for _, o := range batch {
		if o.orphaned != nil {
			return orphanLinger
		}
	}
	return 0
}

func (b *Batcher) sendBatch(batch []*batchOp) {
	ctx, cancel := callContext(batch, callerCtx, lingerFor(batch))
	defer cancel()
	req := &wardenv1.BatchRequest{Ops: make([]*wardenv1.BatchOp, len(batch))}
	for i, o := range batch {
		req.Ops[i] = o.op
	}
	resp, err := b.locks.Batch(ctx, connect.NewRequest(req))
	if unimplemented, refused := refusal(err); unimplemented || refused {
		if unimplemented {
			b.mu.Lock()
			b.single = true
			b.mu.Unlock()
		}
		b.sendEach(batch)
		return
	}
	if err == nil && len(resp.Msg.GetOutcomes()) != len(batch) {
		err = connect.NewError(connect.CodeInternal, fmt.Errorf("warden: Batch answered %d outcomes for %d ops", len(resp.Msg.GetOutcomes()), len(batch)))
	}
	for i, o := range batch {
		if err != nil {
			o.err = err
		} else {
			o.out = resp.Msg.GetOutcomes()[i]
		}
		o.finish()
	}
}

// sendEach sends batch as plain calls, all at once, and returns when
// they have answered.
func (b *Batcher) sendEach(batch []*batchOp) {
	var wg sync.WaitGroup
	for _, o := range batch {
		wg.Go(func() { b.sendOne(o) })
	}
	wg.Wait()
}

// sendOne sends o as its own Acquire or Release call.
func (b *Batcher) sendOne(o *batchOp) {
	defer o.finish()
	if m := o.op.GetAcquire(); m != nil {
		one := []*batchOp{o}
		ctx, cancel := callContext(one, callerCtx, lingerFor(one))
		defer cancel()
		resp, err := b.locks.Acquire(ctx, connect.NewRequest(m))
		if o.err = err; err == nil {
			o.out = &wardenv1.BatchOutcome{Result: &wardenv1.BatchOutcome_Acquire{Acquire: resp.Msg}}
		}
		return
	}
	resp, err := b.locks.Release(o.ctx, connect.NewRequest(o.op.GetRelease()))
	if o.err = err; err == nil {
		o.out = &wardenv1.BatchOutcome{Result: &wardenv1.BatchOutcome_Release{Release: resp.Msg}}
	}
}

// refusal says what a batch call's error means for the calls it
// carried: unimplemented, the server has no such method (send every call
// alone from now on); refused, it refused the call as a whole for a
// reason that says nothing about its items (send these alone). Otherwise
// (no error, a Retryable one, a deadline, a cancel) each item gets the
// answer: its caller retries or gives up.
func refusal(err error) (unimplemented, refused bool) {
	switch connect.CodeOf(err) {
	case connect.CodeUnimplemented:
		return true, false
	case connect.CodeDeadlineExceeded, connect.CodeCanceled:
		return false, false
	}
	return false, err != nil && !Retryable(err)
}

// outcomeError is the *connect.Error of a batched call's outcome, nil
// when code is empty (it succeeded); details, when given, carries the
// error details.
func outcomeError(code, message string, details *wardenv1.BatchOutcome) error {
	if code == "" {
		return nil
	}
	var c connect.Code
	if err := c.UnmarshalText([]byte(code)); err != nil {
		return connect.NewError(connect.CodeUnknown, fmt.Errorf("warden: outcome code %q: %s", code, message))
	}
	e := connect.NewError(c, errors.New(message))
	for _, d := range details.GetDetails() {
		if ed, err := connect.NewErrorDetail(d); err == nil {
			e.AddDetail(ed)
		}
	}
	return e
}

// callContext is a context for a call on behalf of batch: it ends at
// the latest of their deadlines (never, when one has none), or as soon as
// every one of them has given up, each then put off by linger. An item
// whose caller gives up earlier is still sent; its call has returned to
// that caller already.
func callContext[T any](batch []T, ctxOf func(T) context.Context, linger time.Duration) (context.Context, context.CancelFunc) {
	var last time.Time
	forever := false
	for _, o := range batch {
		d, ok := ctxOf(o).Deadline()
		if !ok {
			forever = true
		} else if d.After(last) {
			last = d
		}
	}
	callers, gone := context.WithCancel(context.Background())
	ctx, cancel := callers, context.CancelFunc(func() {})
	if !forever {
		ctx, cancel = context.WithDeadline(callers, last.Add(linger))
	}
	var left atomic.Int64
	left.Store(int64(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, o := range batch {
		stops[i] = context.AfterFunc(ctxOf(o), func() {
			if left.Add(-1) == 0 {
				time.AfterFunc(linger, gone)
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
		gone()
	}
}
