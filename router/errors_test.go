package router

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"
	"github.com/lni/dragonboat/v4"
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
