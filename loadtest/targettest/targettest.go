// Package targettest holds the test helpers the harness.Target adapters
// (targets/etcd, targets/zk) share: the contract every adapter must meet,
// an acquire that rides out a fault, and a free port range for the
// servers a test starts. It is imported only by tests.
package targettest

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-dev/warden/loadtest/harness"
)

// FreeBase finds a base port b such that b+off is free on 127.0.0.1 for
// every off in offsets; it fails t when 100 random bases in 20000..59999
// were all taken.
func FreeBase(t *testing.T, offsets []int) int {
	t.Helper()
	for try := 0; try < 100; try++ {
		b := 20000 + rand.IntN(40000)
		ok := true
		var ls []net.Listener
		for _, off := range offsets {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(b+off))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			return b
		}
	}
	t.Fatal("no free port range found")
	return 0
}

type result struct {
	l   harness.Lease
	err error
}

// Contract checks the harness.Target behaviour every adapter must have,
// on resource res (which must be free), with 10 s leases: acquire, a
// second acquire gets ErrHeld, renew, release, renew and release after
// release get ErrLost, tokens grow, a waiting acquire is granted once the
// holder releases, a wait that runs out gives ErrHeld, and an acquire
// whose ctx ends while it queues gets deadline_exceeded.
//
// On return every lease Contract took is released, but the waiter it
// abandoned through its ctx may still be cleaning up: the caller checks,
// in its adapter's own terms, that it leaves nothing behind.
func Contract(t *testing.T, tg harness.Target, res string) {
	ctx := context.Background()
	const ttl = 10 * time.Second
	acquire := func(res string, ttl, wait time.Duration) harness.Lease {
		t.Helper()
		l, err := tg.Acquire(ctx, res, ttl, wait)
		if err != nil {
			t.Fatalf("acquire %s: %v", res, err)
		}
		return l
	}

	l1 := acquire(res, ttl, 0)
	if l1.TTL != ttl || l1.Resource != res {
		t.Errorf("lease = %+v, want TTL %v on %s", l1, ttl, res)
	}
	if _, err := tg.Acquire(ctx, res, ttl, 0); !errors.Is(err, harness.ErrHeld) {
		t.Fatalf("second acquire: err = %v, want ErrHeld", err)
	}
	if err := tg.Renew(ctx, l1); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if err := tg.Release(ctx, l1); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := tg.Renew(ctx, l1); !errors.Is(err, harness.ErrLost) {
		t.Fatalf("renew after release: err = %v, want ErrLost", err)
	}
	if err := tg.Release(ctx, l1); !errors.Is(err, harness.ErrLost) {
		t.Fatalf("release after release: err = %v, want ErrLost", err)
	}
	l2 := acquire(res, ttl, 0)
	if l2.Token <= l1.Token {
		t.Fatalf("reacquire token %d <= %d", l2.Token, l1.Token)
	}

	// A waiting acquire is granted once the holder releases.
	ch := make(chan result, 1)
	go func() {
		l, err := tg.Acquire(ctx, res, ttl, 10*time.Second)
		ch <- result{l, err}
	}()
	select {
	case r := <-ch:
		t.Fatalf("waiting acquire returned while held: %+v, %v", r.l, r.err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := tg.Release(ctx, l2); err != nil {
		t.Fatalf("release: %v", err)
	}
	var l3 harness.Lease
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("waiting acquire: %v", r.err)
		}
		l3 = r.l
	case <-time.After(10 * time.Second):
		t.Fatal("waiting acquire not granted 10 s after release")
	}
	if l3.Token <= l2.Token {
		t.Fatalf("waiter token %d <= %d", l3.Token, l2.Token)
	}
	if err := tg.Release(ctx, l3); err != nil {
		t.Fatalf("release: %v", err)
	}

	// A wait that runs out gives ErrHeld.
	l4 := acquire(res, ttl, 0)
	start := time.Now()
	if _, err := tg.Acquire(ctx, res, ttl, 700*time.Millisecond); !errors.Is(err, harness.ErrHeld) {
		t.Fatalf("acquire with short wait: err = %v, want ErrHeld", err)
	}
	if d := time.Since(start); d < 600*time.Millisecond || d > 5*time.Second {
		t.Errorf("short wait took %v", d)
	}
	// A caller whose ctx ends while it queues gets deadline_exceeded (the
	// caller checks that it leaves nothing behind).
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := tg.Acquire(cctx, res, ttl, 5*time.Second)
	cancel()
	var c harness.Coder
	if !errors.As(err, &c) || c.Code() != "deadline_exceeded" {
		t.Fatalf("acquire past ctx deadline: err = %v, want deadline_exceeded", err)
	}
	if err := tg.Release(ctx, l4); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// AcquireRetry acquires res with a 10 s lease and no wait, retrying an
// acquire that fails with a coded error (a cluster that is electing a
// leader) or ErrHeld (an earlier try that ran out of time may still have
// been granted; its lock is released in the background) until within has
// passed, logging each failure. Each try has 5 s; t fails on any other
// error or when within runs out.
func AcquireRetry(t *testing.T, tg harness.Target, res string, within time.Duration) harness.Lease {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l, err := tg.Acquire(ctx, res, 10*time.Second, 0)
		cancel()
		if err == nil {
			return l
		}
		var c harness.Coder
		retry := errors.As(err, &c) || errors.Is(err, harness.ErrHeld)
		if !retry || time.Now().After(deadline) {
			t.Fatalf("acquire %s: %v", res, err)
		}
		t.Logf("acquire %s: %v (retrying)", res, err)
		time.Sleep(100 * time.Millisecond)
	}
}

// Peers is a three-member peer cluster run by one of loadtest/peers/*.sh.
type Peers struct {
	// Script is the script's absolute path; Env its extra environment.
	Script string
	Env    []string
	// Endpoints are the members' addresses, as the script's start prints
	// them on its last line.
	Endpoints []string
}

// StartPeers starts the cluster of script (a path relative to the test's
// package) with env, once installed reports the server is present, and
// stops it when the test ends. A missing server skips the test, or fails
// it when WARDEN_PEER_TESTS=1 (as in CI).
func StartPeers(t *testing.T, name, script string, installed func() bool, env []string) *Peers {
	t.Helper()
	if !installed() {
		if os.Getenv("WARDEN_PEER_TESTS") != "1" {
			t.Skipf("%s not installed (%s install); set WARDEN_PEER_TESTS=1 to make this a failure", name, script)
		}
		t.Fatalf("%s not installed and WARDEN_PEER_TESTS=1: run %s install", name, script)
	}
	abs, err := filepath.Abs(script)
	if err != nil {
		t.Fatal(err)
	}
	p := &Peers{Script: abs, Env: env}
	t.Cleanup(func() {
		if out, err := p.Run("stop"); err != nil {
			t.Errorf("%s stop: %v\n%s", script, err, out)
		}
	})
	start := time.Now()
	out, err := p.Run("start")
	if err != nil {
		t.Fatalf("%s start: %v\n%s", script, err, out)
	}
	t.Logf("%s cluster started in %v", name, time.Since(start).Round(time.Millisecond))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	p.Endpoints = strings.Split(lines[len(lines)-1], ",")
	return p
}

// Run runs the script with args and returns its combined output.
func (p *Peers) Run(args ...string) (string, error) {
	cmd := exec.Command("bash", append([]string{p.Script}, args...)...)
	cmd.Env = append(os.Environ(), p.Env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// FaultTarget is a target that injects faults.
type FaultTarget interface {
	harness.Target
	harness.Faulter
}

// Faults injects each fault kind in turn and checks that the target still
// grants afterwards (within acquireWait) with a token above every earlier
// one, then releases; on a failed fault it shows the peers' status.
func Faults(t *testing.T, ctx context.Context, tg FaultTarget, peers *Peers, kinds []string, acquireWait time.Duration) {
	t.Helper()
	var last uint64
	for _, kind := range kinds {
		start := time.Now()
		if err := tg.Fault(ctx, kind); err != nil {
			status, _ := peers.Run("status")
			t.Fatalf("fault %s: %v\nstatus:\n%s", kind, err, status)
		}
		l := AcquireRetry(t, tg, "fault-res", acquireWait)
		if l.Token <= last {
			t.Fatalf("after %s: token %d <= %d", kind, l.Token, last)
		}
		last = l.Token
		if err := tg.Release(ctx, l); err != nil {
			t.Fatalf("after %s: release: %v", kind, err)
		}
		t.Logf("%s + acquire/release: %v", kind, time.Since(start).Round(time.Millisecond))
	}
}
