package etcd

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/warden-dev/warden/loadtest/harness"
	"github.com/warden-dev/warden/loadtest/targettest"
)

// cluster is a three-member etcd cluster started by peers/etcd.sh.
type cluster struct{ *targettest.Peers }

func startCluster(t *testing.T) *cluster {
	t.Helper()
	installed := func() bool { _, err := exec.LookPath("etcd"); return err == nil }
	base := targettest.FreeBase(t, []int{0, 1, 10, 11, 20, 21})
	env := []string{
		"LOADTEST_PEER_DIR=" + t.TempDir(),
		fmt.Sprintf("ETCD_CLIENT_BASE=%d", base),
		fmt.Sprintf("ETCD_PEER_BASE=%d", base+1),
		"PEER_START_TIMEOUT=40",
	}
	return &cluster{targettest.StartPeers(t, "etcd", "../../peers/etcd.sh", installed, env)}
}

func (c *cluster) target(t *testing.T, mode Mode) *Target {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tg, err := New(ctx, Config{Endpoints: c.Endpoints, Mode: mode, Script: c.Script, ScriptEnv: c.Env})
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

// contract checks targettest.Contract and then what is particular to
// etcd: a waiter abandoned through its ctx leaves nothing behind once its
// lease is revoked in the background, and a short lease that is not
// renewed expires on the server.
func contract(t *testing.T, tg harness.Target, res string) {
	targettest.Contract(t, tg, res)
	ctx := context.Background()
	const ttl = 10 * time.Second

	// The waiter Contract abandoned through its ctx leaves nothing behind.
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
	short, err := tg.Acquire(ctx, res+"-short", time.Second, 0)
	if err != nil {
		t.Fatalf("acquire %s: %v", res+"-short", err)
	}
	start := time.Now()
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

func faults(t *testing.T, tg *Target, peers *cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	targettest.Faults(t, ctx, tg, peers.Peers, []string{"snapshot", "transfer-leader", "kill", "restart", "kill-leader", "restart"}, 15*time.Second)
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
