package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/lni/dragonboat/v4"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/shard"
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

	// errDropped marks a request that Dragonboat dropped before proposing
	// it (shard not ready after a restart, system busy): the router retries
	// it itself, as it cannot apply twice.
	errDropped = errors.New("dropped before proposing")
)

// resultError is a shard result that refused the command.
type resultError struct{ res *shardv1.Result }

func (e *resultError) Error() string {
	if e.res.GetField() != "" {
		return e.res.GetField() + ": " + e.res.GetReason()
	}
	return e.res.GetReason()
}

// outcome classifies an RPC's result for metrics: ok, conflict, timeout,
// stale (lease not current), invalid, exhausted, unknown (outcome not
// learned), unavailable, canceled or error.
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	var re *resultError
	var fe *shard.FieldError
	switch {
	case errors.As(err, &re):
		switch re.res.GetCode() {
		case shardv1.Code_CODE_CONFLICT:
			return "conflict"
		case shardv1.Code_CODE_FAILED_PRECONDITION:
			return "stale"
		case shardv1.Code_CODE_INVALID_ARGUMENT:
			return "invalid"
		case shardv1.Code_CODE_WRONG_SHARD, shardv1.Code_CODE_UNAVAILABLE:
			return "unavailable"
		case shardv1.Code_CODE_RESOURCE_EXHAUSTED:
			return "exhausted"
		}
		return "error"
	case errors.As(err, &fe):
		return "invalid"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, errWaitTimedOut), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, ErrOutcomeUnknown):
		return "unknown"
	case errors.Is(err, ErrNoLeader), errors.Is(err, ErrClockUnconfirmed):
		return "unavailable"
	}
	return "error"
}

// unavailable reports whether err is one that toConnect answers as
// Unavailable: safe to retry with the same ids.
func unavailable(err error) bool {
	return err != nil && connect.CodeOf(toConnect(err)) == connect.CodeUnavailable
}

// toConnect is the one place where Warden's errors become Connect codes
// (DESIGN.md §3 "Error codes").
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var re *resultError
	var fe *shard.FieldError
	var ce *connect.Error
	var rl *remoteLeader
	switch {
	case errors.As(err, &re):
		return resultToConnect(re.res)
	case errors.As(err, &ce): // a forwarded call's answer
		return ce
	case errors.As(err, &rl): // a forwarded call reached a node that no longer leads
		return connect.NewError(connect.CodeUnavailable, err)
	case errors.As(err, &fe):
		return withDetail(connect.NewError(connect.CodeInvalidArgument, fe),
			&wardenv1.FieldViolation{Field: fe.Field, Description: fe.Reason})
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, errWaitTimedOut):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	case errors.Is(err, ErrOutcomeUnknown), errors.Is(err, ErrNoLeader), errors.Is(err, ErrClockUnconfirmed):
		return connect.NewError(connect.CodeUnavailable, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

func resultToConnect(res *shardv1.Result) error {
	err := &resultError{res}
	switch res.GetCode() {
	case shardv1.Code_CODE_CONFLICT:
		return withDetail(connect.NewError(connect.CodeAborted, err), &wardenv1.LockHeld{
			FencingToken: res.GetLease().GetFencingToken(),
			ExpiresAt:    timestamp(res.GetLease().GetExpiresAtUnixNano()),
		})
	case shardv1.Code_CODE_FAILED_PRECONDITION:
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case shardv1.Code_CODE_INVALID_ARGUMENT:
		return withDetail(connect.NewError(connect.CodeInvalidArgument, err),
			&wardenv1.FieldViolation{Field: res.GetField(), Description: res.GetReason()})
	case shardv1.Code_CODE_WRONG_SHARD, shardv1.Code_CODE_UNAVAILABLE:
		return connect.NewError(connect.CodeUnavailable, err)
	case shardv1.Code_CODE_RESOURCE_EXHAUSTED:
		if q := res.GetQuota(); q != nil {
			return withDetail(connect.NewError(connect.CodeResourceExhausted, err), quotaExhausted(q))
		}
		return withDetail(connect.NewError(connect.CodeResourceExhausted, err),
			&wardenv1.FieldViolation{Field: res.GetField(), Description: res.GetReason()})
	}
	return connect.NewError(connect.CodeInternal, fmt.Errorf("shard answered %v: %w", res.GetCode(), err))
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
		return fmt.Errorf("%w (%w): %v", ErrNoLeader, errDropped, err)
	case errors.Is(err, context.Canceled):
		return err
	}
	// Timeouts, aborts, dropped proposals, closed shards: it may have
	// committed.
	return fmt.Errorf("%w: %v", ErrOutcomeUnknown, err)
}

func withDetail(e *connect.Error, m proto.Message) *connect.Error {
	if d, err := connect.NewErrorDetail(m); err == nil {
		e.AddDetail(d)
	}
	return e
}

func timestamp(unixNano int64) *timestamppb.Timestamp {
	if unixNano == 0 {
		return nil
	}
	return timestamppb.New(time.Unix(0, unixNano))
}
