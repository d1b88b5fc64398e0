package warden

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-dev/warden/loadtest/targettest"
)

// startCluster builds wardend and warden from this repository and starts
// a three-process cluster with deploy/local/cluster.sh on free loopback
// ports, stopped when the test ends.
func startCluster(t *testing.T) *targettest.Peers {
	t.Helper()
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/wardend", "./cmd/warden")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building wardend and warden: %v\n%s", err, out)
	}
	base := targettest.FreeBase(t, []int{1, 2, 3, 31, 32, 33})
	p := &targettest.Peers{
		Script: filepath.Join(root, "deploy/local/cluster.sh"),
		Env: []string{
			"WARDEN_CLUSTER_DIR=" + filepath.Join(t.TempDir(), "cluster"),
			fmt.Sprintf("WARDEN_LISTEN_BASE=%d", base),
			fmt.Sprintf("WARDEN_RAFT_BASE=%d", base+30),
			"WARDEND=" + filepath.Join(bin, "wardend"),
			"WARDEN=" + filepath.Join(bin, "warden"),
		},
	}
	for n := 1; n <= 3; n++ {
		p.Endpoints = append(p.Endpoints, fmt.Sprintf("http://127.0.0.1:%d", base+n))
	}
	t.Cleanup(func() {
		if out, err := p.Run("stop"); err != nil {
			t.Errorf("cluster.sh stop: %v\n%s", err, out)
		}
	})
	if out, err := p.Run("start"); err != nil {
		t.Fatalf("cluster.sh start: %v\n%s", err, out)
	}
	return p
}

// The target's faults against a real cluster: a kill takes a node that
// leads no data shard and says which node led the placement group; the
// cluster still grants, with higher tokens, after each fault.
func TestFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-process cluster")
	}
	p := startCluster(t)
	tg, err := New(Config{Endpoints: p.Endpoints, ClusterScript: p.Script, ClusterEnv: p.Env})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A first grant, so the routes (which the kill reads) are loaded.
	l := targettest.AcquireRetry(t, tg, "fault-res", 20*time.Second)
	if err := tg.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	leaders, _, err := tg.leaders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	detail, err := tg.Measure(ctx, "kill")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`^killed node ([1-3]); placement leader before: node [1-3]$`).FindStringSubmatch(detail)
	if m == nil {
		t.Fatalf("kill detail %q, want the node killed and the placement group's leader", detail)
	}
	victim, _ := strconv.Atoi(m[1])
	if leaders[victim] {
		t.Fatalf("kill took node %d, which leads a data shard (leaders %v)", victim, leaders)
	}
	status, err := p.Run("status")
	if err != nil || !strings.Contains(status, fmt.Sprintf("node %d: stopped", victim)) {
		t.Fatalf("after the kill of node %d, cluster.sh status: %v\n%s", victim, err, status)
	}
	targettest.Faults(t, ctx, tg, p, []string{"restart", "snapshot", "transfer-leader", "kill-leader", "restart"}, 20*time.Second)
}
