package placement

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/shard"
)

// identityFile is the name, inside a node's data directory, of the file
// that records which node the directory belongs to and its incarnation.
const identityFile = "identity.json"

// Identity is what a node's data directory says about itself. It is
// written once, when the directory is first initialised, before the
// NodeHost writes anything: every Raft vote or acknowledgement the node
// ever makes comes after it, so a directory without it has acknowledged
// nothing.
type Identity struct {
	// NodeID is the node the directory belongs to.
	NodeID uint64 `json:"node_id"`
	// Incarnation is a random id (128 bits, hex) drawn when the directory
	// was initialised; it is registered in the placement group, so a
	// replaced directory is recognised (placementv1.Node.Incarnation).
	Incarnation string `json:"incarnation"`
	// Created is set when OpenIdentity initialised an empty directory in
	// this start; Joined when it did so for a joining node (InitJoin).
	Created bool `json:"-"`
	Joined  bool `json:"-"`
}

// InitMode says what a node may do with a data directory that holds no
// Warden state.
type InitMode int

const (
	// InitRefuse refuses an empty directory: the node was a member before
	// and lost its data, or was pointed at the wrong directory. It is the
	// default (wardend --initial-cluster-state existing).
	InitRefuse InitMode = iota
	// InitNewCluster initialises an empty directory for an initial member
	// of a cluster being created (wardend --initial-cluster-state new).
	InitNewCluster
	// InitJoin initialises an empty directory for a node that joins a
	// running cluster under a node id never used in it (wardend --join).
	InitJoin
	// InitRestore accepts a directory that wardend restore wrote (an
	// identity and a pending restore, no Raft log yet) for its first
	// start; a directory without a pending restore is refused as with
	// InitRefuse.
	InitRestore
)

// ErrNoState is the error of OpenIdentity for a data directory that holds
// no Warden state when its InitMode is InitRefuse.
var ErrNoState = errors.New("placement: the data directory holds no Warden state")

// OpenIdentity returns the identity of the node nodeID's data directory
// dir, initialising it as mode allows. It fails when dir belongs to
// another node, when it has an identity but its Raft log is gone, and,
// with InitRefuse, when it holds no state at all (ErrNoState, wrapped
// with what to do). A directory written by a binary that predates
// identities (a Raft log, no identity file) is given one.
//
// Raft assumes that a voter never forgets what it acknowledged: a node
// restarted on an empty directory under its old id could vote twice in a
// term or complete a quorum that has forgotten committed entries, and
// so reissue a lease and its fencing token. When no peer can be reached
// (the stale-quorum case) only the node itself can refuse, and this is
// where it does.
func OpenIdentity(dir string, nodeID uint64, mode InitMode) (Identity, error) {
	path := filepath.Join(dir, identityFile)
	raftState := hasRaftState(dir)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		var id Identity
		if err := json.Unmarshal(b, &id); err != nil || id.NodeID == 0 || id.Incarnation == "" {
			why := "node_id and incarnation are required"
			if err != nil {
				why = err.Error()
			}
			return Identity{}, fmt.Errorf("placement: %s is damaged (%s): restore the data directory or replace the node", path, why)
		}
		if id.NodeID != nodeID {
			return Identity{}, fmt.Errorf("placement: data directory %s belongs to node %d, not --node-id %d", dir, id.NodeID, nodeID)
		}
		if !raftState && mode == InitRestore {
			if pending, err := PendingRestore(dir); err != nil || pending != nil {
				return id, err
			}
		}
		if !raftState {
			return Identity{}, fmt.Errorf("placement: data directory %s is node %d's (incarnation %s) but its Raft log is gone: "+
				"the node must not vote again under its old id; restore the directory, or replace the node", dir, nodeID, id.Incarnation)
		}
		return id, nil
	case !errors.Is(err, os.ErrNotExist):
		return Identity{}, fmt.Errorf("placement: %w", err)
	}
	if !raftState && mode == InitRefuse {
		return Identity{}, fmt.Errorf("%w (%s). If this node is an initial member of a cluster being created, start it with "+
			"--initial-cluster-state new. If it was a member and lost its data, it must not come back under node id %d: "+
			"a Raft voter that forgot what it acknowledged can reissue leases and fencing tokens. "+
			"Adding a node under a new id (--join) is how to bring capacity back; "+
			"replacing a member's replicas under a new id comes with node lifecycle", ErrNoState, dir, nodeID)
	}
	if raftState {
		slog.Info("data directory predates incarnation ids; giving it one", "dir", dir, "node", nodeID)
	}
	id := Identity{NodeID: nodeID, Incarnation: newIncarnation(), Created: !raftState, Joined: !raftState && mode == InitJoin}
	if err := writeIdentity(dir, id); err != nil {
		return Identity{}, err
	}
	return id, nil
}

// Forget removes the identity OpenIdentity just created (Created), for a
// start refused before the node wrote anything else: the directory is
// left as empty as it was found.
func (id Identity) Forget(dir string) error {
	if !id.Created {
		return nil
	}
	return os.Remove(filepath.Join(dir, identityFile))
}

// hasRaftState reports whether dir holds a NodeHost's data: both its
// NodeHost directory and its write-ahead log (StartNode puts Dragonboat's
// WAL in wal/). A directory missing either has forgotten what it
// acknowledged: with wal/ deleted alone, a node restarted with an empty
// log under its old identity, voted, and two acknowledged leases were
// lost and their fencing tokens issued again.
func hasRaftState(dir string) bool {
	for _, sub := range []string{"nodehost", "wal"} {
		entries, err := os.ReadDir(filepath.Join(dir, sub))
		if err != nil || len(entries) == 0 {
			return false
		}
	}
	return true
}

// HasState reports whether dir holds any Warden state (an identity, a
// NodeHost directory or a write-ahead log), as a dev cluster checks
// before it creates itself.
func HasState(dir string) bool {
	for _, name := range []string{identityFile, "nodehost", "wal"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return true
		}
	}
	return false
}

func newIncarnation() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// writeIdentity writes id to dir durably (shard.WriteFileDurably).
func writeIdentity(dir string, id Identity) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("placement: %w", err)
	}
	b, _ := json.Marshal(id)
	if err := shard.WriteFileDurably(dir, identityFile, append(b, '\n')); err != nil {
		return fmt.Errorf("placement: write %s: %w", filepath.Join(dir, identityFile), err)
	}
	return nil
}

// IdentityError is a node whose data directory the placement group does
// not recognise as the node's own: it must not start.
type IdentityError struct{ Reason string }

func (e *IdentityError) Error() string { return "placement: " + e.Reason }

// CheckIncarnation compares the node's identity with what the placement
// state st registered under its id. A node registered with another
// incarnation runs on a replaced data directory; a node that joins on a
// fresh directory (Identity.Joined) under an id the map already has
// reuses the id of a node that was a member; a node removed from the
// cluster (State.removed_node_ids) may not start again. Each is an
// *IdentityError.
func CheckIncarnation(st *placementv1.State, id Identity) error {
	if slices.Contains(st.GetRemovedNodeIds(), id.NodeID) {
		return &IdentityError{fmt.Sprintf("node %d was removed from the cluster: a node id is never used again; wipe this data directory and join under a new id", id.NodeID)}
	}
	for _, n := range st.GetNodes() {
		if n.GetId() != id.NodeID {
			continue
		}
		switch {
		case id.Joined:
			return &IdentityError{fmt.Sprintf("node id %d was a member of this cluster already: a joining node needs an id never used in it", id.NodeID)}
		case n.GetIncarnation() != "" && n.GetIncarnation() != id.Incarnation:
			return &IdentityError{fmt.Sprintf("the cluster knows node %d as incarnation %s, but this data directory is incarnation %s: "+
				"the directory was replaced or its data lost, and the node must not vote again under its old id", id.NodeID, n.GetIncarnation(), id.Incarnation)}
		}
		return nil
	}
	return nil
}
