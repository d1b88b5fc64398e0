package server

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/rpc"
)

// A node whose directory is new in this start (a new cluster's member, a
// restore's) starts Raft only when the cluster confirms it: a serving
// member's placement state that knows it by this incarnation or none
// (for a restore, the state this restore created), or a quorum of
// initial members starting the same way. Unreachable members,
// restarting ones, ones that run Raft but do not serve yet and ones
// starting otherwise make it wait, never start; a state that does not
// know it so refuses it.
func TestDecideStart(t *testing.T) {
	id := placement.Identity{NodeID: 3, Incarnation: "new", Created: true}
	state := func(restoreID, incarnation string) *placementv1.State {
		return &placementv1.State{Generation: 5, RestoreId: restoreID, Nodes: []*placementv1.Node{{Id: 3, Incarnation: incarnation}}}
	}
	down := peerAnswer{addr: "a:1", err: errors.New("context deadline exceeded")}
	newCluster := peerAnswer{addr: "b:1", status: "new-cluster"}
	for _, tc := range []struct {
		name      string
		answers   []peerAnswer
		status    string
		restoreID string
		want      bool
		wantErr   string // refused, naming this
		wantWhy   string // waiting, saying this
	}{
		{name: "both peers paused", answers: []peerAnswer{down, {addr: "b:1", err: errors.New("timeout")}}, status: "new-cluster", wantWhy: "a:1: context deadline exceeded"},
		{name: "a quorum creating the cluster", answers: []peerAnswer{down, newCluster}, status: "new-cluster", want: true},
		{name: "a restarting peer and one paused", answers: []peerAnswer{down, {addr: "b:1", status: "restart"}}, status: "new-cluster", wantWhy: "b:1 is starting as restart"},
		{name: "a wiped member", answers: []peerAnswer{{addr: "a:1", state: state("", "old")}}, status: "new-cluster", wantErr: "incarnation old"},
		{name: "a member not registered yet", answers: []peerAnswer{down, {addr: "b:1", state: state("", "")}}, status: "new-cluster", want: true},
		{name: "a state not yet created", answers: []peerAnswer{{addr: "a:1", state: &placementv1.State{}}, down}, status: "new-cluster", wantWhy: "a:1 has no placement state yet"},
		{name: "a restore into a running cluster", answers: []peerAnswer{{addr: "a:1", state: state("", "old")}}, status: "restore r1", restoreID: "r1", wantErr: "did not create"},
		{name: "a restore into another restore's cluster", answers: []peerAnswer{{addr: "a:1", state: state("r0", "")}}, status: "restore r1", restoreID: "r1", wantErr: "did not create"},
		{name: "the same restore run twice on a member", answers: []peerAnswer{{addr: "a:1", state: state("r1", "old")}}, status: "restore r1", restoreID: "r1", wantErr: "incarnation old"},
		{name: "a late member of the restore", answers: []peerAnswer{{addr: "a:1", state: state("r1", "")}}, status: "restore r1", restoreID: "r1", want: true},
		{name: "a quorum restoring", answers: []peerAnswer{down, {addr: "b:1", status: "restore r1"}}, status: "restore r1", restoreID: "r1", want: true},
		{name: "a peer restoring another backup", answers: []peerAnswer{down, {addr: "b:1", status: "restore r0"}}, status: "restore r1", restoreID: "r1", wantWhy: "b:1 is starting as restore r0"},
		{name: "a peer running Raft, not serving yet", answers: []peerAnswer{down, {addr: "b:1", status: StatusRunning}}, status: "new-cluster", wantWhy: "b:1 has started Raft"},
		{name: "a peer running a restore's Raft", answers: []peerAnswer{down, {addr: "b:1", status: StatusRunning}}, status: "restore r1", restoreID: "r1", wantWhy: "b:1 has started Raft"},
		{name: "a restore beside new members", answers: []peerAnswer{newCluster, {addr: "c:1", status: "new-cluster"}}, status: "restore r1", restoreID: "r1", wantWhy: "1 initial member(s) starting as restore r1, 2 needed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, why, err := decideStart(tc.answers, id, tc.status, tc.restoreID, 1, 2)
			switch {
			case tc.wantErr != "":
				var identity *placement.IdentityError
				if ok || err == nil || !strings.Contains(err.Error(), tc.wantErr) || !(errors.As(err, &identity) || errors.Is(err, placement.ErrRestored)) {
					t.Fatalf("decideStart = %v, %q, %v; want refused naming %q", ok, why, err, tc.wantErr)
				}
			case tc.want:
				if !ok || err != nil {
					t.Fatalf("decideStart = %v, %q, %v; want confirmed", ok, why, err)
				}
			default:
				if ok || err != nil || !strings.Contains(why, tc.wantWhy) {
					t.Fatalf("decideStart = %v, %q, %v; want waiting, saying %q", ok, why, err, tc.wantWhy)
				}
			}
		})
	}
}

// A node answers as new only until it starts Raft: once its Raft
// transport listens (Raft runs, and may acknowledge entries) while
// placement.Bootstrap still waits for a quorum, its starting status is
// StatusRunning, which no other node's identity check counts as new.
func TestStartingStatusRunningOnceRaftStarts(t *testing.T) {
	const secret = "secret-0123456789"
	// Member 2 answers that it starts a new cluster too, and never runs
	// Raft; member 3 is down. With this node, a quorum of 3 says new, so
	// this node starts Raft, and Bootstrap waits in vain.
	peer := httptest.NewUnstartedServer(rpc.NewStartingHandler(router.Config{ClusterSecret: secret}, func() string { return "new-cluster" }))
	peer.Config.Protocols = new(http.Protocols)
	peer.Config.Protocols.SetHTTP1(true)
	peer.Config.Protocols.SetUnencryptedHTTP2(true)
	peer.Start()
	defer peer.Close()
	addr := func() string {
		a, err := FreeLoopbackAddr()
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	raft, listen := addr(), addr()
	cfg := ClusterConfig{
		Nodes:      []NodeSpec{{ID: 1, RaftAddr: raft, DataDir: t.TempDir()}},
		ListenAddr: listen,
		Members: []Member{
			{ID: 1, RaftAddr: raft, ListenAddr: listen},
			{ID: 2, RaftAddr: addr(), ListenAddr: strings.TrimPrefix(peer.URL, "http://")},
			{ID: 3, RaftAddr: addr(), ListenAddr: addr()},
		},
		NewCluster:       true,
		Router:           router.Config{ClusterSecret: secret},
		BootstrapTimeout: 5 * time.Second,
	}
	cfg.Status = NewStatus(cfg)
	if got := cfg.Status.String(); got != "new-cluster" {
		t.Fatalf("status before the start: %q, want %q", got, "new-cluster")
	}
	done := make(chan error, 1)
	go func() {
		c, err := StartCluster(cfg)
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if c, err := net.Dial("tcp", raft); err == nil {
			c.Close()
			break
		}
		select {
		case err := <-done:
			t.Fatalf("StartCluster returned (%v) before its Raft transport listened", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the node's Raft transport never listened")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := cfg.Status.String(); got != StatusRunning {
		t.Errorf("status once Raft runs, with Bootstrap waiting: %q, want %q", got, StatusRunning)
	}
	if err := <-done; err == nil {
		t.Fatal("StartCluster succeeded without a quorum")
	}
}
