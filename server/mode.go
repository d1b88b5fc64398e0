package server

import (
	"fmt"

	"github.com/warden-dev/warden/placement"
)

// StartMode is how a node starts. It is decided for every node before
// any starts, from whether its data directory holds state and from the
// config, as etcd's bootstrap switches on whether a WAL exists and on
// --initial-cluster-state.
type StartMode int

const (
	// ModeNewCluster: an initial member of a cluster being created
	// (ClusterConfig.NewCluster) initialises its empty data directory.
	ModeNewCluster StartMode = iota + 1
	// ModeJoin: a node that is not an initial member initialises its
	// empty data directory and registers with the running cluster through
	// the join addresses.
	ModeJoin
	// ModeRestart: the data directory holds the node's state and the
	// node starts from it (whatever NewCluster says, as etcd ignores
	// --initial-cluster-state once a WAL exists).
	ModeRestart
	// ModeRestore: the data directory was written by wardend restore and
	// its first start has not completed: the node, an initial member,
	// creates the placement group's state from the backup's (a RestoreCmd)
	// rather than bootstrap a new map, and starts the replicas whose
	// records the restore wrote.
	ModeRestore
)

func (m StartMode) String() string {
	switch m {
	case ModeNewCluster:
		return "new-cluster"
	case ModeJoin:
		return "join"
	case ModeRestart:
		return "restart"
	case ModeRestore:
		return "restore"
	}
	return fmt.Sprintf("StartMode(%d)", int(m))
}

// initMode is what placement.OpenIdentity may do with an empty data
// directory in mode m. A restart refuses one: its directory held state a
// moment ago (startMode), and OpenIdentity checks what is there.
func (m StartMode) initMode() placement.InitMode {
	switch m {
	case ModeNewCluster:
		return placement.InitNewCluster
	case ModeJoin:
		return placement.InitJoin
	case ModeRestore:
		return placement.InitRestore
	}
	return placement.InitRefuse
}

// startMode decides how node spec of cfg starts. It refuses an initial
// member whose data directory is empty without NewCluster (it was a
// member and lost its data, or points at the wrong directory:
// placement.OpenIdentity says what to do), and a node that is not an
// initial member without join addresses (it has no other way to reach
// the placement group).
func startMode(spec NodeSpec, cfg ClusterConfig) (StartMode, error) {
	initial := isMember(cfg.Members, spec.ID)
	if !initial && len(cfg.Join) == 0 {
		return 0, fmt.Errorf("server: node %d is not an initial member and has no join addresses: it cannot reach the placement group", spec.ID)
	}
	pending, err := placement.PendingRestore(spec.DataDir)
	switch {
	case err != nil:
		return 0, err
	case pending != nil && !initial:
		return 0, fmt.Errorf("server: node %d was restored from a backup but is not an initial member: "+
			"a restored cluster starts with every node of the backup in --initial-members", spec.ID)
	case pending != nil:
		return ModeRestore, nil
	case placement.HasState(spec.DataDir):
		return ModeRestart, nil
	case !initial:
		return ModeJoin, nil
	case cfg.NewCluster:
		return ModeNewCluster, nil
	}
	// OpenIdentity's refusal of an empty directory says why and what to do.
	_, err = placement.OpenIdentity(spec.DataDir, spec.ID, placement.InitRefuse)
	return 0, err
}
