package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// lockRun starts warden lock run through every node of c, with the
// command script run by sh, its stderr kept in the returned buffer.
func (c *procCluster) lockRun(resource string, script string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	c.t.Helper()
	var endpoints []string
	for _, n := range c.nodes {
		endpoints = append(endpoints, n.listen)
	}
	cmd := exec.Command(cliBinary, append(append([]string{"--endpoints", strings.Join(endpoints, ","), "lock", "run", resource}, args...), "--", "sh", "-c", script)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd, &stderr
}

// waitFile waits up to d for path to hold a line, and returns it.
func waitFile(t *testing.T, path string, d time.Duration) string {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(path); err == nil && bytes.HasSuffix(b, []byte("\n")) {
			return strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was not written within %v", path, d)
		}
	}
}

// warden lock run stops its command before the server could grant the
// lock to anyone else. The command (which would sleep a minute) sees its
// fencing token; the test watches the lease's server-side expiry as the
// renewals move it, then SIGSTOPs all three nodes: renewals fail, and
// lock run must kill the command and exit 124 before the last expiry it
// saw (at most the real one). After SIGCONT the cluster serves again.
func TestClusterLockRunStopsBeforeExpiry(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	cmd, stderr := c.lockRun("run/stopped", "echo $WARDEN_FENCING_TOKEN > "+token+"; exec sleep 60", "--ttl", "3s")
	got := waitFile(t, token, 30*time.Second)
	d, err := c.nodes[0].describe("run/stopped")
	if err != nil || !d.GetHeld() || strconv.FormatUint(d.GetFencingToken(), 10) != got {
		t.Fatalf("the command saw token %s; describe: %v %v", got, d, err)
	}
	// Watch two renewals move the expiry.
	var expiry time.Time
	for renewals := 0; renewals < 2; time.Sleep(50 * time.Millisecond) {
		d, err := c.nodes[0].describe("run/stopped")
		if err != nil {
			t.Fatal(err)
		}
		if e := d.GetExpiresAt().AsTime(); e.After(expiry) {
			if !expiry.IsZero() {
				renewals++
			}
			expiry = e
		}
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for i := range c.nodes {
		_ = c.nodes[i].cmd.Process.Signal(syscall.SIGSTOP)
	}
	stopped := time.Now()
	defer func() {
		for i := range c.nodes {
			_ = c.nodes[i].cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	var ee *exec.ExitError
	select {
	case err := <-exited:
		ended := time.Now()
		if !errors.As(err, &ee) || ee.ExitCode() != 124 {
			t.Fatalf("lock run ended with %v, want status 124:\n%s", err, stderr)
		}
		if !ended.Before(expiry) {
			t.Fatalf("lock run ended at %v, not before the lease's expiry %v", ended, expiry)
		}
		t.Logf("nodes stopped at %v; lock run and its command ended %v later, %v before the lease's server-side expiry (at least); it said: %s",
			stopped.Format(time.StampMilli), ended.Sub(stopped).Round(time.Millisecond), expiry.Sub(ended).Round(time.Millisecond), strings.TrimSpace(stderr.String()))
	case <-time.After(10 * time.Second):
		t.Fatalf("lock run still runs 10 s after the cluster stopped:\n%s", stderr)
	}
	for i := range c.nodes {
		_ = c.nodes[i].cmd.Process.Signal(syscall.SIGCONT)
	}
	c.waitServing(0)
}

// Two warden lock run on one resource take turns: the second waits in
// the queue and runs its command after the first's ended, with a higher
// token; each ends with its command's status.
func TestClusterLockRunTakesTurns(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	script := func(name string, status int) string {
		return "echo " + name + " start $WARDEN_FENCING_TOKEN >> " + log + "; sleep 1; echo " + name + " end >> " + log + "; exit " + strconv.Itoa(status)
	}
	first, _ := c.lockRun("run/turns", script("first", 0), "--ttl", "5s")
	waitFile(t, log, 30*time.Second)
	second, stderr := c.lockRun("run/turns", script("second", 3), "--ttl", "5s", "--wait", "30s")
	if err := first.Wait(); err != nil {
		t.Fatalf("the first lock run: %v", err)
	}
	var ee *exec.ExitError
	if err := second.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("the second lock run ended with %v, want its command's status 3:\n%s", err, stderr)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "first start ") || lines[1] != "first end" || !strings.HasPrefix(lines[2], "second start ") || lines[3] != "second end" {
		t.Fatalf("the commands ran out of turn:\n%s", b)
	}
	t1, _ := strconv.ParseUint(strings.Fields(lines[0])[2], 10, 64)
	t2, _ := strconv.ParseUint(strings.Fields(lines[2])[2], 10, 64)
	if t1 == 0 || t2 <= t1 {
		t.Fatalf("tokens %d then %d, want them increasing", t1, t2)
	}
}
