package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warden-dev/warden/placement"
)

// Each node's start mode follows from its data directory and the config,
// as etcd's bootstrap decides from its WAL and --initial-cluster-state.
func TestStartMode(t *testing.T) {
	withState := t.TempDir()
	// HasState counts an identity file as state.
	if _, err := placement.OpenIdentity(withState, 1, placement.InitNewCluster); err != nil {
		t.Fatal(err)
	}
	members := []Member{{ID: 1, RaftAddr: "127.0.0.1:1", ListenAddr: "127.0.0.1:2"}}
	for _, tc := range []struct {
		name    string
		id      uint64
		dir     string
		cfg     ClusterConfig
		want    StartMode
		wantErr string
	}{
		{name: "an initial member of a new cluster", id: 1, dir: t.TempDir(), cfg: ClusterConfig{Members: members, NewCluster: true}, want: ModeNewCluster},
		{name: "a node that joins", id: 4, dir: t.TempDir(), cfg: ClusterConfig{Members: members, Join: []string{"127.0.0.1:2"}}, want: ModeJoin},
		{name: "an initial member restarts", id: 1, dir: withState, cfg: ClusterConfig{Members: members}, want: ModeRestart},
		{name: "new is ignored once there is state", id: 1, dir: withState, cfg: ClusterConfig{Members: members, NewCluster: true}, want: ModeRestart},
		{name: "an initial member that lost its data", id: 1, dir: t.TempDir(), cfg: ClusterConfig{Members: members}, wantErr: "--initial-cluster-state new"},
		{name: "a joiner without join addresses", id: 4, dir: t.TempDir(), cfg: ClusterConfig{Members: members}, wantErr: "no join addresses"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := startMode(NodeSpec{ID: tc.id, DataDir: tc.dir}, tc.cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("startMode = %v, %v; want an error saying %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("startMode = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// Every node's mode is decided before any starts: a config under which
// one node cannot start leaves the others' directories as they were.
func TestStartClusterDecidesEveryModeFirst(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	cfg := ClusterConfig{
		Nodes:      []NodeSpec{{ID: 1, Zone: "az1", RaftAddr: "127.0.0.1:1", DataDir: a}, {ID: 2, Zone: "az2", RaftAddr: "127.0.0.1:2", DataDir: b}},
		Members:    []Member{{ID: 1, RaftAddr: "127.0.0.1:1", ListenAddr: "127.0.0.1:3"}}, // node 2 is no initial member and has no join addresses
		NewCluster: true,
	}
	if _, err := StartCluster(cfg); err == nil || !strings.Contains(err.Error(), "node 2") {
		t.Fatalf("StartCluster = %v, want node 2 refused", err)
	}
	if _, err := os.Stat(a); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("node 1's directory was touched before node 2's mode was known: %v", err)
	}
}
