package rpc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/warden-dev/warden/placement"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/shard"
)

// class is how Warden answers an error: the Connect code the client
// sees and the outcome its metrics and audit record count it under (ok,
// conflict, timeout, stale: lease not current, invalid, exhausted,
// unknown: outcome not learned, unavailable, canceled, error).
type class struct {
	code  connect.Code
	label string
}

// resultClasses classifies a shard's refusal by its result code.
var resultClasses = map[shardv1.Code]class{
	shardv1.Code_CODE_CONFLICT:            {connect.CodeAborted, "conflict"},
	shardv1.Code_CODE_FAILED_PRECONDITION: {connect.CodeFailedPrecondition, "stale"},
	shardv1.Code_CODE_INVALID_ARGUMENT:    {connect.CodeInvalidArgument, "invalid"},
	shardv1.Code_CODE_WRONG_SHARD:         {connect.CodeUnavailable, "unavailable"},
	shardv1.Code_CODE_UNAVAILABLE:         {connect.CodeUnavailable, "unavailable"},
	shardv1.Code_CODE_RESOURCE_EXHAUSTED:  {connect.CodeResourceExhausted, "exhausted"},
	shardv1.Code_CODE_PERMISSION_DENIED:   {connect.CodePermissionDenied, "denied"},
}

// codeLabels labels a forwarded call's answer by its Connect code.
var codeLabels = map[connect.Code]string{
	connect.CodeAborted:            "conflict",
	connect.CodeFailedPrecondition: "stale",
	connect.CodeInvalidArgument:    "invalid",
	connect.CodeUnavailable:        "unavailable",
	connect.CodeResourceExhausted:  "exhausted",
	connect.CodeDeadlineExceeded:   "timeout",
	connect.CodeCanceled:           "canceled",
	connect.CodePermissionDenied:   "denied",
	connect.CodeUnauthenticated:    "unauthenticated",
	connect.CodeOutOfRange:         "stale",
}

// classify is the one place where Warden's errors get their Connect code
// and outcome label (DESIGN.md §3 "Error codes"): toConnect and outcome
// both read it, so a client and the metrics never disagree.
func classify(err error) class {
	// errors.AsType, not errors.As into variables declared up front:
	// those escape to the heap on every call, and every RPC outcome is
	// classified (four allocations an RPC, 5 % of a leader's).
	if err == nil {
		return class{0, "ok"}
	}
	if re, ok := errors.AsType[*router.ResultError](err); ok {
		if c, ok := resultClasses[re.Res.GetCode()]; ok {
			return c
		}
		return class{connect.CodeInternal, "error"}
	}
	if ce, ok := errors.AsType[*connect.Error](err); ok { // a forwarded call's answer
		if l, ok := codeLabels[ce.Code()]; ok {
			return class{ce.Code(), l}
		}
		return class{ce.Code(), "error"}
	}
	if _, ok := errors.AsType[*router.RemoteLeader](err); ok { // a forwarded call reached a node that no longer leads
		return class{connect.CodeUnavailable, "unavailable"}
	}
	if _, ok := errors.AsType[*shard.FieldError](err); ok {
		return class{connect.CodeInvalidArgument, "invalid"}
	}
	switch {
	case errors.Is(err, context.Canceled):
		return class{connect.CodeCanceled, "canceled"}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, router.ErrWaitTimedOut):
		return class{connect.CodeDeadlineExceeded, "timeout"}
	case errors.Is(err, router.ErrOutcomeUnknown):
		return class{connect.CodeUnavailable, "unknown"}
	case errors.Is(err, router.ErrMembershipChanged):
		return class{connect.CodeAborted, "conflict"}
	case errors.Is(err, router.ErrHistoryGone):
		return class{connect.CodeOutOfRange, "stale"}
	case errors.Is(err, router.ErrNoLeader), errors.Is(err, router.ErrClockUnconfirmed), errors.Is(err, router.ErrNoHistory), errors.As(err, new(*placement.DiskLowError)):
		return class{connect.CodeUnavailable, "unavailable"}
	}
	return class{connect.CodeInternal, "error"}
}

// outcome is err's label for metrics and the audit log.
func outcome(err error) string { return classify(err).label }

// unavailable reports whether err is one that toConnect answers as
// Unavailable: safe to retry with the same ids.
func unavailable(err error) bool {
	return err != nil && classify(err).code == connect.CodeUnavailable
}

// toConnect turns err into the Connect error a client gets: the code of
// classify, with the details that say what to do (the holder's token of a
// conflict, the field of a bad input, the level of an exhausted quota,
// where the shard is led from or where its range went).
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	c := classify(err)
	var re *router.ResultError
	var fe *shard.FieldError
	var ce *connect.Error
	var rl *router.RemoteLeader
	var nl *router.NoLeaderError
	switch {
	case c.code == connect.CodeInternal && !errors.As(err, &ce):
		return internalError(err)
	case errors.As(err, &re):
		return resultToConnect(re, c.code)
	case errors.As(err, &ce):
		return ce
	case errors.As(err, &fe):
		return withDetail(connect.NewError(c.code, fe),
			&wardenv1.FieldViolation{Field: fe.Field, Description: fe.Reason})
	case errors.As(err, &rl):
		return withDetail(connect.NewError(c.code, err), notLeader(rl))
	case errors.As(err, &nl):
		return withDetail(connect.NewError(c.code, err), &wardenv1.NotLeader{ShardId: nl.ShardID})
	}
	return connect.NewError(c.code, err)
}

// resultToConnect is a shard refusal's Connect error, with code and the
// details of its kind.
func resultToConnect(err *router.ResultError, code connect.Code) error {
	res := err.Res
	e := connect.NewError(code, err)
	switch res.GetCode() {
	case shardv1.Code_CODE_CONFLICT:
		return withDetail(e, &wardenv1.LockHeld{
			FencingToken: res.GetLease().GetFencingToken(),
			ExpiresAt:    timestamp(res.GetLease().GetExpiresAtUnixNano()),
		})
	case shardv1.Code_CODE_INVALID_ARGUMENT:
		return withDetail(e, &wardenv1.FieldViolation{Field: res.GetField(), Description: res.GetReason()})
	case shardv1.Code_CODE_RESOURCE_EXHAUSTED:
		if q := res.GetQuota(); q != nil {
			return withDetail(e, quotaExhausted(q))
		}
		return withDetail(e, &wardenv1.FieldViolation{Field: res.GetField(), Description: res.GetReason()})
	case shardv1.Code_CODE_FAILED_PRECONDITION:
		if q := res.GetQuota(); q.GetReason() == shard.ReasonRestored {
			return withDetail(e, &wardenv1.PoolFrozen{Pool: q.GetLevel(), Reason: q.GetReason()})
		}
	}
	if m := err.Moved; m != nil {
		return withDetail(e, &wardenv1.RangeMoved{ShardId: m.ShardID, RangeStart: m.Start, RangeEnd: m.End,
			Generation: m.Generation, LeaderNodeId: m.LeaderNodeID, LeaderAddress: m.LeaderAddress})
	}
	return e
}

// notLeader is the recovery detail of an answer that could not reach
// rl's shard's leader: where it is led from, when that is known.
func notLeader(rl *router.RemoteLeader) *wardenv1.NotLeader {
	d := &wardenv1.NotLeader{ShardId: rl.ShardID}
	if rl.Term != 0 {
		d.LeaderNodeId, d.LeaderAddress, d.Term = rl.Node.GetId(), rl.Node.GetListenAddr(), rl.Term
	}
	return d
}

// internalError logs err, which no client can act on and whose text may
// describe the node's internals, under a fresh id, and returns the
// Internal error a client gets: the id alone, to quote to an operator.
func internalError(err error) error {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (Go 1.24+)
	id := hex.EncodeToString(b)
	slog.Error("internal error", "error_id", id, "err", err)
	return connect.NewError(connect.CodeInternal, fmt.Errorf("internal error %s: the node's log has its details", id))
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
