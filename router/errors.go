package router

import (
	"errors"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// Errors of the routing layer. All of them mean "safe to retry with the
// same ids" and map to Connect's Unavailable.
var (
	// ErrNoLeader: no local replica leads the shard (election under way,
	// no quorum, or the leader is on another node).
	ErrNoLeader = errors.New("router: no leader for the shard")
	// ErrOutcomeUnknown: a proposal was sent but its outcome was not
	// learned (timeout, leader change, shard closing). It may have
	// committed; a retry with the same request id finds out.
	ErrOutcomeUnknown = errors.New("router: proposal outcome unknown")

	// ErrDropped marks a request that the Raft host dropped before
	// proposing it (a shard not ready after a restart, a busy node, a
	// replica that does not lead): the router retries it itself, as it
	// cannot apply twice. A RaftHost wraps it with ErrNoLeader.
	ErrDropped = errors.New("dropped before proposing")
)

// ErrMembershipChanged: a membership change named a config change id
// that is no longer the shard's (another change was applied since it was
// read), and every replica refused it. Aborted: read the membership and
// decide again.
var ErrMembershipChanged = errors.New("router: the membership changed since it was read")

// ResultError is a shard result that refused the command.
type ResultError struct {
	Res *shardv1.Result
	// Moved, for a range that left the shard or is moving, is where the
	// map placed the key when the router stopped retrying.
	Moved *RangeMoved
}

// RangeMoved is where the current map puts a key's range, and where that
// shard is led from as far as this node knows: what a client needs to
// route again after its key's range left a shard (the API layer sends it
// as the RangeMoved detail).
type RangeMoved struct {
	ShardID uint64
	// Start and End bound the range [Start, End) in the key hash space.
	Start, End uint64
	// Generation is the map's generation the answer was read from.
	Generation uint64
	// LeaderNodeID and LeaderAddress are the shard's leader's node id and
	// client address (0 and "" when unknown).
	LeaderNodeID  uint64
	LeaderAddress string
}

func (e *ResultError) Error() string {
	if e.Res.GetField() != "" {
		return e.Res.GetField() + ": " + e.Res.GetReason()
	}
	return e.Res.GetReason()
}
