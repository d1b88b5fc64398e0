package placement

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// fakeRaftState makes dir look like a NodeHost has run there.
func fakeRaftState(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "nodehost"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"nodehost", "wal"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, sub, "LOCK"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// An empty data directory is initialised only when the mode allows it;
// once initialised, the identity is kept across starts, and a directory
// that lost its Raft log, or belongs to another node, is refused.
func TestOpenIdentity(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "node-2")
	if _, err := OpenIdentity(dir, 2, InitRefuse); !errors.Is(err, ErrNoState) || !strings.Contains(err.Error(), "--initial-cluster-state new") {
		t.Fatalf("empty directory, refuse: %v", err)
	}
	if HasState(dir) {
		t.Fatal("a refused start left state behind")
	}
	id, err := OpenIdentity(dir, 2, InitNewCluster)
	if err != nil || id.NodeID != 2 || len(id.Incarnation) != 32 || id.Joined {
		t.Fatalf("new cluster: %+v %v", id, err)
	}
	if !HasState(dir) {
		t.Fatal("HasState is false after initialising")
	}
	// The NodeHost has not run yet: its log is missing, so the next start
	// is refused even though the identity is there.
	if _, err := OpenIdentity(dir, 2, InitRefuse); err == nil || !strings.Contains(err.Error(), "Raft log is gone") {
		t.Fatalf("identity without a Raft log: %v", err)
	}
	fakeRaftState(t, dir)
	again, err := OpenIdentity(dir, 2, InitRefuse)
	if err != nil || again.Incarnation != id.Incarnation || !id.Created || again.Created {
		t.Fatalf("restart: %+v %v after %+v: want the same incarnation, created only the first time", again, err, id)
	}
	if err := again.Forget(dir); err != nil || !HasState(dir) {
		t.Fatalf("Forget of an identity not created in this start removed it: %v", err)
	}
	// The write-ahead log alone lost is a lost log too.
	if err := os.RemoveAll(filepath.Join(dir, "wal")); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenIdentity(dir, 2, InitRefuse); err == nil || !strings.Contains(err.Error(), "Raft log is gone") {
		t.Fatalf("identity without its WAL: %v", err)
	}
	fakeRaftState(t, dir)
	if _, err := OpenIdentity(dir, 3, InitNewCluster); err == nil || !strings.Contains(err.Error(), "belongs to node 2") {
		t.Fatalf("another node's directory: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, identityFile), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenIdentity(dir, 2, InitRefuse); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("damaged identity: %v", err)
	}

	// A directory from before identities (a Raft log, no identity) is
	// given one, whatever the mode.
	legacy := t.TempDir()
	fakeRaftState(t, legacy)
	if id, err := OpenIdentity(legacy, 1, InitRefuse); err != nil || id.Incarnation == "" || id.Joined {
		t.Fatalf("legacy directory: %+v %v", id, err)
	}
	fresh := t.TempDir()
	joined, err := OpenIdentity(fresh, 4, InitJoin)
	if err != nil || !joined.Joined || !joined.Created {
		t.Fatalf("joining node: %+v %v", joined, err)
	}
	// A start refused right after creating the identity leaves the
	// directory as empty as it found it.
	if err := joined.Forget(fresh); err != nil || HasState(fresh) {
		t.Fatalf("Forget: %v, state left: %v", err, HasState(fresh))
	}
}

// The placement group's record decides: another incarnation is a
// replaced directory; a fresh joiner under a known id reuses it.
func TestCheckIncarnation(t *testing.T) {
	st := &placementv1.State{Nodes: []*placementv1.Node{{Id: 1, Incarnation: "aa"}, {Id: 2}}, RemovedNodeIds: []uint64{3}}
	for _, tc := range []struct {
		id   Identity
		want string // "" for accepted
	}{
		{Identity{NodeID: 1, Incarnation: "aa"}, ""},
		{Identity{NodeID: 1, Incarnation: "bb"}, "the cluster knows node 1 as incarnation aa"},
		{Identity{NodeID: 1, Incarnation: "bb", Joined: true}, "was a member of this cluster already"},
		{Identity{NodeID: 2, Incarnation: "cc"}, ""}, // registered before incarnations, or never started
		{Identity{NodeID: 2, Incarnation: "cc", Joined: true}, "was a member of this cluster already"},
		{Identity{NodeID: 5, Incarnation: "dd", Joined: true}, ""},
		{Identity{NodeID: 3, Incarnation: "ee"}, "node 3 was removed from the cluster"},
	} {
		err := CheckIncarnation(st, tc.id)
		var ie *IdentityError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.id, err)
		case tc.want != "" && (!errors.As(err, &ie) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want an IdentityError saying %q", tc.id, err, tc.want)
		}
	}
}
