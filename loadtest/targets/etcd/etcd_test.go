package etcd

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
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/warden-dev/warden/loadtest/harness"
)

// cluster is a three-member etcd cluster started by peers/etcd.sh.
type cluster struct {
	script    string
	env       []string
	endpoints []string
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

func startCluster(t *testing.T) *cluster {
	t.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		if os.Getenv("WARDEN_PEER_TESTS") != "1" {
			t.Skip("etcd not installed (loadtest/peers/etcd.sh install); set WARDEN_PEER_TESTS=1 to make this a failure")
		}
		t.Fatal("etcd not installed and WARDEN_PEER_TESTS=1: run loadtest/peers/etcd.sh install")
	}
	script, err := filepath.Abs("../../peers/etcd.sh")
	if err != nil {
		t.Fatal(err)
	}
	base := freeBase(t, []int{0, 1, 10, 11, 20, 21})
	c := &cluster{
		script: script,
		env: []string{
			"LOADTEST_PEER_DIR=" + t.TempDir(),
			fmt.Sprintf("ETCD_CLIENT_BASE=%d", base),
			fmt.Sprintf("ETCD_PEER_BASE=%d", base+1),
			"PEER_START_TIMEOUT=40",
		},
	}
	t.Cleanup(func() {
		if out, err := c.run("stop"); err != nil {
			t.Errorf("etcd.sh stop: %v\n%s", err, out)
		}
	})
	start := time.Now()
	out, err := c.run("start")
	if err != nil {
		t.Fatalf("etcd.sh start: %v\n%s", err, out)
	}
	t.Logf("cluster started in %v", time.Since(start).Round(time.Millisecond))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	c.endpoints = strings.Split(lines[len(lines)-1], ",")
	return c
}

func (c *cluster) run(args ...string) (string, error) {
	cmd := exec.Command("bash", append([]string{c.script}, args...)...)
	cmd.Env = append(os.Environ(), c.env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (c *cluster) target(t *testing.T, mode Mode) *Target {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tg, err := New(ctx, Config{Endpoints: c.endpoints, Mode: mode, Script: c.script, ScriptEnv: c.env})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	return tg
}

func TestEtcd(t *testing.T) {
	c := startCluster(t)
	for _, mode := range []Mode{ModeLease, ModeMutex} {
		t.Run(string(mode), func(t *testing.T) {
			tg := c.target(t, mode)
			contract(t, tg, "res-"+string(mode))
		})
	}
	t.Run("faults", func(t *testing.T) {
		faults(t, c.target(t, ModeLease), c)
	})
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
	// leaves nothing behind.
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
	ctx5, cancel5 := context.WithTimeout(ctx, 5*time.Second)
	l5, err := tg.Acquire(ctx5, res, ttl, 5*time.Second) // waits out the abandoned waiter's cleanup
	cancel5()
	if err != nil {
		t.Fatalf("acquire after abandoned waiter: %v", err)
	}
	if err := tg.Release(ctx, l5); err != nil {
		t.Fatalf("release: %v", err)
	}

	// A short lease that is not renewed expires; the lock can be taken.
	short := acquire(res+"-short", time.Second, 0)
	start = time.Now()
	l6, err := tg.Acquire(ctx, res+"-short", ttl, 15*time.Second)
	if err != nil {
		t.Fatalf("acquire after expiry: %v", err)
	}
	t.Logf("short lease (granted TTL %v) expired after %v", short.TTL, time.Since(start).Round(time.Millisecond))
	if l6.Token <= short.Token {
		t.Fatalf("token after expiry %d <= %d", l6.Token, short.Token)
	}
	if err := tg.Renew(ctx, short); !errors.Is(err, harness.ErrLost) {
		t.Fatalf("renew of expired lease: err = %v, want ErrLost", err)
	}
	if err := tg.Release(ctx, l6); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// acquireRetry retries an acquire that fails with a coded error (a
// cluster that is electing a leader) or ErrHeld (an earlier try that ran
// out of time may still have been granted; its lock is released in the
// background) for up to 15 s, logging each failure.
func acquireRetry(t *testing.T, tg harness.Target, res string) harness.Lease {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
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

func faults(t *testing.T, tg *Target, peers *cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	var last uint64
	step := func(kind string) {
		t.Helper()
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
	for _, kind := range []string{"snapshot", "transfer-leader", "kill", "restart", "kill-leader", "restart"} {
		step(kind)
	}
	if err := tg.Fault(ctx, "bogus"); err == nil {
		t.Error("unknown fault kind accepted")
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code string
	}{
		{context.DeadlineExceeded, "deadline_exceeded"},
		{fmt.Errorf("x: %w", context.Canceled), "canceled"},
		{errors.New("boom"), "other"},
		{rpctypes.ErrNoLeader, "unavailable"},
		{rpctypes.ErrTimeout, "unavailable"},
		{status.Error(codes.Unavailable, "connection refused"), "unavailable"},
		{status.Error(codes.ResourceExhausted, "too big"), "resource_exhausted"},
		{rpctypes.ErrGRPCNoSpace, "resource_exhausted"},
		{clientv3.ErrNoAvailableEndpoints, "unavailable"},
	} {
		var c harness.Coder
		if !errors.As(classify(tc.err), &c) || c.Code() != tc.code {
			t.Errorf("classify(%v) = %v, want code %s", tc.err, classify(tc.err), tc.code)
		}
	}
	if !isLeaseNotFound(rpctypes.ErrLeaseNotFound) || !isLeaseNotFound(rpctypes.ErrGRPCLeaseNotFound) {
		t.Error("lease not found not recognised")
	}
	if !errors.Is(classify(harness.ErrHeld), harness.ErrHeld) {
		t.Error("ErrHeld not kept")
	}
	if got := snake("ResourceExhausted"); got != "resource_exhausted" {
		t.Errorf("snake = %q", got)
	}
	for _, tc := range []struct {
		in   time.Duration
		want int64
	}{{0, 1}, {time.Millisecond, 1}, {time.Second, 1}, {1500 * time.Millisecond, 2}, {30 * time.Second, 30}} {
		if got := ttlSeconds(tc.in); got != tc.want {
			t.Errorf("ttlSeconds(%v) = %d, want %d", tc.in, got, tc.want)
		}
	}
}
