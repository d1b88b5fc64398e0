package rpc_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/anishathalye/porcupine"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/internal/lockmodel"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/server"
)

// TestLinearizableUnderLeaderChanges records a concurrent history of
// Acquire, Release and Describe on a few resources while leadership moves
// every half second, and checks it with porcupine. A request whose outcome
// is unknown (unavailable) is retried with the same id until it is known,
// and recorded as one operation from its first call to its last return.
func TestLinearizableUnderLeaderChanges(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	h := runLinClients(t, c, []string{"lin/a", "lin/b", "lin/c"}, 6, 0, 0)
	var leaderChanges int
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); {
		time.Sleep(500 * time.Millisecond)
		if c.moveLeader() {
			leaderChanges++
		}
	}
	n := h.stop()
	if leaderChanges < 2 {
		t.Fatalf("the leader changed %d times: the history does not span leader changes", leaderChanges)
	}
	t.Logf("%d operations linearizable across %d leader changes", n, leaderChanges)
	checkReplicasAgree(t, c)
}

// linHistory is a porcupine history that clients record until stop.
type linHistory struct {
	t       *testing.T
	mu      sync.Mutex
	ops     []porcupine.Operation
	done    chan struct{}
	wg      sync.WaitGroup
	dropped atomic.Int64
	// waits counts Acquires by outcome: "wait granted" (after waiting),
	// "ended" (no lease for the caller: a wait that ran out, or a grant
	// given back) and "given up" (a first try whose caller left a third into its wait,
	// whatever it had been answered by then).
	waits counts
}

// counts is a concurrent count of events by kind.
type counts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counts) Add(kind string, k int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[kind] += k
}

// Snapshot returns the counts so far.
func (c *counts) Snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// runLinClients starts clients that run Acquire (alone or as a one-op
// Batch), Release (some of them stale) and Describe on resources, and
// record what they saw. A fraction drop of the answers is thrown away, as
// if lost on the way back: the client retries with the same id, and the
// operation spans both calls.
func runLinClients(t *testing.T, c *cluster, resources []string, clients int, drop float64, wait time.Duration) *linHistory {
	h := &linHistory{t: t, done: make(chan struct{})}
	// Calls and returns are stamped in the order they happen, not by the
	// clock: in a synctest bubble (TestSimulatedAPI) many happen at one
	// virtual instant, and equal times would tell porcupine neither order.
	var clock atomic.Int64
	since := func() int64 { return clock.Add(1) }
	record := func(client int, in lockmodel.Input, out lockmodel.Output, call int64) {
		h.mu.Lock()
		h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: since()})
		h.mu.Unlock()
	}
	recordEnded := func(client int, resource, id string, call int64) {
		h.mu.Lock()
		h.ops = append(h.ops, lockmodel.Ghost(client, resource, id, call, since())...)
		h.mu.Unlock()
	}
	for cl := range clients {
		h.wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(cl), 7))
			lost := func() bool {
				if rng.Float64() < drop {
					h.dropped.Add(1)
					return true
				}
				return false
			}
			mine := map[string]string{} // resource → lease id held
			var old []string            // leases this client released
			for n := 0; ; n++ {
				select {
				case <-h.done:
					return
				default:
				}
				r := resources[rng.IntN(len(resources))]
				call := since()
				switch k := rng.IntN(10); {
				case k < 4 && mine[r] == "":
					in := lockmodel.Input{Op: "acquire", Resource: r}
					id := fmt.Sprintf("c%d-%d", cl, n)
					// A client waits only while it holds nothing: no two
					// clients wait for each other's locks.
					viaBatch, w := rng.IntN(2) == 0, time.Duration(0)
					if wait > 0 && !viaBatch && len(mine) == 0 && rng.IntN(2) == 0 {
						w = wait
					}
					switch {
					case lost() && w > 0:
						// The caller gives up a third into its wait, as one
						// whose deadline is short; then it retries.
						gctx, cancel := context.WithTimeout(context.Background(), w/3)
						_, _ = c.acquireWait(gctx, r, id, time.Minute, w)
						cancel()
						h.waits.Add("given up", 1)
					case lost():
						tryAcquire(c, r, id, time.Minute, viaBatch, w) // its answer never arrives
					}
					out, ok := linAcquire(c, r, id, time.Minute, viaBatch, w)
					switch {
					case out.Ended:
						h.waits.Add("ended", 1)
					case w > 0 && out.Granted:
						h.waits.Add("wait granted", 1)
					}
					if !ok {
						t.Errorf("acquire %s: outcome never learned", r)
						return
					}
					switch {
					case out.Ended:
						recordEnded(cl, r, id, call)
					case out.Granted:
						mine[r] = out.LeaseID
						fallthrough
					default:
						record(cl, in, out, call)
					}
				case k < 7 && mine[r] != "" || k == 7 && len(old) > 0:
					lease := mine[r]
					if k == 7 {
						lease = old[rng.IntN(len(old))] // a stale release
					}
					in := lockmodel.Input{Op: "release", Resource: r, LeaseID: lease}
					answerLost := lost()
					if answerLost {
						tryRelease(c, r, lease, rng.IntN(2) == 0)
					}
					out, ok := linRelease(c, r, lease, rng.IntN(2) == 0)
					if !ok {
						t.Errorf("release %s: outcome never learned", r)
						return
					}
					if answerLost {
						out.Released = nil // the first try's answer was lost
					}
					if lease == mine[r] {
						delete(mine, r)
						old = append(old, lease)
					}
					record(cl, in, out, call)
				default:
					resp, err := c.locks.Describe(ctx(t), connect.NewRequest(&wardenv1.DescribeRequest{Resource: r}))
					if err != nil || lost() {
						continue // a read with no answer changed nothing
					}
					record(cl, lockmodel.Input{Op: "describe", Resource: r}, lockmodel.Output{Held: resp.Msg.GetHeld(), Token: resp.Msg.GetFencingToken()}, call)
				}
			}
		})
	}
	return h
}

// stop ends the clients, checks the history (check) and returns its
// length.
func (h *linHistory) stop() int {
	h.t.Helper()
	ops := h.end()
	checkLinearizable(h.t, ops)
	return len(ops)
}

// end ends the clients and returns their history.
func (h *linHistory) end() []porcupine.Operation {
	close(h.done)
	h.wg.Wait()
	return h.ops
}

// checkLinearizable checks a history with porcupine, failing the test,
// with where it stops and a visualisation kept for a person to read, if
// it is not linearizable. It runs outside any synctest bubble: the
// check's own time limit is real time.
func checkLinearizable(t *testing.T, ops []porcupine.Operation) {
	t.Helper()
	res, info := porcupine.CheckOperationsVerbose(lockmodel.Model, ops, time.Minute)
	if res != porcupine.Ok {
		f, _ := os.CreateTemp("", "warden-history-*.html")
		_ = porcupine.Visualize(lockmodel.Model, info, f)
		f.Close()
		lockmodel.Explain(ops, info, 40, t.Logf)
		t.Fatalf("history of %d operations is not linearizable (%v); see %s", len(ops), res, f.Name())
	}
}

// linAcquire acquires, retrying the same request id while the outcome is
// unknown, through Acquire (waiting up to wait for the lock, if set) or,
// with viaBatch, a one-op Batch (a BatchCmd on the shard). ok is false if
// the outcome never became known.
func linAcquire(c *cluster, resource, requestID string, ttl time.Duration, viaBatch bool, wait time.Duration) (lockmodel.Output, bool) {
	for range 100 {
		if out, known := tryAcquire(c, resource, requestID, ttl, viaBatch, wait); known {
			return out, true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return lockmodel.Output{}, false
}

// tryAcquire sends one Acquire, alone or as a one-op Batch; known is false
// when its outcome is unknown (or it was refused for another reason than
// a held lock).
func tryAcquire(c *cluster, resource, requestID string, ttl time.Duration, viaBatch bool, wait time.Duration) (out lockmodel.Output, known bool) {
	if viaBatch {
		outcomes, err := c.batch(&wardenv1.BatchOp{Op: &wardenv1.BatchOp_Acquire{Acquire: &wardenv1.AcquireRequest{
			Resource: resource, RequestId: requestID, LeaseTtl: durationpb.New(ttl)}}})
		if err != nil {
			return lockmodel.Output{}, false
		}
		return acquireOutcome(c.t.(*testing.T), outcomes[0])
	}
	resp, err := c.acquireWait(ctx(c.t), resource, requestID, ttl, wait)
	if err == nil {
		return lockmodel.Output{Granted: true, LeaseID: resp.GetLeaseId(), Token: resp.GetFencingToken()}, true
	}
	var ce *connect.Error
	if connect.CodeOf(err) == connect.CodeAborted && errors.As(err, &ce) {
		return lockmodel.Output{Token: detail[*wardenv1.LockHeld](c.t.(*testing.T), ce).GetFencingToken()}, true
	}
	if errors.As(err, &ce) && connect.IsWireError(ce) && (wait > 0 && ce.Code() == connect.CodeDeadlineExceeded || ce.Code() == connect.CodeFailedPrecondition) {
		// The server ended the wait, or the request's grant ended before
		// this caller heard of it (an attempt whose caller left gave it
		// back): no lease for the caller.
		return lockmodel.Output{Ended: true}, true
	}
	return lockmodel.Output{}, false
}

// acquireOutcome reads a Batch's acquire outcome as tryAcquire does an
// Acquire's answer.
func acquireOutcome(t *testing.T, o *wardenv1.BatchOutcome) (lockmodel.Output, bool) {
	switch o.GetCode() {
	case "":
		a := o.GetAcquire()
		return lockmodel.Output{Granted: true, LeaseID: a.GetLeaseId(), Token: a.GetFencingToken()}, true
	case "aborted":
		for _, d := range o.GetDetails() {
			var h wardenv1.LockHeld
			if d.UnmarshalTo(&h) == nil {
				return lockmodel.Output{Token: h.GetFencingToken()}, true
			}
		}
		t.Errorf("aborted outcome without a LockHeld detail: %v", o)
	}
	return lockmodel.Output{}, false
}

// linRelease releases through Release or, with viaBatch, a one-op Batch,
// retrying until an answer comes. out.Released is set only when the
// first try answered, and not when it answered already_released: a
// Release of the lease id ended it, this call's own attempt whose answer
// the router never saw (and retried) or an earlier call, which the
// answer does not tell apart (DESIGN.md §1 rule 3).
func linRelease(c *cluster, resource, leaseID string, viaBatch bool) (lockmodel.Output, bool) {
	for attempt := range 100 {
		if resp, ok := tryRelease(c, resource, leaseID, viaBatch); ok {
			out := lockmodel.Output{}
			if released := resp.GetReleased(); attempt == 0 && !resp.GetAlreadyReleased() {
				out.Released = &released
			}
			return out, true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return lockmodel.Output{}, false
}

// tryRelease sends one Release, alone or as a one-op Batch; ok is false
// when it did not answer.
func tryRelease(c *cluster, resource, leaseID string, viaBatch bool) (resp *wardenv1.ReleaseResponse, ok bool) {
	if !viaBatch {
		resp, err := c.locks.Release(ctx(c.t), connect.NewRequest(&wardenv1.ReleaseRequest{Resource: resource, LeaseId: leaseID}))
		if err != nil {
			return nil, false
		}
		return resp.Msg, true
	}
	outcomes, err := c.batch(releaseOp(resource, leaseID))
	if err != nil || outcomes[0].GetCode() != "" {
		return nil, false
	}
	return outcomes[0].GetRelease(), true
}
