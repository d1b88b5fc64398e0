package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// waitingCLI starts the warden CLI as a client process waiting for
// resource through node n; the test SIGKILLs it mid-wait.
func (c *procCluster) waitingCLI(n *node, resource, requestID string, wait time.Duration) *exec.Cmd {
	c.t.Helper()
	cmd := exec.Command(cliBinary, "--addr", "http://"+n.listen, "--timeout", (wait + 10*time.Second).String(),
		"lock", "acquire", resource, "--request-id", requestID, "--ttl", "30s", "--wait", wait.String())
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	return cmd
}

// resettable is a Connect client over HTTP/1.1 whose connections the
// test can reset, as a network fault or a dying proxy would.
type resettable struct {
	mu    sync.Mutex
	conns []net.Conn
	locks wardenv1connect.LockServiceClient
}

func newResettable(n *node) *resettable {
	r := &resettable{}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			r.mu.Lock()
			r.conns = append(r.conns, conn)
			r.mu.Unlock()
		}
		return conn, err
	}}
	r.locks = wardenv1connect.NewLockServiceClient(&http.Client{Transport: tr}, "http://"+n.listen)
	return r
}

func (r *resettable) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // an RST, not a FIN
		}
		_ = c.Close()
	}
}

// Case L16 on three processes: a waiter that gave up never becomes a
// ghost holder. A holds r; B waits and gives up — (a) its 300 ms client
// deadline passes, (b) its process (the warden CLI) is SIGKILLed, (c) its
// connection is reset; C waits behind B. Once B's place is gone, A
// releases: C is granted at once (the release hands over in its own log
// entry), r is never held by nobody, and B's retry with its request id
// learns that its attempt ended.
func TestClusterCaseL16GaveUpWaiterIsNoGhost(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	for _, variant := range []string{"deadline", "sigkill", "reset"} {
		r := "l16-" + variant
		n := c.nodes[rand.IntN(3)]
		a, err := n.acquire(r, "a", 30*time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		bGone := make(chan error, 1)
		switch variant {
		case "deadline":
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				_, err := n.locks.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: r, RequestId: "b",
					LeaseTtl: durationpb.New(30 * time.Second), WaitTimeout: durationpb.New(20 * time.Second)}))
				bGone <- err
			}()
			c.waitWaiters(r, 1)
		case "sigkill":
			cmd := c.waitingCLI(n, r, "b", 20*time.Second)
			c.waitWaiters(r, 1)
			_ = cmd.Process.Kill()
			bGone <- cmd.Wait()
		case "reset":
			rc := newResettable(n)
			go func() {
				_, err := rc.locks.Acquire(context.Background(), connect.NewRequest(&wardenv1.AcquireRequest{Resource: r, RequestId: "b",
					LeaseTtl: durationpb.New(30 * time.Second), WaitTimeout: durationpb.New(20 * time.Second)}))
				bGone <- err
			}()
			c.waitWaiters(r, 1)
			rc.reset()
		}
		cDone := make(chan waitAnswer, 1)
		go func() {
			l, err := n.acquire(r, "c", 30*time.Second, 20*time.Second)
			cDone <- waitAnswer{l, err, time.Now()}
		}()
		if err := <-bGone; err == nil {
			t.Fatalf("%s: B was granted while A holds r", variant)
		}
		// B's place is given up by its cancel: only C waits.
		c.waitWaiters(r, 1)
		released := time.Now()
		if ok, err := n.release(r, a.GetLeaseId()); err != nil || !ok {
			t.Fatalf("%s: A's release: %v %v", variant, ok, err)
		}
		var got waitAnswer
		select {
		case got = <-cDone:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: C was not granted after A's release (a ghost holder?): %v", variant, c.describeOf(r))
		}
		if got.err != nil {
			t.Fatalf("%s: C: %v", variant, got.err)
		}
		took := got.at.Sub(released)
		if took > time.Second {
			t.Fatalf("%s: C was granted %v after A's release", variant, took)
		}
		if d := c.describeOf(r); !d.GetHeld() || d.GetFencingToken() != got.lease.GetFencingToken() {
			t.Fatalf("%s: r is %v, want held by C (token %#x)", variant, d, got.lease.GetFencingToken())
		}
		// B retries with its request id: its attempt ended (no lease).
		_, err = n.acquire(r, "b", 30*time.Second, 0)
		if code := connect.CodeOf(err); code != connect.CodeFailedPrecondition && code != connect.CodeAborted && code != connect.CodeDeadlineExceeded {
			t.Fatalf("%s: B's retry: %v, want its attempt ended", variant, err)
		}
		t.Logf("%s: C granted %v after A's release; B's retry: %v", variant, took.Round(time.Millisecond), connect.CodeOf(err))
	}
}

// describeOf describes resource through any running node (nil on error).
func (c *procCluster) describeOf(resource string) *wardenv1.DescribeResponse {
	d, _ := c.any().describe(resource)
	return d
}

// Case L17 on three processes: dead and timed-out waiters never block
// the head of the queue. A holds r while clients loop Acquire with fresh
// ids and a 500 ms wait, and waiting CLI processes are SIGKILLed
// mid-wait; then W waits and A releases. W is granted at once; every
// loop client is told deadline_exceeded about its wait after it began;
// Describe never counts more waiters than could still be waiting; the
// queue is empty when the load stops. make test runs it for 10 s with 30
// clients and 5 kills; WARDEN_SOAK=1 (make soak) at the case's scale, 60
// s with 100 clients and 20 kills.
func TestClusterCaseL17ChurningWaiters(t *testing.T) {
	t.Parallel()
	clients, kills, run := 30, 5, 10*time.Second
	if os.Getenv("WARDEN_SOAK") != "" {
		clients, kills, run = 100, 20, 60*time.Second
	}
	const wait, tick = 500 * time.Millisecond, 250 * time.Millisecond
	c := startProcCluster(t)
	a, err := c.nodes[0].acquire("l17", "a", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	var (
		stop   atomic.Bool
		wg     sync.WaitGroup
		mu     sync.Mutex
		starts []time.Time // every attempt's start: it may be queued until start + wait + a tick
		lates  []time.Duration
		errs   []error
	)
	begin := func() int {
		mu.Lock()
		defer mu.Unlock()
		starts = append(starts, time.Now())
		return len(starts) - 1
	}
	for i := range clients {
		wg.Go(func() {
			for k := 0; !stop.Load(); k++ {
				n := c.nodes[rand.IntN(3)]
				begin()
				start := time.Now()
				_, err := n.acquire("l17", fmt.Sprintf("c%d-%d", i, k), 30*time.Second, wait)
				late := time.Since(start) - wait
				mu.Lock()
				lates = append(lates, late)
				if connect.CodeOf(err) != connect.CodeDeadlineExceeded || late > time.Second {
					errs = append(errs, fmt.Errorf("client %d attempt %d: %v after its wait + %v", i, k, err, late))
				}
				mu.Unlock()
			}
		})
	}
	wg.Go(func() { // A renews; kills come spread over the run
		for k := 0; !stop.Load(); k++ {
			if err := c.nodes[0].renew("l17", a.GetLeaseId()); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("A's renewal: %v", err))
				mu.Unlock()
			}
			if k < kills {
				at := begin()
				cmd := c.waitingCLI(c.nodes[rand.IntN(3)], "l17", fmt.Sprintf("killed-%d", k), 5*time.Second)
				time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				mu.Lock()
				// Its connection is gone: its place must go with it (a
				// tick aside), not at the end of its 5 s wait.
				starts[at] = time.Now().Add(-wait)
				mu.Unlock()
			}
			time.Sleep(run / time.Duration(kills+1))
		}
	})
	// Describe never counts a waiter whose wait has passed, a tick aside.
	var samples, most int
	for end := time.Now().Add(run); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		asked := time.Now()
		d, err := c.nodes[rand.IntN(3)].describe("l17")
		if err != nil {
			t.Fatalf("describe: %v", err)
		}
		mu.Lock()
		possible := 0
		for _, s := range starts {
			if s.Add(wait + tick + 200*time.Millisecond).After(asked) {
				possible++
			}
		}
		mu.Unlock()
		if int(d.GetWaiters()) > possible {
			t.Fatalf("Describe counts %d waiters; at most %d could still be waiting", d.GetWaiters(), possible)
		}
		samples++
		most = max(most, int(d.GetWaiters()))
	}
	// W, then A's release: W is the head once the churn's waits are over.
	wDone := make(chan waitAnswer, 1)
	go func() {
		l, err := c.nodes[1].acquire("l17", "w", 30*time.Second, 5*time.Second)
		wDone <- waitAnswer{l, err, time.Now()}
	}()
	stop.Store(true)
	wg.Wait()
	// W alone, within a tick or so: the queue holds nobody who left.
	c.waitWaitersWithin("l17", 1, 2*time.Second)
	released := time.Now()
	if ok, err := c.nodes[0].release("l17", a.GetLeaseId()); err != nil || !ok {
		t.Fatalf("A's release: %v %v", ok, err)
	}
	got := <-wDone
	if got.err != nil || got.at.Sub(released) > time.Second {
		t.Fatalf("W: %v %v, %v after the release", got.lease, got.err, got.at.Sub(released))
	}
	for _, err := range errs[:min(len(errs), 10)] {
		t.Error(err)
	}
	slices.Sort(lates)
	t.Logf("%d attempts, %d describes (at most %d waiters seen); told deadline_exceeded at wait + %v (median), + %v (p99), + %v (max); W granted %v after the release",
		len(lates), samples, most, lates[len(lates)/2].Round(time.Millisecond), lates[len(lates)*99/100].Round(time.Millisecond), lates[len(lates)-1].Round(time.Millisecond), got.at.Sub(released).Round(time.Millisecond))
	if d := c.describeOf("l17"); d.GetWaiters() != 0 {
		t.Fatalf("waiters left when the load stopped: %v", d)
	}
}
