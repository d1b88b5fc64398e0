package router

import (
	"context"
	"errors"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// raftHost is everything the router asks of a node's Raft host: the
// seam between routing and consensus. Production nodes use Dragonboat's
// NodeHost (dragonboatHost, the only file of the router that imports
// Dragonboat); the interaction tests use a scripted fake. Leader-change
// events reach the router through the node's Leadership, the host's
// event listener.
//
// Errors are the router's own: a request the host dropped before
// proposing it wraps errDropped (and ErrNoLeader), one whose outcome is
// unknown wraps ErrOutcomeUnknown, one whose deadline left no time wraps
// context.DeadlineExceeded.
type raftHost interface {
	// propose commits cmd to shardID through the local replica, which
	// must lead, and returns the state machine's result bytes.
	propose(ctx context.Context, shardID uint64, cmd []byte) ([]byte, error)
	// read runs a linearizable read on the local replica (a ReadIndex
	// round with a quorum).
	read(ctx context.Context, shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error)
	// staleRead reads the local replica without a quorum round.
	staleRead(shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error)
	// leaderOf is the local replica's view of shardID's leader: its
	// replica id and term, and whether it is known (valid). err is set
	// when the node hosts no running replica of the shard.
	leaderOf(shardID uint64) (replicaID, term uint64, valid bool, err error)
	// transferLeader asks the local replica's group to elect replica
	// target; errDropped when the replica is not ready for it.
	transferLeader(shardID, target uint64) error
	// export writes the local replica's whole state, as of a linearizable
	// read, to a new file (shard.ExportQuery) and returns what it wrote
	// and the file's path; the caller removes the file. ctx bounds the
	// read index only, not the writing of the file after it.
	export(ctx context.Context, shardID uint64) (*shard.ExportedSnapshot, string, error)
	// snapshot snapshots the local replica and compacts its log behind
	// it, returning the snapshot's index; errNothingToSnapshot when no
	// entry was applied since the last one, errSnapshotBusy when the
	// replica is taking another snapshot.
	snapshot(ctx context.Context, shardID uint64) (uint64, error)
	// changeMembership makes one membership change (NONE only reads it)
	// through the local replica, which must be a voting member, and
	// returns the membership after it; ErrMembershipChanged when the
	// shard compares config change ids and req's is not the current one.
	changeMembership(ctx context.Context, req *placementv1.MembershipRequest) (*placementv1.MembershipResponse, error)
}

// errNothingToSnapshot: the replica applied nothing since its last
// snapshot, or was saving one of its own (one every SnapshotEntries
// entries), which Dragonboat answers the same way (ErrRejected).
var errNothingToSnapshot = errors.New("nothing to snapshot: no entries applied since the replica's last snapshot, or it was saving one")

// errSnapshotBusy: the replica is taking another snapshot (Dragonboat's
// ErrSystemBusy), such as the node's snapshot of an idle replica
// (placement.Node's idle compaction) or a second admin call.
var ErrSnapshotBusy = errors.New("the replica is taking another snapshot")
