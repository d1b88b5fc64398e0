package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"github.com/warden-dev/warden/placement"
	"github.com/warden-dev/warden/router"
)

func TestMain(m *testing.M) {
	placement.RouteRaftLogs(slog.LevelError + 4)
	goleak.VerifyTestMain(m)
}

func TestCLI(t *testing.T) {
	dev, err := router.StartDev(router.DevConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	srv := httptest.NewServer(router.NewHandler(dev.Router))
	defer srv.Close()
	cli := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(append([]string{"--addr", srv.URL}, args...), &out)
		return out.String(), err
	}

	out, err := cli("lock", "acquire", "orders/42", "--ttl", "20s", "--holder", "w1", "--request-id", "job-1", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		LeaseID      string `json:"lease_id"`
		FencingToken string `json:"fencing_token"`
		LeaseTTL     string `json:"lease_ttl"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.LeaseID) != 32 || got.LeaseTTL != "20s" {
		t.Fatalf("acquire --json printed %q (%v)", out, err)
	}
	// The same request id replays the lease; the human form shows it.
	if out, err := cli("lock", "acquire", "orders/42", "--ttl", "20s", "--holder", "w1", "--request-id", "job-1"); err != nil || !strings.Contains(out, got.LeaseID) {
		t.Fatalf("retry printed %q (%v)", out, err)
	}
	_, err = cli("lock", "acquire", "orders/42")
	if connect.CodeOf(err) != connect.CodeAborted || !strings.Contains(describeErr(err), "held with fencing token "+got.FencingToken) {
		t.Fatalf("second acquire: %v", describeErr(err))
	}
	if out, err := cli("lock", "describe", "orders/42"); err != nil || !strings.Contains(out, "is held") || strings.Contains(out, got.LeaseID) {
		t.Fatalf("describe printed %q (%v)", out, err)
	}
	if out, err := cli("lock", "renew", "orders/42", got.LeaseID); err != nil || !strings.HasPrefix(out, "renewed orders/42") {
		t.Fatalf("renew printed %q (%v)", out, err)
	}
	if out, err := cli("lock", "release", "orders/42", got.LeaseID, "--json"); err != nil || strings.TrimSpace(out) != `{"released":true}` {
		t.Fatalf("release printed %q (%v)", out, err)
	}
	if out, err := cli("lock", "release", "orders/42", got.LeaseID); err != nil || !strings.HasPrefix(out, "not released") {
		t.Fatalf("repeated release printed %q (%v)", out, err)
	}
	_, err = cli("lock", "renew", "orders/42", "nothex")
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(describeErr(err), "field lease_id") {
		t.Fatalf("bad lease id: %v", describeErr(err))
	}
	if out, err := cli("admin", "hot-resources", "--limit", "3"); err != nil || !strings.Contains(out, "orders/42") {
		t.Fatalf("hot-resources printed %q (%v)", out, err)
	}
	if _, err := cli("lock", "frobnicate"); err == nil {
		t.Fatal("an unknown command was accepted")
	}
}
