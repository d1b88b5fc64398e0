// Package monitoring holds Warden's Prometheus alert rules and Grafana
// dashboard (alerts.yml, dashboard.json) and their tests: promtool's
// checks and unit tests, and every expression evaluated by a real
// Prometheus scraping a dev cluster.
package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/deploy/deploytest"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/server"
)

func TestPromtool(t *testing.T) {
	promtool := deploytest.Tool(t, "promtool", ".ci/run installs Debian's prometheus")
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Fatalf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

// expressions returns every alert's expression and every dashboard
// panel's query, by where they come from.
func expressions(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	var rules struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	b, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert] = r.Expr
		}
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ RefID, Expr string }
		}
	}
	if b, err = os.ReadFile("dashboard.json"); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			out[fmt.Sprintf("panel %q %s", p.Title, tg.RefID)] = tg.Expr
		}
	}
	return out
}

// multiNodeOnly are metrics a dev cluster cannot export: its nodes share
// one process and clock, and measure no peer.
var multiNodeOnly = []string{"warden_clock_offset_seconds"}

var metricName = regexp.MustCompile(`\b(warden_[a-z0-9_]+|up)\b`)

// A real Prometheus scrapes a dev cluster that served some traffic; every
// alert and dashboard expression evaluates without error, every metric
// they name is one Warden exports, and the rules load healthy.
func TestExpressionsAgainstPrometheus(t *testing.T) {
	prom := deploytest.Tool(t, "prometheus", ".ci/run installs Debian's prometheus")
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0", Dev: &server.DevConfig{DataDir: t.TempDir(), BuildVersion: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	traffic(t, "http://"+srv.Addr())

	dir := t.TempDir()
	rules, _ := filepath.Abs("alerts.yml")
	cfg := fmt.Sprintf("global: {scrape_interval: 1s, evaluation_interval: 1s}\nrule_files: [%q]\nscrape_configs:\n  - job_name: warden\n    static_configs: [{targets: [%q]}]\n", rules, srv.Addr())
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	web, err := server.FreeAddrOn("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(prom, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+web, "--log.level=warn")
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	query := func(q string) (status, errText string, series int) {
		resp, err := http.Get("http://" + web + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return "", err.Error(), 0
		}
		defer resp.Body.Close()
		var out struct {
			Status string
			Error  string
			Data   struct{ Result []json.RawMessage }
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return out.Status, out.Error, len(out.Data.Result)
	}
	// Scraped a few times, so that rates over the windows have samples.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, _, n := query(`count_over_time(up{job="warden"}[1m]) >= 4`); n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus did not scrape the dev cluster:\n%s", log.String())
		}
		time.Sleep(250 * time.Millisecond)
	}
	names := map[string]bool{}
	for where, expr := range expressions(t) {
		if status, errText, _ := query(expr); status != "success" {
			t.Errorf("%s: %s: %s %s", where, expr, status, errText)
		}
		for _, m := range metricName.FindAllString(expr, -1) {
			names[m] = true
		}
	}
	for name := range names {
		if slices.Contains(multiNodeOnly, name) {
			continue
		}
		if _, _, n := query(fmt.Sprintf(`count({__name__=%q})`, name)); n == 0 {
			t.Errorf("an expression names %s, which the dev cluster does not export", name)
		}
	}
	resp, err := http.Get("http://" + web + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rs struct {
		Data struct {
			Groups []struct {
				Rules []struct{ Name, Health, LastError string }
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&rs); err != nil {
		t.Fatal(err)
	}
	loaded := 0
	for _, g := range rs.Data.Groups {
		for _, r := range g.Rules {
			loaded++
			if r.Health == "err" {
				t.Errorf("rule %s: %s", r.Name, r.LastError)
			}
		}
	}
	if want := len(slices.DeleteFunc(mapKeys(expressions(t)), func(k string) bool { return !strings.HasPrefix(k, "alert ") })); loaded != want {
		t.Errorf("Prometheus loaded %d rules, alerts.yml has %d", loaded, want)
	}
}

func mapKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// traffic makes the dev cluster at base export the series the
// expressions name: grants, renewals (one refused), a release, a
// conflict, a wait, quota use with a usage report.
func traffic(t *testing.T, base string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	locks := wardenv1connect.NewLockServiceClient(http.DefaultClient, base)
	quota := wardenv1connect.NewQuotaServiceClient(http.DefaultClient, base)
	var a *connect.Response[wardenv1.AcquireResponse]
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		a, err = locks.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "mon/a", RequestId: "a1", LeaseTtl: durationpb.New(time.Minute)}))
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := locks.Renew(ctx, connect.NewRequest(&wardenv1.RenewRequest{Resource: "mon/a", LeaseId: a.Msg.GetLeaseId()})); err != nil {
		t.Fatal(err)
	}
	_, _ = locks.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "mon/a", RequestId: "a2", WaitTimeout: durationpb.New(10 * time.Millisecond)}))
	if _, err := locks.Release(ctx, connect.NewRequest(&wardenv1.ReleaseRequest{Resource: "mon/a", LeaseId: a.Msg.GetLeaseId()})); err != nil {
		t.Fatal(err)
	}
	_, _ = locks.Renew(ctx, connect.NewRequest(&wardenv1.RenewRequest{Resource: "mon/a", LeaseId: a.Msg.GetLeaseId()})) // stale
	for _, call := range []func() error{
		func() error {
			_, err := quota.SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: "mon", Limit: 10}))
			return err
		},
		func() error {
			_, err := quota.Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: "mon/x", Amount: 1, ReservationId: "r1"}))
			return err
		},
		func() error {
			_, err := quota.ReportUsage(ctx, connect.NewRequest(&wardenv1.ReportUsageRequest{Key: "mon/x", Observed: 2, ReportId: "u1"}))
			return err
		},
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
}
