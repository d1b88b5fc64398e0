package router

import (
	"context"
	"errors"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// RaftHost is everything the router asks of a node's Raft host: the
// seam between routing and consensus. Production nodes use Dragonboat's
// NodeHost (dragonboatHost, the only file of the router that imports
// Dragonboat); the routing tests use a scripted fake and routertest a modelled
// Raft group of real state machines. Leader-change
// events reach the router through the node's Leadership, the host's
// event listener.
//
// Errors are the router's own: a request the host dropped before
// proposing it wraps ErrDropped (and ErrNoLeader), one whose outcome is
// unknown wraps ErrOutcomeUnknown, one whose deadline left no time wraps
// context.DeadlineExceeded.
type RaftHost interface {
	// Propose commits cmd to shardID through the local replica, which
	// must lead, and returns the state machine's result bytes.
	Propose(ctx context.Context, shardID uint64, cmd []byte) ([]byte, error)
	// Read runs a linearizable read on the local replica (a ReadIndex
	// round with a quorum).
	Read(ctx context.Context, shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error)
	// StaleRead reads the local replica without a quorum round.
	StaleRead(shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error)
	// LeaderOf is the local replica's view of shardID's leader: its
	// replica id and term, and whether it is known (valid). err is set
	// when the node hosts no running replica of the shard.
	LeaderOf(shardID uint64) (replicaID, term uint64, valid bool, err error)
	// TransferLeader asks the local replica's group to elect replica
	// target; ErrDropped when the replica is not ready for it.
	TransferLeader(shardID, target uint64) error
	// Export writes the local replica's whole state, as of a linearizable
	// read, to a new file (shard.ExportQuery) and returns what it wrote
	// and the file's path; the caller removes the file. ctx bounds the
	// read index only, not the writing of the file after it.
	Export(ctx context.Context, shardID uint64) (*shard.ExportedSnapshot, string, error)
	// Snapshot snapshots the local replica and compacts its log behind
	// it, returning the snapshot's index; ErrNothingToSnapshot when no
	// entry was applied since the last one, ErrSnapshotBusy when the
	// replica is taking another snapshot.
	Snapshot(ctx context.Context, shardID uint64) (uint64, error)
	// ChangeMembership makes one membership change (NONE only reads it)
	// through the local replica, which must be a voting member, and
	// returns the membership after it; ErrMembershipChanged when the
	// shard compares config change ids and req's is not the current one.
	ChangeMembership(ctx context.Context, req *placementv1.MembershipRequest) (*placementv1.MembershipResponse, error)
}

// ErrNothingToSnapshot: the replica applied nothing since its last
// snapshot, or was saving one of its own (one every SnapshotEntries
// entries), which Dragonboat answers the same way (ErrRejected).
var ErrNothingToSnapshot = errors.New("nothing to snapshot: no entries applied since the replica's last snapshot, or it was saving one")

// ErrSnapshotBusy: the replica is taking another snapshot (Dragonboat's
// ErrSystemBusy), such as the node's snapshot of an idle replica
// (placement.Node's idle compaction) or a second admin call.
var ErrSnapshotBusy = errors.New("the replica is taking another snapshot")
