package router_test

import (
	"io"
	"strconv"
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
	body := c.metrics()
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
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// metrics returns the text of the cluster's /metrics.
func (c *cluster) metrics() string {
	c.t.Helper()
	resp, err := c.srv.Client().Get(c.srv.URL + "/metrics")
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return string(body)
}

// metric returns the value of one sample of /metrics (0 when absent).
func (c *cluster) metric(sample string) float64 {
	c.t.Helper()
	for _, line := range strings.Split(c.metrics(), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				c.t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return 0
}
