package rpc_test

import (
	"context"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/server"
)

// /metrics on the Connect port shows the lock metrics of DESIGN.md §6.
func TestMetricsEndpoint(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
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

// Every procedure of the client services passes the observer: one call
// adds exactly one outcome under the procedure's name, and a refusal
// reaches the client with its code (a bad field is invalid_argument),
// never the unknown that an unmapped error would give. The calls carry
// no fields; the rebalance and snapshot they make on the dev cluster are
// harmless.
func TestEveryProcedureIsObserved(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	names := map[string]string{"/warden.v1.QuotaService/Release": "ReleaseReservation"}
	for _, fd := range []protoreflect.FileDescriptor{wardenv1.File_warden_v1_lock_proto, wardenv1.File_warden_v1_quota_proto, wardenv1.File_warden_v1_admin_proto} {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				proc := "/" + string(sd.FullName()) + "/" + string(sd.Methods().Get(j).Name())
				name, ok := names[proc]
				if !ok {
					name = string(sd.Methods().Get(j).Name())
				}
				before := c.outcomes(name)
				if proc == "/warden.v1.LockService/Watch" { // refused: no resource
					stream, err := c.locks.Watch(context.Background(), connect.NewRequest(&wardenv1.WatchRequest{}))
					if err != nil {
						t.Fatal(err)
					}
					if stream.Receive() || connect.CodeOf(stream.Err()) != connect.CodeInvalidArgument {
						t.Errorf("%s without a resource: %v, want invalid_argument", proc, stream.Err())
					}
					stream.Close()
					if got := c.outcomes(name) - before; got != 1 {
						t.Errorf("%s: %v outcomes counted under %q, want 1", proc, got, name)
					}
					continue
				}
				if sd.Methods().Get(j).IsStreamingServer() { // Backup: a whole backup of the dev cluster
					stream, err := wardenv1connect.NewAdminServiceClient(c.srv.Client(), c.srv.URL).Backup(context.Background(), connect.NewRequest(&wardenv1.BackupRequest{}))
					if err != nil {
						t.Fatal(err)
					}
					for stream.Receive() {
					}
					if err := stream.Err(); err != nil {
						t.Errorf("%s: %v", proc, err)
					}
					stream.Close()
					if got := c.outcomes(name) - before; got != 1 {
						t.Errorf("%s: %v outcomes counted under %q, want 1", proc, got, name)
					}
					continue
				}
				resp, err := c.srv.Client().Post(c.srv.URL+proc, "application/json", strings.NewReader("{}"))
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 && !strings.Contains(string(body), `"code"`) || strings.Contains(string(body), `"code":"unknown"`) {
					t.Errorf("%s: %d %s: not a mapped Connect error", proc, resp.StatusCode, body)
				}
				if got := c.outcomes(name) - before; got != 1 {
					t.Errorf("%s: %v outcomes counted under %q, want 1", proc, got, name)
				}
			}
		}
	}
}

// outcomes sums warden_rpc_outcomes_total of method over its outcomes.
func (c *cluster) outcomes(method string) float64 {
	c.t.Helper()
	var sum float64
	for _, line := range strings.Split(c.metrics(), "\n") {
		if !strings.HasPrefix(line, `warden_rpc_outcomes_total{method="`+method+`",`) {
			continue
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			c.t.Fatalf("%s: %v", line, err)
		}
		sum += f
	}
	return sum
}
