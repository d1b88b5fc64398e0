package router_test

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/warden-dev/warden/router"
)

// /metrics on the Connect port shows the lock metrics of DESIGN.md §6.
func TestMetricsEndpoint(t *testing.T) {
	c := startCluster(t, router.DevConfig{})
	a := c.mustAcquire("m", "a", time.Second)
	c.acquire("m", "b", time.Second)
	_, _ = c.acquireWait(ctx(t), "m", "w", time.Second, 5*time.Second) // granted at expiry
	_, _ = c.renew("m", a.GetLeaseId())
	resp, err := c.srv.Client().Get(c.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`warden_rpc_duration_seconds_bucket{method="Acquire"`,
		`warden_rpc_outcomes_total{method="Acquire",outcome="ok"}`,
		`warden_rpc_outcomes_total{method="Acquire",outcome="conflict"}`,
		`warden_rpc_outcomes_total{method="Renew",outcome="stale"}`,
		`warden_lock_wait_seconds_count`,
		`warden_active_locks{shard="1"}`,
		`warden_waiters{shard="1"}`,
		`warden_lease_expirations_total`,
		`warden_raft_leader_changes_total`,
		`warden_proposal_duration_seconds_count`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
