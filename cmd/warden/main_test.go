package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"github.com/warden-dev/warden/placement"
	"github.com/warden-dev/warden/rpc"
	"github.com/warden-dev/warden/server"
)

func TestMain(m *testing.M) {
	placement.RouteRaftLogs(slog.LevelError + 4)
	goleak.VerifyTestMain(m)
}

// devCLI starts a dev cluster and returns a function that runs the CLI
// against it, returning what it printed.
func devCLI(t *testing.T) func(args ...string) (string, error) {
	t.Helper()
	dev, err := server.StartDev(server.DevConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rpc.NewHandler(dev.Router))
	t.Cleanup(func() { srv.Close(); dev.Close() })
	t.Setenv("WARDEN_ADDR", srv.URL) // in place of --addr
	return func(args ...string) (string, error) {
		var out bytes.Buffer
		_, err := run(context.Background(), args, &out)
		return out.String(), err
	}
}

func TestCLI(t *testing.T) {
	cli := devCLI(t)

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
	if out, err := cli("lock", "release", "orders/42", got.LeaseID, "--json"); err != nil || strings.TrimSpace(out) != `{"released":true,"already_released":false}` {
		t.Fatalf("release printed %q (%v)", out, err)
	}
	if out, err := cli("lock", "release", "orders/42", got.LeaseID); err != nil || !strings.HasPrefix(out, "released already: a Release of that lease ended it") {
		t.Fatalf("repeated release printed %q (%v)", out, err)
	}
	_, err = cli("lock", "renew", "orders/42", "nothex")
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(describeErr(err), "field lease_id") {
		t.Fatalf("bad lease id: %v", describeErr(err))
	}
	if out, err := cli("admin", "hot-resources", "--limit", "3"); err != nil || !strings.Contains(out, "orders/42") {
		t.Fatalf("hot-resources printed %q (%v)", out, err)
	}
	// --addr wins over WARDEN_ADDR.
	if _, err := cli("--addr", "http://127.0.0.1:1", "lock", "describe", "orders/42"); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("describe through --addr of a closed port: %v", err)
	}
	if _, err := cli("lock", "frobnicate"); err == nil {
		t.Fatal("an unknown command was accepted")
	}
}

// The quota commands, as the README's sequence runs them.
func TestQuotaCLI(t *testing.T) {
	cli := devCLI(t)
	for _, l := range [][]string{{"gpu", "100"}, {"gpu/team-a", "60"}, {"gpu/team-a/train", "40"}} {
		if _, err := cli("quota", "set-limit", l[0], l[1]); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := cli("quota", "reserve", "gpu/team-a/train", "30", "--reservation-id", "job-1"); err != nil || !strings.Contains(out, "remaining      10") {
		t.Fatalf("reserve printed %q (%v)", out, err)
	}
	_, err := cli("quota", "reserve", "gpu/team-a/train", "20", "--reservation-id", "job-2")
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(describeErr(err), "LIMIT at gpu/team-a/train: 10 left") {
		t.Fatalf("exhausted: %v", describeErr(err))
	}
	if out, err := cli("quota", "commit", "gpu/team-a/train", "job-1", "--amount", "25"); err != nil || !strings.HasPrefix(out, "committed 25") {
		t.Fatalf("commit printed %q (%v)", out, err)
	}
	if _, err := cli("quota", "release", "gpu/team-a/train", "job-1"); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("release of a committed reservation: %v", err)
	}
	if out, err := cli("quota", "query", "gpu/team-a/train"); err != nil || !strings.Contains(out, "remaining 15") || !strings.Contains(out, "ledger_seq 5") {
		t.Fatalf("query printed %q (%v)", out, err)
	}
	if out, err := cli("quota", "ledger", "gpu"); err != nil || strings.Count(out, "\n") != 5 || !strings.Contains(out, "returned 5") {
		t.Fatalf("ledger printed %q (%v)", out, err)
	}
	// A correction states the ledger_seq it observed against.
	if _, err := cli("quota", "report-usage", "gpu/team-a/train", "20", "--report-id", "audit-1", "--correct"); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "observed_seq") {
		t.Fatalf("a correction without --observed-seq: %v", err)
	}
	if out, err := cli("quota", "report-usage", "gpu/team-a/train", "20", "--report-id", "audit-1", "--correct", "--observed-seq", "5"); err != nil || !strings.HasPrefix(out, "drift -5") {
		t.Fatalf("report-usage printed %q (%v)", out, err)
	}
	if out, err := cli("quota", "reservations", "gpu"); err != nil || out != "" {
		t.Fatalf("reservations printed %q (%v)", out, err)
	}
}

// backup --timestamped names each backup by its time inside --out, and
// --keep prunes all but the newest.
func TestBackupTimestampedKeep(t *testing.T) {
	cli := devCLI(t)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := cli("lock", "describe", "probe"); err == nil { // the shard has a leader
			break
		} else if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	parent := t.TempDir()
	var made []string
	for range 3 {
		if out, err := cli("admin", "backup", "--out", parent, "--timestamped", "--keep", "2"); err != nil {
			t.Fatalf("backup: %v\n%s", err, out)
		}
		entries, err := os.ReadDir(parent)
		if err != nil {
			t.Fatal(err)
		}
		made = made[:0]
		for _, e := range entries {
			made = append(made, e.Name())
		}
		time.Sleep(2 * time.Millisecond) // a new name
	}
	if len(made) != 2 || !strings.HasPrefix(made[0], "warden-backup-") || made[0] >= made[1] {
		t.Fatalf("after three backups with --keep 2: %v", made)
	}
	if _, err := os.Stat(filepath.Join(parent, made[1], "manifest.json")); err != nil {
		t.Fatal(err)
	}
	if _, err := cli("admin", "backup", "--out", parent, "--keep", "2"); exitStatus(err) != exitUsage {
		t.Fatalf("--keep without --timestamped: %v", err)
	}
	// A signing key that is not one is refused before anything is written.
	notKey := filepath.Join(t.TempDir(), "not-a-key")
	if err := os.WriteFile(notKey, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(parent, "signed")
	if _, err := cli("admin", "backup", "--out", out, "--signing-key", notKey); exitStatus(err) != exitUsage || err == nil || !strings.Contains(err.Error(), "not-a-key") {
		t.Fatalf("--signing-key of a file that holds no key: %v", err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("a refused backup created its directory")
	}
}

// warden lock run's command gets the resource and the fencing token in
// its environment, not the caller's Warden credentials, unless
// --pass-credentials.
func TestLockRunStripsCredentials(t *testing.T) {
	cli := devCLI(t)
	const token = "wdn1.0123456789abcdef.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	t.Setenv("WARDEN_TOKEN", token)
	envOf := func(args ...string) string {
		t.Helper()
		file := filepath.Join(t.TempDir(), "env")
		args = append(append([]string{"lock", "run", "run/env"}, args...), "--", "sh", "-c", "env > "+file)
		if out, err := cli(args...); err != nil {
			t.Fatalf("lock run %v: %v\n%s", args, err, out)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	env := envOf()
	if !strings.Contains(env, "WARDEN_RESOURCE=run/env\n") || !strings.Contains(env, "WARDEN_FENCING_TOKEN=") {
		t.Fatalf("the command's environment lacks the resource or the fencing token:\n%s", env)
	}
	if strings.Contains(env, token) {
		t.Fatalf("the command got the caller's credentials:\n%s", env)
	}
	if env := envOf("--pass-credentials"); !strings.Contains(env, "WARDEN_TOKEN="+token+"\n") {
		t.Fatalf("--pass-credentials: the command's environment lacks the credentials:\n%s", env)
	}
}

// lock revoke never takes its --fencing-token from WARDEN_FENCING_TOKEN:
// lock run gives its command that variable, its own lease's token, and
// a command that ran lock revoke for another lease without the flag
// revoked its own (lock run then exited 124). Without the flag, it is a
// usage error, before any call.
func TestRevokeTokenNotFromEnvironment(t *testing.T) {
	t.Setenv("WARDEN_FENCING_TOKEN", "1099511627777")
	t.Setenv("WARDEN_ADDR", "http://127.0.0.1:1") // nothing answers there
	_, err := run(context.Background(), []string{"lock", "revoke", "orders/42"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--fencing-token") {
		t.Fatalf("lock revoke without --fencing-token, WARDEN_FENCING_TOKEN set: %v, want a usage error naming the flag", err)
	}
}

// warden watch prints the holder, then one line per change naming its
// type, the resource and the token, and ends with status 0 when
// interrupted; --cursor resumes after a printed event.
func TestWatchCLI(t *testing.T) {
	cli := devCLI(t)
	out, err := cli("lock", "acquire", "jobs/w", "--ttl", "20s", "--holder", "w1", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var held struct {
		LeaseID      string `json:"lease_id"`
		FencingToken string `json:"fencing_token"`
	}
	if err := json.Unmarshal([]byte(out), &held); err != nil {
		t.Fatal(err)
	}
	watch := func(args ...string) (lines *bufio.Scanner, stop func() error) {
		ctx, cancel := context.WithCancel(context.Background())
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			_, err := run(ctx, append([]string{"watch", "jobs/w"}, args...), pw)
			pw.Close()
			done <- err
		}()
		return bufio.NewScanner(pr), func() error {
			cancel()
			go io.Copy(io.Discard, pr)
			return <-done
		}
	}
	line := func(s *bufio.Scanner) string {
		t.Helper()
		if !s.Scan() {
			t.Fatalf("the watch printed no more lines: %v", s.Err())
		}
		return s.Text()
	}
	lines, stop := watch("--json")
	var first struct {
		Type, Cursor string
		Token        uint64 `json:"fencing_token"`
		Initial      bool
	}
	if err := json.Unmarshal([]byte(line(lines)), &first); err != nil || first.Type != "GRANTED" || !first.Initial || fmt.Sprint(first.Token) != held.FencingToken {
		t.Fatalf("first line %+v (%v), want the holder with token %s", first, err, held.FencingToken)
	}
	if _, err := cli("lock", "release", "jobs/w", held.LeaseID); err != nil {
		t.Fatal(err)
	}
	if l := line(lines); !strings.Contains(l, `"type":"RELEASED"`) || !strings.Contains(l, `"fencing_token":`+held.FencingToken) {
		t.Fatalf("after the release: %s", l)
	}
	if err := stop(); err != nil {
		t.Fatalf("an interrupted watch: %v, want status 0", err)
	}

	// Resumed after the holder's line, the release comes first.
	lines, stop = watch("--cursor", first.Cursor)
	if l := line(lines); !strings.HasPrefix(l, "RELEASED jobs/w token="+held.FencingToken) {
		t.Fatalf("resumed: %s", l)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := cli("watch", "jobs/w", "--cursor", "nonsense"); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("a bad cursor: %v, want invalid_argument", err)
	}
}
