package router

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/lni/dragonboat/v4"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// What Dragonboat's errors tell the caller: not proposed for lack of time
// is deadline_exceeded, dropped before proposing is unavailable and worth
// a retry here, and a timeout after proposing is an unknown outcome.
func TestProposeErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want connect.Code
	}{
		{dragonboat.ErrTimeoutTooSmall, connect.CodeDeadlineExceeded},
		{dragonboat.ErrInvalidDeadline, connect.CodeDeadlineExceeded},
		{dragonboat.ErrShardNotReady, connect.CodeUnavailable},
		{dragonboat.ErrSystemBusy, connect.CodeUnavailable},
		{dragonboat.ErrTimeout, connect.CodeUnavailable},
		{context.Canceled, connect.CodeCanceled},
	} {
		err := proposeError(tc.err)
		if got := connect.CodeOf(toConnect(err)); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.err, got, tc.want)
		}
		if dropped := errors.Is(err, errDropped); dropped != (tc.err == dragonboat.ErrShardNotReady || tc.err == dragonboat.ErrSystemBusy) {
			t.Errorf("%v: dropped %v", tc.err, dropped)
		}
	}
}

// One table classifies every error: the code a client gets and the label
// metrics count are read from the same entry, for the shard's refusals,
// forwarded answers and the router's own errors alike.
func TestClassifyOneModel(t *testing.T) {
	refusal := func(c shardv1.Code) error { return &resultError{&shardv1.Result{Code: c, Reason: "r"}} }
	for _, tc := range []struct {
		err   error
		code  connect.Code
		label string
	}{
		{refusal(shardv1.Code_CODE_CONFLICT), connect.CodeAborted, "conflict"},
		{refusal(shardv1.Code_CODE_FAILED_PRECONDITION), connect.CodeFailedPrecondition, "stale"},
		{refusal(shardv1.Code_CODE_INVALID_ARGUMENT), connect.CodeInvalidArgument, "invalid"},
		{refusal(shardv1.Code_CODE_WRONG_SHARD), connect.CodeUnavailable, "unavailable"},
		{refusal(shardv1.Code_CODE_RESOURCE_EXHAUSTED), connect.CodeResourceExhausted, "exhausted"},
		{refusal(shardv1.Code_CODE_INTERNAL), connect.CodeInternal, "error"},
		{connect.NewError(connect.CodeUnavailable, errors.New("forwarded")), connect.CodeUnavailable, "unavailable"},
		{connect.NewError(connect.CodeAborted, errors.New("forwarded")), connect.CodeAborted, "conflict"},
		{&remoteLeader{node: &placementv1.Node{Id: 2}}, connect.CodeUnavailable, "unavailable"},
		{&shard.FieldError{Field: "resource", Reason: "empty"}, connect.CodeInvalidArgument, "invalid"},
		{context.Canceled, connect.CodeCanceled, "canceled"},
		{errWaitTimedOut, connect.CodeDeadlineExceeded, "timeout"},
		{ErrOutcomeUnknown, connect.CodeUnavailable, "unknown"},
		{ErrNoLeader, connect.CodeUnavailable, "unavailable"},
		{ErrClockUnconfirmed, connect.CodeUnavailable, "unavailable"},
		{errors.New("anything else"), connect.CodeInternal, "error"},
	} {
		if got := connect.CodeOf(toConnect(tc.err)); got != tc.code {
			t.Errorf("%v: code %v, want %v", tc.err, got, tc.code)
		}
		if got := outcome(tc.err); got != tc.label {
			t.Errorf("%v: outcome %q, want %q", tc.err, got, tc.label)
		}
		if unavailable(tc.err) != (tc.code == connect.CodeUnavailable) {
			t.Errorf("%v: unavailable %v with code %v", tc.err, unavailable(tc.err), tc.code)
		}
	}
	if outcome(nil) != "ok" || toConnect(nil) != nil {
		t.Error("nil is not ok")
	}
}

// An internal error reaches the client as an id, never its text; the
// node's log has the text under the same id.
func TestInternalErrorSendsOnlyAnID(t *testing.T) {
	var log bytes.Buffer
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.NewTextHandler(&log, nil)))
	for _, err := range []error{
		errors.New("pebble: /var/lib/warden/sm/shard-1 is corrupt"),
		&resultError{&shardv1.Result{Code: shardv1.Code_CODE_INTERNAL, Reason: "fencing token 7 would not exceed the last token 9"}},
	} {
		log.Reset()
		got := toConnect(err)
		var ce *connect.Error
		if !errors.As(got, &ce) || ce.Code() != connect.CodeInternal {
			t.Fatalf("%v: %v, want internal", err, got)
		}
		if strings.Contains(ce.Message(), "pebble") || strings.Contains(ce.Message(), "token") {
			t.Fatalf("the client got the internal text: %q", ce.Message())
		}
		id := strings.Fields(strings.TrimPrefix(ce.Message(), "internal error "))[0]
		id = strings.TrimSuffix(id, ":")
		if !strings.Contains(log.String(), "error_id="+id) || !strings.Contains(log.String(), err.Error()) {
			t.Fatalf("the log does not hold %v under id %s: %s", err, id, log.String())
		}
	}
}
