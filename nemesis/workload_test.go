//go:build linux

package nemesis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// The workload: clients calling every node directly (so, in a
// partition, clients on every side), acquiring, renewing, releasing,
// describing, waiting and cancelling waits on a few hot resources with
// short leases, and a probe per node that acquires a fresh resource
// again and again, which measures when a node serves grants. Every call
// is recorded with its invoke and completion time.

// Outcomes of a call.
const (
	okOutcome   = "ok"          // granted, renewed, released, described
	refused     = "refused"     // a definite no: held, not current, wait timed out
	unavailable = "unavailable" // Unavailable: the outcome may be unknown, nothing promised
	unknown     = "unknown"     // deadline, cancel, transport error: the outcome is unknown
)

// op is one recorded call.
type op struct {
	client int
	node   int    // the node called
	kind   string // acquire, renew, release, describe
	res    string
	lease  string // the lease id: acquire's answer, or renew's and release's argument
	// invoke and done are this process's clock readings before the call
	// and after its answer.
	invoke, done time.Time
	outcome      string
	code         connect.Code // of an error
	token        uint64       // acquire: the grant's; describe: the lock's
	expires      time.Time    // acquire and renew: the server's expires_at; describe: the lock's
	held         bool         // describe
	released     bool         // release: the answer
	wait         bool         // acquire with a wait_timeout
	cancelled    bool         // acquire whose wait the client cancelled
}

// history collects ops from many goroutines.
type history struct {
	mu    sync.Mutex
	ops   []op
	quota []qop
}

func (h *history) addQuota(o qop) {
	h.mu.Lock()
	h.quota = append(h.quota, o)
	h.mu.Unlock()
}

func (h *history) quotaSnapshot() []qop {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]qop(nil), h.quota...)
}

func (h *history) add(o op) {
	h.mu.Lock()
	h.ops = append(h.ops, o)
	h.mu.Unlock()
}

func (h *history) snapshot() []op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]op(nil), h.ops...)
}

// classify sets o's outcome from err.
func classify(o *op, err error) {
	switch code := connect.CodeOf(err); {
	case err == nil:
		o.outcome = okOutcome
	case code == connect.CodeAborted || code == connect.CodeFailedPrecondition || code == connect.CodeResourceExhausted ||
		code == connect.CodeDeadlineExceeded && o.wait && !errors.Is(err, context.DeadlineExceeded):
		o.outcome, o.code = refused, code
	case code == connect.CodeUnavailable:
		o.outcome, o.code = unavailable, code
	default:
		o.outcome, o.code = unknown, code
	}
}

// Workload parameters.
const (
	leaseTTL = 2 * time.Second
	// callTimeout bounds every call but a wait's.
	callTimeout = 3 * time.Second
	waitTimeout = 1500 * time.Millisecond
	// probeInFlight bounds a node's probe calls at once.
	probeInFlight = 32
)

// workload runs clients per node until stop is called.
type workload struct {
	c         *cluster
	hist      *history
	resources []string
	pools     pools
	stop      chan struct{}
	wg        sync.WaitGroup
}

// newWorkload is a workload on c's nodes; start starts it.
func newWorkload(c *cluster) *workload {
	return &workload{c: c, hist: &history{}, resources: []string{"hot/a", "hot/b", "hot/c"}, stop: make(chan struct{})}
}

// start starts perNode lock clients, a quota client and a probe on
// every node.
func (w *workload) start(seed uint64, perNode int) {
	for i := range w.c.nodes {
		for k := range perNode {
			id := i*perNode + k
			rng := rand.New(rand.NewPCG(seed, uint64(id)))
			w.wg.Go(func() { w.client(id, i, rng) })
		}
		rng := rand.New(rand.NewPCG(seed, uint64(1000+i)))
		w.wg.Go(func() { w.quotaClient(i, i, rng) })
		w.wg.Go(func() { w.probe(i) })
	}
}

func (w *workload) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
}

func (w *workload) stopped() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// pause sleeps d, or less when the workload stops.
func (w *workload) pause(d time.Duration) {
	select {
	case <-w.stop:
	case <-time.After(d):
	}
}

// client is one client of node i: it keeps the leases it holds renewed
// at half their TTL, releases some, and tries for the others.
func (w *workload) client(id, i int, rng *rand.Rand) {
	held := map[string]op{} // resource → the acquire that granted it
	renewed := map[string]time.Time{}
	for n := 0; !w.stopped(); n++ {
		w.pause(time.Duration(20+rng.IntN(60)) * time.Millisecond)
		r := w.resources[rng.IntN(len(w.resources))]
		if g, ok := held[r]; ok {
			if time.Since(renewed[r]) < leaseTTL/2 && rng.IntN(3) > 0 {
				continue
			}
			if rng.IntN(4) == 0 {
				w.release(id, i, r, g.lease)
				delete(held, r)
				continue
			}
			if o := w.renew(id, i, r, g.lease); o.outcome == okOutcome {
				renewed[r] = o.done
			} else {
				delete(held, r) // refused, or unknown: the holder must stop
			}
			continue
		}
		switch k := rng.IntN(10); {
		case k < 1:
			w.describe(id, i, r)
		default:
			var wait, cancelAfter time.Duration
			if k >= 7 {
				wait = waitTimeout
				if k == 9 {
					cancelAfter = time.Duration(100+rng.IntN(600)) * time.Millisecond
				}
			}
			if o := w.acquire(id, i, r, fmt.Sprintf("c%d-%d", id, n), wait, cancelAfter); o.outcome == okOutcome {
				held[r], renewed[r] = o, o.done
			}
		}
	}
	for r, g := range held { // let the next run start from free locks
		w.release(id, i, r, g.lease)
	}
}

// probe acquires and releases a fresh resource on node i every 50 ms
// until the workload stops, without waiting for the calls before (at
// most probeInFlight at once): its grants show when the node serves
// again, not when a call stuck in the fault gives up.
func (w *workload) probe(i int) {
	slots := make(chan struct{}, probeInFlight)
	for n := 0; !w.stopped(); n++ {
		select {
		case slots <- struct{}{}:
			w.wg.Go(func() {
				defer func() { <-slots }()
				r := fmt.Sprintf("probe/%d/%d", i+1, n)
				if o := w.acquire(-1-i, i, r, r, 0, 0); o.outcome == okOutcome {
					w.release(-1-i, i, r, o.lease)
				}
			})
		default:
		}
		w.pause(50 * time.Millisecond)
	}
}

// call runs one lock call as op o of w under ctx: it records its invoke and
// completion, classifies its outcome, lets fill take what the answer
// says, and adds o to the history.
func call[Resp any](ctx context.Context, w *workload, o op, send func(context.Context) (*connect.Response[Resp], error), fill func(*op, *Resp)) op {
	o.invoke = time.Now()
	resp, err := send(ctx)
	o.done = time.Now()
	classify(&o, err)
	if err == nil {
		fill(&o, resp.Msg)
	}
	w.hist.add(o)
	return o
}

func (w *workload) acquire(client, i int, r, reqID string, wait, cancelAfter time.Duration) op {
	o := op{client: client, node: i, kind: "acquire", res: r, wait: wait > 0, cancelled: cancelAfter > 0}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout+wait)
	defer cancel()
	if cancelAfter > 0 {
		t := time.AfterFunc(cancelAfter, cancel)
		defer t.Stop()
	}
	req := &wardenv1.AcquireRequest{Resource: r, RequestId: reqID, LeaseTtl: durationpb.New(leaseTTL), Holder: fmt.Sprintf("client-%d", client)}
	if wait > 0 {
		req.WaitTimeout = durationpb.New(wait)
	}
	return call(ctx, w, o, func(ctx context.Context) (*connect.Response[wardenv1.AcquireResponse], error) {
		return w.c.nodes[i].locks.Acquire(ctx, connect.NewRequest(req))
	}, func(o *op, m *wardenv1.AcquireResponse) {
		o.lease, o.token, o.expires = m.GetLeaseId(), m.GetFencingToken(), m.GetExpiresAt().AsTime()
	})
}

func (w *workload) renew(client, i int, r, lease string) op {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return call(ctx, w, op{client: client, node: i, kind: "renew", res: r, lease: lease}, func(ctx context.Context) (*connect.Response[wardenv1.RenewResponse], error) {
		return w.c.nodes[i].locks.Renew(ctx, connect.NewRequest(&wardenv1.RenewRequest{Resource: r, LeaseId: lease}))
	}, func(o *op, m *wardenv1.RenewResponse) { o.expires = m.GetExpiresAt().AsTime() })
}

func (w *workload) release(client, i int, r, lease string) op {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return call(ctx, w, op{client: client, node: i, kind: "release", res: r, lease: lease}, func(ctx context.Context) (*connect.Response[wardenv1.ReleaseResponse], error) {
		return w.c.nodes[i].locks.Release(ctx, connect.NewRequest(&wardenv1.ReleaseRequest{Resource: r, LeaseId: lease}))
	}, func(o *op, m *wardenv1.ReleaseResponse) { o.released = m.GetReleased() })
}

func (w *workload) describe(client, i int, r string) op {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return call(ctx, w, op{client: client, node: i, kind: "describe", res: r}, func(ctx context.Context) (*connect.Response[wardenv1.DescribeResponse], error) {
		return w.c.nodes[i].locks.Describe(ctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: r}))
	}, func(o *op, m *wardenv1.DescribeResponse) {
		o.held, o.token = m.GetHeld(), m.GetFencingToken()
		if m.GetExpiresAt() != nil {
			o.expires = m.GetExpiresAt().AsTime()
		}
	})
}
