package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// These tests run the real wardend binary as a child process and send it
// real signals: SIGKILL (a crash), SIGSTOP/SIGCONT (a pause) and SIGTERM
// (a graceful stop).

// binary is the wardend binary the tests run; cliBinary is the warden CLI,
// run as a client process that a test can SIGKILL.
var binary, cliBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "wardend-bin-")
	if err != nil {
		panic(err)
	}
	binary, cliBinary = filepath.Join(dir, "wardend"), filepath.Join(dir, "warden")
	for bin, pkg := range map[string]string{binary: ".", cliBinary: "../warden"} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n%s", pkg, err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	stopOldBuilds()
	os.RemoveAll(dir)
	http.DefaultClient.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// devProc is a wardend --dev process a test started.
type devProc struct {
	t      *testing.T
	dir    string
	addr   string
	cmd    *exec.Cmd
	log    bytes.Buffer
	locks  wardenv1connect.LockServiceClient
	exited chan error
}

func startServer(t *testing.T, dir string) *devProc {
	t.Helper()
	addr := freeAddr(t)
	s := &devProc{t: t, dir: dir, addr: addr, exited: make(chan error, 1)}
	s.cmd = exec.Command(binary, "--dev", "--data-dir", dir, "--listen", addr)
	s.cmd.Stdout, s.cmd.Stderr = &s.log, &s.log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.exited <- s.cmd.Wait() }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
		_ = s.cmd.Process.Kill()
		<-s.exited
		if t.Failed() {
			t.Logf("wardend log:\n%s", s.log.String())
		}
	})
	s.locks = wardenv1connect.NewLockServiceClient(http.DefaultClient, "http://"+addr)
	s.waitServing()
	return s
}

// waitServing polls grpc.health.v1 (Connect JSON, as curl would) and a
// Describe until the node answers and the shard has a leader.
func (s *devProc) waitServing() {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Post("http://"+s.addr+"/grpc.health.v1.Health/Check", "application/json", strings.NewReader("{}"))
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), "SERVING") {
				if _, err := s.locks.Describe(context.Background(), connect.NewRequest(&wardenv1.DescribeRequest{Resource: "probe"})); err == nil {
					return
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("wardend did not start serving:\n%s", s.log.String())
}

func (s *devProc) signal(sig syscall.Signal) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatal(err)
	}
}

func (s *devProc) waitExit() error {
	select {
	case err := <-s.exited:
		s.exited <- err // for the cleanup
		return err
	case <-time.After(20 * time.Second):
		s.t.Fatal("wardend did not exit")
		return nil
	}
}

func (s *devProc) acquire(resource, requestID string, ttl time.Duration) (*wardenv1.AcquireResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := s.locks.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: resource, RequestId: requestID, LeaseTtl: durationpb.New(ttl)}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (s *devProc) describe(resource string) *wardenv1.DescribeResponse {
	s.t.Helper()
	resp, err := s.locks.Describe(context.Background(), connect.NewRequest(&wardenv1.DescribeRequest{Resource: resource}))
	if err != nil {
		s.t.Fatalf("describe %s: %v", resource, err)
	}
	return resp.Msg
}

// SIGKILL the whole dev cluster: every acknowledged lease, its token and
// its dedup entry survive the crash.
func TestKillLosesNothingAcknowledged(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startServer(t, dir)
	leases := map[string]*wardenv1.AcquireResponse{}
	var maxTok uint64
	for i := range 50 {
		r := fmt.Sprintf("crash/%d", i)
		a, err := s.acquire(r, "q-"+r, 5*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		leases[r] = a
		maxTok = max(maxTok, a.GetFencingToken())
	}
	s.signal(syscall.SIGKILL)
	s.waitExit()

	s = startServer(t, dir)
	for r, a := range leases {
		d := s.describe(r)
		if !d.GetHeld() || d.GetFencingToken() != a.GetFencingToken() || !d.GetExpiresAt().AsTime().Equal(a.GetExpiresAt().AsTime()) {
			t.Fatalf("%s after SIGKILL: %v, acknowledged %v", r, d, a)
		}
		again, err := s.acquire(r, "q-"+r, 5*time.Minute)
		if err != nil || again.GetLeaseId() != a.GetLeaseId() {
			t.Fatalf("%s: retry after SIGKILL: %v %v", r, again, err)
		}
	}
	if n, err := s.acquire("crash/new", "n", time.Minute); err != nil || n.GetFencingToken() <= maxTok {
		t.Fatalf("token after SIGKILL %v (max before %d): %v", n, maxTok, err)
	}
}

// SIGSTOP the cluster past a lease's expiry: time kept running, so after
// SIGCONT the lease is over — Renew fails and the lock goes to the next
// acquirer with a higher token. A pause never extends a lease.
func TestPausedClusterDoesNotExtendLeases(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir())
	a, err := s.acquire("pause/r", "a", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s.signal(syscall.SIGSTOP)
	time.Sleep(4 * time.Second)
	s.signal(syscall.SIGCONT)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var renewErr error
	for { // the first calls may meet an election
		_, renewErr = s.locks.Renew(ctx, connect.NewRequest(&wardenv1.RenewRequest{Resource: "pause/r", LeaseId: a.GetLeaseId()}))
		if connect.CodeOf(renewErr) != connect.CodeUnavailable || ctx.Err() != nil {
			break
		}
	}
	if connect.CodeOf(renewErr) != connect.CodeFailedPrecondition {
		t.Fatalf("renew after the pause: %v, want failed_precondition", renewErr)
	}
	b, err := s.acquire("pause/r", "b", time.Minute)
	if err != nil || b.GetFencingToken() <= a.GetFencingToken() {
		t.Fatalf("acquire after the pause: %v %v", b, err)
	}
}

// SIGTERM shuts down gracefully (exit status 0), and the gRPC protocol over
// cleartext HTTP/2 works like Connect's.
func TestGRPCAndGracefulShutdown(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startServer(t, dir)
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	grpc := wardenv1connect.NewLockServiceClient(&http.Client{Transport: tr}, "http://"+s.addr, connect.WithGRPC())
	resp, err := grpc.Acquire(context.Background(), connect.NewRequest(&wardenv1.AcquireRequest{Resource: "grpc/r", RequestId: "g"}))
	if err != nil {
		t.Fatalf("acquire over gRPC: %v", err)
	}
	_, err = grpc.Acquire(context.Background(), connect.NewRequest(&wardenv1.AcquireRequest{Resource: "grpc/r", RequestId: "h"}))
	if connect.CodeOf(err) != connect.CodeAborted {
		t.Fatalf("second acquire over gRPC: %v, want aborted", err)
	}
	tr.CloseIdleConnections()
	s.signal(syscall.SIGTERM)
	if err := s.waitExit(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, s.log.String())
	}
	s = startServer(t, dir)
	if d := s.describe("grpc/r"); d.GetFencingToken() != resp.Msg.GetFencingToken() {
		t.Fatalf("after graceful restart: %v", d)
	}
}
