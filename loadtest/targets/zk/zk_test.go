package zk

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-dev/warden/loadtest/harness"
	"github.com/warden-dev/warden/loadtest/targettest"
)

// ensemble is a three-server ZooKeeper ensemble started by peers/zk.sh.
type ensemble struct{ *targettest.Peers }

func zkInstalled() bool {
	if _, err := os.Stat("/usr/share/java/zookeeper.jar"); err != nil {
		return false
	}
	_, err := exec.LookPath("java")
	return err == nil
}

func startEnsemble(t *testing.T) *ensemble {
	t.Helper()
	base := targettest.FreeBase(t, []int{0, 1, 2, 10, 11, 12, 20, 21, 22})
	env := []string{
		"LOADTEST_PEER_DIR=" + t.TempDir(),
		fmt.Sprintf("ZK_CLIENT_BASE=%d", base),
		// A short tick makes elections and session expiry fast;
		// minSessionTimeout is then 1 s.
		"ZK_TICK_MS=500",
		"PEER_START_TIMEOUT=40",
	}
	return &ensemble{targettest.StartPeers(t, "ZooKeeper", "../../peers/zk.sh", zkInstalled, env)}
}

func (e *ensemble) target(t *testing.T, dial zk.Dialer) *Target {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	tg, err := New(ctx, Config{Servers: e.Endpoints, Sessions: 2, Dialer: dial, Script: e.Script, ScriptEnv: e.Env})
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

// contract checks targettest.Contract and then what is particular to
// ZooKeeper: a waiter abandoned through its ctx leaves no node behind.
func contract(t *testing.T, tg harness.Target, res string) {
	targettest.Contract(t, tg, res)
	ctx := context.Background()
	const ttl = 10 * time.Second
	l5, err := tg.Acquire(ctx, res, ttl, 0) // fails if the abandoned waiter's node is left
	if err != nil {
		t.Fatalf("acquire %s: %v", res, err)
	}
	if err := tg.Release(ctx, l5); err != nil {
		t.Fatalf("release: %v", err)
	}
}

func faults(t *testing.T, tg *Target, peers *ensemble) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	if err := tg.Fault(ctx, "transfer-leader"); err == nil {
		t.Error("transfer-leader: want an error, ZooKeeper has no such operation")
	}
	targettest.Faults(t, ctx, tg, peers.Peers, []string{"snapshot", "kill", "restart", "kill-leader", "restart"}, 20*time.Second)
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
