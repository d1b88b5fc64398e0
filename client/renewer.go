package client

import (
	"context"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// MaxRenewBatch is the most renewals one RenewBatch call carries (the
// server's bound).
const MaxRenewBatch = 1000

// maxBatchBytes bounds a RenewBatch request's encoded size, under the
// server's 64 KiB request limit: 1,000 renewals of long resource names
// would pass it.
const maxBatchBytes = 48 << 10

// Renewer sends the renewals of many leases through one LockService
// client in RenewBatch calls, so that a process holding many locks pays
// one RPC, and one Raft entry per shard, for the renewals that fall due
// within a linger period of each other (etcd's lease keep-alive stream
// and ZooKeeper's session ping amortize the same work). A renewal waits
// at most the linger period before it is sent, or less when 1,000 are
// queued; a call carries at most 1,000 renewals and 48 KiB. A server
// without RenewBatch (Unimplemented), or a call refused as a whole for
// another reason than Unavailable or a deadline, gets plain Renew calls
// instead, all at once. Safe for concurrent use; a Client keeps one per
// endpoint.
type Renewer struct {
	locks  wardenv1connect.LockServiceClient
	linger time.Duration

	mu        sync.Mutex
	queue     []*renewal
	scheduled bool // a flush is due within linger
	single    bool // the server answered Unimplemented to RenewBatch
}

// renewal is one queued Renew.
type renewal struct {
	ctx  context.Context
	req  *wardenv1.RenewRequest
	done chan struct{} // closed when sent, expires and err are set
	sent time.Time
	exp  time.Time
	err  error
}

// DefaultLinger is how long the Go SDK's Renewer holds a renewal to batch
// it with others: small against the 1 s shortest lease TTL, whose renewals
// are due every 333 ms.
const DefaultLinger = 50 * time.Millisecond

// NewRenewer returns a Renewer that sends through locks, holding each
// renewal up to linger (0: none; renewals then share a call only when
// they are queued at the same instant) to batch it.
func NewRenewer(locks wardenv1connect.LockServiceClient, linger time.Duration) *Renewer {
	return &Renewer{locks: locks, linger: linger}
}

// Renew renews the lease leaseID on resource, batched with the renewals
// that are due at about the same time. It returns the send time of the
// call that carried it, which is before the renewal committed (a holder
// counts its local deadline from it), and the lease's new expiry on the
// shard's clock. A refused renewal is a *connect.Error with the code
// Renew would have answered: FailedPrecondition when the lease is not
// current, Unavailable when it may be retried. ctx bounds the wait.
func (r *Renewer) Renew(ctx context.Context, resource, leaseID string) (sent, expiresAt time.Time, err error) {
	rn := &renewal{ctx: ctx, req: &wardenv1.RenewRequest{Resource: resource, LeaseId: leaseID}, done: make(chan struct{})}
	r.mu.Lock()
	r.queue = append(r.queue, rn)
	switch {
	case len(r.queue) >= MaxRenewBatch || r.linger <= 0:
		go r.flush()
	case !r.scheduled:
		r.scheduled = true
		time.AfterFunc(r.linger, r.flush)
	}
	r.mu.Unlock()
	select {
	case <-rn.done:
		return rn.sent, rn.exp, rn.err
	case <-ctx.Done():
		return time.Time{}, time.Time{}, ctx.Err()
	}
}

// flush sends what is queued, in calls of up to MaxRenewBatch renewals.
func (r *Renewer) flush() {
	r.mu.Lock()
	queue := r.queue
	r.queue, r.scheduled = nil, false
	single := r.single
	r.mu.Unlock()
	live := queue[:0]
	for _, rn := range queue {
		if rn.ctx.Err() == nil { // its caller gave up while it queued
			live = append(live, rn)
		}
	}
	for len(live) > 0 {
		n, size := 0, 0
		for n < len(live) && n < MaxRenewBatch {
			size += proto.Size(live[n].req) + 3 // the item's tag and length
			if n > 0 && size > maxBatchBytes {
				break
			}
			n++
		}
		batch := live[:n]
		live = live[n:]
		if single {
			r.sendEach(batch) // it does not block
		} else {
			go r.sendBatch(batch)
		}
	}
}

func (r *Renewer) sendBatch(batch []*renewal) {
	ctx, cancel := callContext(batch, func(rn *renewal) context.Context { return rn.ctx }, 0)
	defer cancel()
	req := &wardenv1.RenewBatchRequest{Renewals: make([]*wardenv1.RenewRequest, len(batch))}
	for i, rn := range batch {
		req.Renewals[i] = rn.req
	}
	sent := time.Now()
	resp, err := r.locks.RenewBatch(ctx, connect.NewRequest(req))
	if unimplemented, refused := refusal(err); unimplemented || refused {
		if unimplemented {
			r.mu.Lock()
			r.single = true
			r.mu.Unlock()
		}
		r.sendEach(batch)
		return
	}
	if err == nil && len(resp.Msg.GetOutcomes()) != len(batch) {
		err = connect.NewError(connect.CodeInternal, fmt.Errorf("warden: RenewBatch answered %d outcomes for %d renewals", len(resp.Msg.GetOutcomes()), len(batch)))
	}
	for i, rn := range batch {
		rn.sent = sent
		if err != nil {
			rn.err = err
		} else {
			rn.exp, rn.err = outcome(resp.Msg.GetOutcomes()[i])
		}
		close(rn.done)
	}
}

// outcome is a RenewOutcome's expiry, or its failure as a *connect.Error.
func outcome(o *wardenv1.RenewOutcome) (time.Time, error) {
	if err := outcomeError(o.GetCode(), o.GetMessage(), nil); err != nil {
		return time.Time{}, err
	}
	return o.GetExpiresAt().AsTime(), nil
}

// sendEach renews batch in plain Renew calls, all at once, for a server
// without RenewBatch or a batch it refused as a whole.
func (r *Renewer) sendEach(batch []*renewal) {
	for _, rn := range batch {
		go func() {
			rn.sent = time.Now()
			resp, err := r.locks.Renew(rn.ctx, connect.NewRequest(rn.req))
			if err == nil {
				rn.exp = resp.Msg.GetExpiresAt().AsTime()
			}
			rn.err = err
			close(rn.done)
		}()
	}
}
