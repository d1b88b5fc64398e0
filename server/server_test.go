package server

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
)

// Start serves a dev cluster on a port it picks and advertises that port
// in the placement map; Shutdown closes the port and the nodes, and a
// second Start on the same data restarts every node from it.
func TestStartServeShutdownRestart(t *testing.T) {
	dir := t.TempDir()
	start := func() *Server {
		t.Helper()
		s, err := Start(Config{Listen: "127.0.0.1:0", Dev: &DevConfig{DataDir: dir, Router: router.Config{ScanInterval: 50 * time.Millisecond}}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := start()
	for i, m := range s.Cluster.Modes {
		if m != ModeNewCluster {
			t.Fatalf("first start: node %d started in mode %v, want %v", i+1, m, ModeNewCluster)
		}
	}
	addr := s.Addr()
	for _, n := range s.Cluster.Router.Map().State().GetNodes() {
		if n.GetListenAddr() != addr {
			t.Fatalf("node %d advertises %s; the server listens on %s", n.GetId(), n.GetListenAddr(), addr)
		}
	}
	locks := wardenv1connect.NewLockServiceClient(http.DefaultClient, "http://"+addr)
	got, err := locks.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "r", RequestId: "a", LeaseTtl: durationpb.New(time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("%s still accepts connections after Shutdown", addr)
	}

	s = start()
	defer func() {
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	for i, m := range s.Cluster.Modes {
		if m != ModeRestart {
			t.Fatalf("second start: node %d started in mode %v, want %v", i+1, m, ModeRestart)
		}
	}
	locks = wardenv1connect.NewLockServiceClient(http.DefaultClient, "http://"+s.Addr())
	d, err := locks.Describe(ctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: "r"}))
	if err != nil {
		t.Fatal(err)
	}
	if d.Msg.GetFencingToken() != got.Msg.GetFencingToken() {
		t.Fatalf("after the restart r is held with token %d; it was granted token %d", d.Msg.GetFencingToken(), got.Msg.GetFencingToken())
	}
}
