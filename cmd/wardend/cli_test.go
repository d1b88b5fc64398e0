package main

import (
	"encoding/json"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cliStatus runs the warden CLI with args and returns its exit status
// and what it printed on stdout and stderr.
func cliStatus(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(cliBinary, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatal(err)
	return 0, "", ""
}

// exitCode is the exit status of a command that ended with err
// (exec.Cmd.Run's), -1 when it did not run.
func exitCode(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	return -1
}

// The CLI's exit statuses tell outcomes apart, against a real wardend
// --dev (7, unauthenticated, is TestClusterAuth's): each status from the
// outcome it names, and --json errors as JSON on stderr with the Connect
// code and typed details.
func TestCLIExitStatuses(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	at := "--endpoints=" + s.addr
	holder := "--request-id=exit-held"
	if code, out, errOut := cliStatus(t, at, "lock", "acquire", "exit/held", holder, "--ttl", "1m"); code != 0 {
		t.Fatalf("acquire: status %d\n%s%s", code, out, errOut)
	}
	if code, _, _ := cliStatus(t, at, "quota", "set-limit", "gpus", "2"); code != 0 {
		t.Fatalf("set-limit: status %d", code)
	}
	for _, c := range []struct {
		name string
		want int
		args []string
	}{
		{"ok", 0, []string{at, "lock", "describe", "exit/held"}},
		{"ok, failing over past an unreachable node", 0, []string{"--endpoints=127.0.0.1:1," + s.addr, "lock", "describe", "exit/held"}},
		{"a usage error of the parser", 2, []string{at, "lock", "frobnicate"}},
		{"invalid_argument", 2, []string{at, "lock", "acquire", ""}},
		{"a malformed endpoint", 2, []string{"--endpoints=ftp://x", "lock", "describe", "x"}},
		{"unreachable", 3, []string{"--endpoints=127.0.0.1:1", "lock", "describe", "exit/held"}},
		{"the CLI's own timeout", 3, []string{at, "--timeout=1ns", "lock", "describe", "exit/held"}},
		{"held", 4, []string{at, "lock", "acquire", "exit/held"}},
		{"a wait that ended without the lock", 4, []string{at, "lock", "acquire", "exit/held", "--wait", "500ms"}},
		{"resource_exhausted", 5, []string{at, "quota", "reserve", "gpus", "3"}},
		{"failed_precondition", 6, []string{at, "lock", "renew", "exit/held", strings.Repeat("ab", 16)}},
		{"not_found", 6, []string{at, "admin", "operation", "999"}},
		// Its progress polls fail (1 ns each); the split goes on.
		{"ok, following a split whose progress cannot be read", 0, []string{at, "--timeout=1ns", "admin", "split", "1"}},
	} {
		code, out, errOut := cliStatus(t, c.args...)
		if code != c.want {
			t.Errorf("%s: warden %s: status %d, want %d\n%s%s", c.name, strings.Join(c.args, " "), code, c.want, out, errOut)
		}
	}

	code, _, errOut := cliStatus(t, at, "--json", "lock", "acquire", "exit/held")
	var e struct {
		Code    string           `json:"code"`
		Message string           `json:"message"`
		Details []map[string]any `json:"details"`
	}
	if err := json.Unmarshal([]byte(errOut), &e); err != nil || code != 4 || e.Code != "aborted" || len(e.Details) != 1 || e.Details[0]["@type"] != "type.googleapis.com/warden.v1.LockHeld" {
		t.Fatalf("--json error: status %d, %q (%v)", code, errOut, err)
	}

	// 130: interrupted while it waits.
	cmd := exec.Command(cliBinary, at, "lock", "acquire", "exit/held", "--wait", "30s")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // real time: the call must be in flight
	_ = cmd.Process.Signal(syscall.SIGINT)
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("interrupted while waiting: %v, want status 130", err)
	}
}

// warden lock revoke ends the lease with the token lock describe shows,
// and only that lease: a stale token revokes nothing and says so.
func TestCLIRevoke(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	at := "--endpoints=" + s.addr
	code, out, errOut := cliStatus(t, at, "--json", "lock", "acquire", "revoke/cli", "--ttl", "10m", "--holder", "stuck")
	var lease struct {
		Token string `json:"fencing_token"`
	}
	if err := json.Unmarshal([]byte(out), &lease); code != 0 || err != nil || lease.Token == "" {
		t.Fatalf("acquire: status %d, %q %s (%v)", code, out, errOut, err)
	}
	token, _ := strconv.ParseUint(lease.Token, 10, 64)
	if code, out, _ := cliStatus(t, at, "lock", "revoke", "revoke/cli", "--fencing-token", strconv.FormatUint(token+1, 10)); code != 0 || !strings.Contains(out, "nothing revoked") {
		t.Fatalf("revoke of a stale token: status %d, %q", code, out)
	}
	if code, out, _ := cliStatus(t, at, "lock", "revoke", "revoke/cli", "--fencing-token", lease.Token); code != 0 || !strings.Contains(out, "revoked the lease") {
		t.Fatalf("revoke: status %d, %q", code, out)
	}
	if code, out, _ := cliStatus(t, at, "--json", "lock", "describe", "revoke/cli"); code != 0 || strings.Contains(out, `"held":true`) {
		t.Fatalf("describe after the revoke: status %d, %q; want the lock free", code, out)
	}
	if code, _, errOut := cliStatus(t, at, "lock", "revoke", "revoke/cli"); code != 2 || !strings.Contains(errOut, "--fencing-token") {
		t.Fatalf("revoke without --fencing-token: status %d, %q", code, errOut)
	}
}
