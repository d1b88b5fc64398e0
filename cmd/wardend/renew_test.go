package main

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/client"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// rawRenewer renews one lease every period with Renew calls of a 1 s
// deadline, as a client without the SDK would: through its preferred
// node, and through the next running one when a call fails. With
// retryFor set, a renewal not done within retryFor of its first call
// counts as failed (it goes on trying until the TTL runs out).
type rawRenewer struct {
	c               *procCluster
	resource, lease string
	ttl, period     time.Duration
	retryFor        time.Duration
	stop            chan struct{}
	done            chan struct{}
	mu              sync.Mutex
	errs            []error
	renewals, fails int
	slowest         time.Duration // of the calls that failed
}

func (c *procCluster) renewEvery(resource string, l *wardenv1.AcquireResponse, ttl, period, retryFor time.Duration, via int) *rawRenewer {
	w := &rawRenewer{c: c, resource: resource, lease: l.GetLeaseId(), ttl: ttl, period: period, retryFor: retryFor, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run(via)
	return w
}

func (w *rawRenewer) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, err)
}

func (w *rawRenewer) run(via int) {
	defer close(w.done)
	last := time.Now() // the acquire
	for {
		select {
		case <-w.stop:
			return
		case <-time.After(w.period):
		}
		first, late := time.Now(), false
		for ok := false; !ok; {
			if w.retryFor > 0 && !late && time.Since(first) > w.retryFor {
				late = true
				w.fail(fmt.Errorf("renewal of %s not answered within %v (last success %v before)", w.resource, w.retryFor, time.Since(last).Round(time.Millisecond)))
			}
			if time.Since(last) > w.ttl {
				w.fail(fmt.Errorf("no renewal succeeded for %v, past the %v TTL", time.Since(last), w.ttl))
				return
			}
			n := w.c.nodes[via]
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			start := time.Now()
			_, err := n.locks.Renew(ctx, connect.NewRequest(&wardenv1.RenewRequest{Resource: w.resource, LeaseId: w.lease}))
			took := time.Since(start)
			cancel()
			w.mu.Lock()
			switch code := connect.CodeOf(err); {
			case err == nil:
				w.renewals++
				last, ok = start, true
			case code == connect.CodeFailedPrecondition:
				w.errs = append(w.errs, fmt.Errorf("renew through node %d %v after the last success, within the TTL: %v", via+1, time.Since(last), err))
			case code != connect.CodeUnavailable && code != connect.CodeDeadlineExceeded:
				w.errs = append(w.errs, fmt.Errorf("renew through node %d: %v", via+1, err))
			default:
				w.fails++
				w.slowest = max(w.slowest, took)
				if took > 1500*time.Millisecond {
					w.errs = append(w.errs, fmt.Errorf("renew through node %d hung for %v (1 s deadline): %v", via+1, took, err))
				}
			}
			w.mu.Unlock()
			if !ok {
				for via = (via + 1) % len(w.c.nodes); !w.c.nodes[via].up.Load(); via = (via + 1) % len(w.c.nodes) {
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
}

// finish stops the renewals and fails the test on what they saw.
func (w *rawRenewer) finish(t *testing.T) {
	t.Helper()
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, err := range w.errs {
		t.Error(err)
	}
	t.Logf("raw renewals: %d succeeded, %d failed retryably (slowest failure %v)", w.renewals, w.fails, w.slowest.Round(time.Millisecond))
}

// Case L20 on three processes: renewals ride through node loss and
// elections. A raw client renews a 6 s lease every 2 s through node C
// with a 1 s deadline per call, and the SDK holds another; C is
// SIGKILLed (renewals go through another node), restarted, and then the
// shard's leader is SIGKILLed. No renewal answers failed_precondition
// within the TTL, none hangs past its deadline, nobody else gets either
// lock and the tokens never change, and the SDK's lease never closes
// Done.
func TestClusterCaseL20RenewalsRideThroughNodeLoss(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	const ttl = 6 * time.Second
	C := c.notLeader("l20-raw")
	raw, err := c.nodes[C].acquire("l20-raw", "raw", ttl, 0)
	if err != nil {
		t.Fatal(err)
	}
	urls := []string{"http://" + c.nodes[C].listen}
	for i, n := range c.nodes {
		if i != C {
			urls = append(urls, "http://"+n.listen)
		}
	}
	cl, err := client.New(urls...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sdk, err := cl.Lock(ctx, "l20-sdk", client.LockOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	w := c.renewEvery("l20-raw", raw, ttl, 2*time.Second, 0, C)
	alive := func(when string) {
		t.Helper()
		select {
		case <-sdk.Done():
			t.Fatalf("%s: the SDK's lease closed Done: %v", when, sdk.Err())
		default:
		}
	}
	time.Sleep(3 * time.Second)
	c.kill(C)
	time.Sleep(5 * time.Second) // two renewal periods without node C
	alive("node C down")
	c.start(C)
	c.waitServing(C)
	leader := c.leaderIndex("l20-raw")
	c.kill(leader)
	c.waitLeaderNot(leader)
	time.Sleep(5 * time.Second)
	alive("after the leader's SIGKILL")
	c.start(leader)
	c.waitServing(leader)
	w.finish(t)
	alive("at the end")
	for r, want := range map[string]uint64{"l20-raw": raw.GetFencingToken(), "l20-sdk": sdk.Token()} {
		d, err := c.any().describe(r)
		if err != nil || !d.GetHeld() || d.GetFencingToken() != want {
			t.Fatalf("%s: %v %v, want still held with token %#x", r, d, err, want)
		}
	}
	if err := sdk.Unlock(ctx); err != nil {
		t.Fatalf("the SDK's unlock: %v", err)
	}
}

// quorumLossBound is how soon a call through the one running node of
// three must answer Unavailable (DESIGN.md §5, "two replicas down").
const quorumLossBound = 6 * time.Second

// Issue 41, fault 4: with two of three nodes SIGSTOPped, a Renew through
// the third answers Unavailable within quorumLossBound, so its caller
// can stop work or try elsewhere, and so do an Acquire and a Release;
// after SIGCONT the same lease renews. Once with the running node the
// shard's leader, once with it a follower (the leader stopped). The
// bound is 1.5 times the 4 s DESIGN.md states (measured 0.3-3.8 s), for
// a loaded 2-core machine; it is also what the fault report called a
// hang. Before the fix a Renew through the follower, and an Acquire
// through the leader once it stepped down, got no answer until the
// caller's 20 s deadline: the node forwarded them to a stopped node,
// whose kernel accepts the connection, and waited without a bound.
func TestClusterCallsWithoutQuorumAnswerUnavailable(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	for _, survivorLeads := range []bool{true, false} {
		name := map[bool]string{true: "leader", false: "follower"}[survivorLeads]
		var a, b *wardenv1.AcquireResponse
		if err := retryUnavailable(func() (err error) { a, err = c.nodes[0].acquire("quorum/"+name, "a", time.Minute, 0); return err }); err != nil {
			t.Fatal(err)
		}
		if err := retryUnavailable(func() (err error) { b, err = c.nodes[0].acquire("quorum/"+name+"-b", "b", time.Minute, 0); return err }); err != nil {
			t.Fatal(err)
		}
		survivor := c.leaderIndex("quorum/" + name)
		if !survivorLeads {
			survivor = c.notLeader("quorum/" + name)
		}
		n := c.nodes[survivor]
		var stopped []int
		for i := range c.nodes {
			if i != survivor {
				_ = c.nodes[i].cmd.Process.Signal(syscall.SIGSTOP)
				stopped = append(stopped, i)
			}
		}
		calls := map[string]func(context.Context) error{
			"renew": func(ctx context.Context) error {
				_, err := n.locks.Renew(ctx, connect.NewRequest(&wardenv1.RenewRequest{Resource: "quorum/" + name, LeaseId: a.GetLeaseId()}))
				return err
			},
			"acquire": func(ctx context.Context) error {
				_, err := n.locks.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "quorum/" + name + "-c", RequestId: "c", LeaseTtl: durationpb.New(time.Minute)}))
				return err
			},
			"release": func(ctx context.Context) error {
				_, err := n.locks.Release(ctx, connect.NewRequest(&wardenv1.ReleaseRequest{Resource: "quorum/" + name + "-b", LeaseId: b.GetLeaseId()}))
				return err
			},
		}
		for _, op := range []string{"renew", "acquire", "release"} {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			start := time.Now()
			err := calls[op](ctx)
			took := time.Since(start)
			cancel()
			t.Logf("%s through the %s: %v after %v", op, name, err, took.Round(time.Millisecond))
			if code := connect.CodeOf(err); err == nil || code != connect.CodeUnavailable || took > quorumLossBound {
				t.Errorf("%s through node %d, the shard's %s, with the other two stopped: %v after %v, want unavailable within %v",
					op, survivor+1, name, err, took.Round(time.Millisecond), quorumLossBound)
			}
		}
		for _, i := range stopped {
			_ = c.nodes[i].cmd.Process.Signal(syscall.SIGCONT)
		}
		if err := retryUnavailable(func() error { return n.renew("quorum/"+name, a.GetLeaseId()) }); err != nil {
			t.Fatalf("renew through node %d after SIGCONT: %v", survivor+1, err)
		}
	}
}
