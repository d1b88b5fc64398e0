package zk

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-dev/warden/loadtest/harness"
)

// ensemble is a three-server ZooKeeper ensemble started by peers/zk.sh.
type ensemble struct {
	script  string
	env     []string
	servers []string
}

// freeBase finds a base port b such that b+off is free on 127.0.0.1 for
// every off in offsets.
func freeBase(t *testing.T, offsets []int) int {
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

func zkInstalled() bool {
	if _, err := os.Stat("/usr/share/java/zookeeper.jar"); err != nil {
		return false
	}
	_, err := exec.LookPath("java")
	return err == nil
}

func startEnsemble(t *testing.T) *ensemble {
	t.Helper()
	if !zkInstalled() {
		if os.Getenv("WARDEN_PEER_TESTS") != "1" {
			t.Skip("ZooKeeper not installed (loadtest/peers/zk.sh install); set WARDEN_PEER_TESTS=1 to make this a failure")
		}
		t.Fatal("ZooKeeper not installed and WARDEN_PEER_TESTS=1: run loadtest/peers/zk.sh install")
	}
	script, err := filepath.Abs("../../peers/zk.sh")
	if err != nil {
		t.Fatal(err)
	}
	base := freeBase(t, []int{0, 1, 2, 10, 11, 12, 20, 21, 22})
	e := &ensemble{
		script: script,
		env: []string{
			"LOADTEST_PEER_DIR=" + t.TempDir(),
			fmt.Sprintf("ZK_CLIENT_BASE=%d", base),
			// A short tick makes elections and session expiry fast;
			// minSessionTimeout is then 1 s.
			"ZK_TICK_MS=500",
			"PEER_START_TIMEOUT=40",
		},
	}
	t.Cleanup(func() {
		if out, err := e.run("stop"); err != nil {
			t.Errorf("zk.sh stop: %v\n%s", err, out)
		}
	})
	start := time.Now()
	out, err := e.run("start")
	if err != nil {
		t.Fatalf("zk.sh start: %v\n%s", err, out)
	}
	t.Logf("ensemble started in %v", time.Since(start).Round(time.Millisecond))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	e.servers = strings.Split(lines[len(lines)-1], ",")
	return e
}

func (e *ensemble) run(args ...string) (string, error) {
	cmd := exec.Command("bash", append([]string{e.script}, args...)...)
	cmd.Env = append(os.Environ(), e.env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (e *ensemble) target(t *testing.T, dial zk.Dialer) *Target {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	tg, err := New(ctx, Config{Servers: e.servers, Sessions: 2, Dialer: dial, Script: e.script, ScriptEnv: e.env})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	return tg
}

// freezer is a zk.Dialer whose connections can all be cut at once, with
// new dials refused, so that the sessions behind them expire on the server.
type freezer struct {
	frozen atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func (f *freezer) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	if f.frozen.Load() {
		return nil, errors.New("frozen")
	}
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.conns = append(f.conns, c)
	f.mu.Unlock()
	return c, nil
}

func (f *freezer) freeze() {
	f.frozen.Store(true)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
}

func TestZK(t *testing.T) {
	e := startEnsemble(t)
	t.Run("recipe", func(t *testing.T) {
		contract(t, e.target(t, nil), "res")
	})
	t.Run("expiry", func(t *testing.T) {
		f := &freezer{}
		holder := e.target(t, f.dial)
		other := e.target(t, nil)
		expiry(t, holder, other, f)
	})
	t.Run("faults", func(t *testing.T) {
		faults(t, e.target(t, nil), e)
	})
}

// expiry checks that a lease whose session is cut off expires (after the
// session timeout) and the lock can be taken by another client.
func expiry(t *testing.T, holder, other harness.Target, f *freezer) {
	ctx := context.Background()
	const res = "res-short"
	short, err := holder.Acquire(ctx, res, 2*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if short.TTL != 2*time.Second {
		t.Errorf("TTL = %v, want 2s", short.TTL)
	}
	if err := holder.Renew(ctx, short); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if _, err := other.Acquire(ctx, res, 10*time.Second, 0); !errors.Is(err, harness.ErrHeld) {
		t.Fatalf("acquire while held: err = %v, want ErrHeld", err)
	}
	f.freeze()
	start := time.Now()
	l, err := other.Acquire(ctx, res, 10*time.Second, 15*time.Second)
	if err != nil {
		t.Fatalf("acquire after expiry: %v", err)
	}
	t.Logf("2 s session cut off: lock free again after %v", time.Since(start).Round(time.Millisecond))
	if l.Token <= short.Token {
		t.Fatalf("token after expiry %d <= %d", l.Token, short.Token)
	}
	// While cut off the holder cannot tell; once it reconnects it learns
	// the session expired.
	f.frozen.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := holder.Renew(ctx, short)
		if errors.Is(err, harness.ErrLost) {
			break
		}
		if err == nil || time.Now().After(deadline) {
			t.Fatalf("renew of expired lease: err = %v, want ErrLost", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := holder.Release(ctx, short); !errors.Is(err, harness.ErrLost) {
		t.Fatalf("release of expired lease: err = %v, want ErrLost", err)
	}
	if err := other.Release(ctx, l); err != nil {
		t.Fatalf("release: %v", err)
	}
}

type result struct {
	l   harness.Lease
	err error
}

// contract checks the harness.Target behaviour every adapter must have.
func contract(t *testing.T, tg harness.Target, res string) {
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
	// A caller whose ctx ends while it queues gets deadline_exceeded and
	// leaves no node behind.
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
	l5 := acquire(res, ttl, 0) // fails if the abandoned waiter's node is left
	if err := tg.Release(ctx, l5); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// acquireRetry retries an acquire that fails with a coded error (a
// cluster that is electing a leader) or ErrHeld (an earlier try that ran
// out of time may still have been granted; its lock is released in the
// background) for up to 20 s, logging each failure.
func acquireRetry(t *testing.T, tg harness.Target, res string) harness.Lease {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
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

func faults(t *testing.T, tg *Target, peers *ensemble) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	if err := tg.Fault(ctx, "transfer-leader"); err == nil {
		t.Error("transfer-leader: want an error, ZooKeeper has no such operation")
	}
	var last uint64
	for _, kind := range []string{"snapshot", "kill", "restart", "kill-leader", "restart"} {
		start := time.Now()
		if err := tg.Fault(ctx, kind); err != nil {
			status, _ := peers.run("status")
			t.Fatalf("fault %s: %v\nstatus:\n%s", kind, err, status)
		}
		l := acquireRetry(t, tg, "fault-res")
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

func TestPredecessor(t *testing.T) {
	kids := []string{"_c_bb-lock-0000000012", "_c_aa-lock-0000000003", "_c_cc-lock-0000000010"}
	for _, tc := range []struct{ me, pred string }{
		{"_c_aa-lock-0000000003", ""},
		{"_c_cc-lock-0000000010", "_c_aa-lock-0000000003"},
		{"_c_bb-lock-0000000012", "_c_cc-lock-0000000010"},
	} {
		if p, ok := predecessor(kids, tc.me); !ok || p != tc.pred {
			t.Errorf("predecessor(%s) = %q, %v; want %q", tc.me, p, ok, tc.pred)
		}
	}
	if _, ok := predecessor(kids, "_c_dd-lock-0000000001"); ok {
		t.Error("missing node found")
	}
}
