package rpc_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/internal/logbuf"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/server"
)

// The audit log has one JSON line per state-changing RPC with resource,
// lease hash, token, holder, caller and outcome, and never the lease id.
func TestAuditLog(t *testing.T) {
	var buf logbuf.Buffer
	c := startCluster(t, server.DevConfig{Router: router.Config{Audit: slog.New(slog.NewJSONHandler(&buf, nil))}})
	a := c.mustAcquire("orders/42", "q1", 5*time.Second)
	c.acquire("orders/42", "q2", 5*time.Second) // conflict
	if _, err := c.renew("orders/42", a.GetLeaseId()); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.release("orders/42", a.GetLeaseId()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	// A repeat of it says that a Release of the lease ended it.
	if ok, err := c.release("orders/42", a.GetLeaseId()); err != nil || ok {
		t.Fatal(ok, err)
	}
	// A Batch's ops are audited as the calls they are, with its caller.
	got, err := c.batch(acquireOp("orders/42", "q3"))
	if err != nil || got[0].GetCode() != "" {
		t.Fatal(got, err)
	}
	if got, err = c.batch(releaseOp("orders/42", got[0].GetAcquire().GetLeaseId())); err != nil || got[0].GetCode() != "" {
		t.Fatal(got, err)
	}
	// An operator's revoke is audited with its resource and whether a
	// lease ended.
	b := c.mustAcquire("orders/43", "q4", time.Minute)
	admin := wardenv1connect.NewAdminServiceClient(c.srv.Client(), c.srv.URL)
	if r, err := admin.RevokeLease(context.Background(), connect.NewRequest(&wardenv1.RevokeLeaseRequest{Resource: "orders/43", FencingToken: b.GetFencingToken()})); err != nil || !r.Msg.GetRevoked() {
		t.Fatal(r, err)
	}
	out := buf.String()
	if strings.Contains(out, a.GetLeaseId()) {
		t.Fatal("the audit log contains a lease id")
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q", l)
		}
		lines = append(lines, m)
	}
	if len(lines) != 9 {
		t.Fatalf("%d audit lines, want 9:\n%s", len(lines), out)
	}
	if l := lines[8]; l["method"] != "RevokeLease" || l["resource"] != "orders/43" || l["outcome"] != "ok" || l["released"] != true {
		t.Fatalf("revoke line: %v", l)
	}
	want := []struct{ method, outcome string }{{"Acquire", "ok"}, {"Acquire", "conflict"}, {"Renew", "ok"}, {"Release", "ok"}, {"Release", "ok"}, {"Acquire", "ok"}, {"Release", "ok"}}
	for i, w := range want {
		l := lines[i]
		if l["method"] != w.method || l["outcome"] != w.outcome || l["resource"] != "orders/42" || l["caller"] == "" {
			t.Fatalf("line %d: %v, want %s %s", i, l, w.method, w.outcome)
		}
	}
	if lines[0]["fencing_token"] != float64(a.GetFencingToken()) || lines[0]["lease_hash"] != lines[3]["lease_hash"] || lines[0]["lease_hash"] == nil {
		t.Fatalf("grant and release lines do not identify the same lease: %v / %v", lines[0], lines[3])
	}
	if lines[3]["released"] != true || lines[3]["already_released"] != nil {
		t.Fatalf("release line: %v", lines[3])
	}
	if lines[4]["released"] != false || lines[4]["already_released"] != true {
		t.Fatalf("repeated release line: %v", lines[4])
	}
}
