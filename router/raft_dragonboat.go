package router

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/raftio"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// dragonboatHost is the RaftHost of a Dragonboat NodeHost.
type dragonboatHost struct {
	nh *dragonboat.NodeHost
	// exportDir is where export writes its files (placement.Node.ExportDir).
	exportDir string
	// writesRefused says why the node proposes nothing now
	// (placement.Node.WritesRefused: its disk is below the reserve).
	writesRefused func() error
}

// HostOf is the router's seam to node n's Raft host.
func HostOf(n *placement.Node) RaftHost {
	return dragonboatHost{n.NodeHost(), n.ExportDir(), n.WritesRefused}
}

func (h dragonboatHost) Export(ctx context.Context, shardID uint64) (*shard.ExportedSnapshot, string, error) {
	if err := os.MkdirAll(h.exportDir, 0o700); err != nil {
		return nil, "", err
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	path := filepath.Join(h.exportDir, fmt.Sprintf("shard-%d-%x.snap", shardID, b))
	out, err := h.nh.SyncRead(ctx, shardID, shard.ExportQuery{Path: path})
	if err != nil {
		os.Remove(path)
		return nil, "", proposeError(err)
	}
	return out.(*shard.ExportedSnapshot), path, nil
}

func (h dragonboatHost) Propose(ctx context.Context, shardID uint64, cmd []byte) ([]byte, error) {
	if err := h.writesRefused(); err != nil {
		// Not proposed, and not retried here: the disk frees up on an
		// operator's time, not in a leader wait. Unavailable (classify).
		return nil, err
	}
	out, err := h.nh.SyncPropose(ctx, h.nh.GetNoOPSession(shardID), cmd)
	if err != nil {
		return nil, proposeError(err)
	}
	return out.Data, nil
}

func (h dragonboatHost) Read(ctx context.Context, shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	out, err := h.nh.SyncRead(ctx, shardID, q)
	if err != nil {
		return nil, proposeError(err)
	}
	return out.(*shardv1.QueryResult), nil
}

func (h dragonboatHost) StaleRead(shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	out, err := h.nh.StaleRead(shardID, q)
	if err != nil {
		return nil, err
	}
	return out.(*shardv1.QueryResult), nil
}

func (h dragonboatHost) LeaderOf(shardID uint64) (uint64, uint64, bool, error) {
	return h.nh.GetLeaderID(shardID)
}

func (h dragonboatHost) TransferLeader(shardID, target uint64) error {
	err := h.nh.RequestLeaderTransfer(shardID, target)
	if errors.Is(err, dragonboat.ErrShardNotReady) {
		return fmt.Errorf("%w: %v", ErrDropped, err)
	}
	return err
}

func (h dragonboatHost) Snapshot(ctx context.Context, shardID uint64) (uint64, error) {
	idx, err := h.nh.SyncRequestSnapshot(ctx, shardID, dragonboat.SnapshotOption{OverrideCompactionOverhead: true, CompactionOverhead: 0})
	switch {
	case errors.Is(err, dragonboat.ErrRejected):
		return idx, ErrNothingToSnapshot
	case errors.Is(err, dragonboat.ErrSystemBusy):
		return idx, fmt.Errorf("%w: %v", ErrSnapshotBusy, err)
	}
	return idx, err
}

func (h dragonboatHost) ChangeMembership(ctx context.Context, req *placementv1.MembershipRequest) (*placementv1.MembershipResponse, error) {
	shardID, change, replica, addr, ccid := req.GetShardId(), req.GetChange(), req.GetReplicaId(), req.GetAddress(), req.GetConfigChangeId()
	var err error
	switch change {
	case placementv1.MembershipChange_MEMBERSHIP_CHANGE_NONE:
	case placementv1.MembershipChange_MEMBERSHIP_CHANGE_ADD_NON_VOTING:
		err = h.nh.SyncRequestAddNonVoting(ctx, shardID, replica, addr, ccid)
	case placementv1.MembershipChange_MEMBERSHIP_CHANGE_ADD_VOTING:
		err = h.nh.SyncRequestAddReplica(ctx, shardID, replica, addr, ccid)
	case placementv1.MembershipChange_MEMBERSHIP_CHANGE_REMOVE:
		err = h.nh.SyncRequestDeleteReplica(ctx, shardID, replica, ccid)
	default:
		return nil, fmt.Errorf("change: %v is not a membership change", change)
	}
	if errors.Is(err, dragonboat.ErrRejected) {
		// Every replica refused it at apply: on an ordered shard, a
		// stale config change id (Dragonboat also rejects adding a
		// removed replica id, which placement never hands out twice).
		err = fmt.Errorf("%w: config change id %d: %v", ErrMembershipChanged, ccid, err)
	}
	if err != nil {
		return nil, fmt.Errorf("shard %d: %v of replica %d: %w", shardID, change, replica, err)
	}
	m, err := h.nh.SyncGetShardMembership(ctx, shardID)
	if err != nil {
		return nil, fmt.Errorf("shard %d: membership: %w", shardID, err)
	}
	out := &placementv1.MembershipResponse{Voting: m.Nodes, NonVoting: m.NonVotings, ConfigChangeId: m.ConfigChangeID}
	for id := range m.Removed {
		out.Removed = append(out.Removed, id)
	}
	return out, nil
}

// LeaderUpdated implements raftio.IRaftEventListener: pass the
// Leadership as the NodeHost's RaftEventListener. Dragonboat calls it
// asynchronously, for every leader change a local replica learns of.
func (l *Leadership) LeaderUpdated(info raftio.LeaderInfo) {
	l.leaderUpdated(info.ShardID, info.ReplicaID, info.LeaderID, info.Term)
}

// proposeError classifies an error of SyncPropose or SyncRead.
func proposeError(err error) error {
	switch {
	case errors.Is(err, dragonboat.ErrTimeoutTooSmall), errors.Is(err, dragonboat.ErrInvalidDeadline):
		// Not proposed: the caller's deadline left no time to try, or had
		// passed already (by the clock, before the context's timer fired
		// and set its Err).
		return fmt.Errorf("%w: %v", context.DeadlineExceeded, err)
	case errors.Is(err, dragonboat.ErrShardNotReady), errors.Is(err, dragonboat.ErrSystemBusy),
		errors.Is(err, dragonboat.ErrShardNotFound), errors.Is(err, dragonboat.ErrClosed),
		errors.Is(err, dragonboat.ErrRejected):
		// Not proposed, or refused before commit.
		return fmt.Errorf("%w (%w): %v", ErrNoLeader, ErrDropped, err)
	case errors.Is(err, context.Canceled):
		return err
	}
	// Timeouts, aborts, dropped proposals, closed shards: it may have
	// committed.
	return fmt.Errorf("%w: %v", ErrOutcomeUnknown, err)
}
