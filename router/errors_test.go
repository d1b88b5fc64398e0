package router

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// What Dragonboat's errors tell the caller: not proposed for lack of time
// is the deadline's error (deadline_exceeded to a client), dropped before
// proposing is ErrNoLeader and worth a retry here (ErrDropped), and a
// timeout after proposing is an unknown outcome.
func TestProposeErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{dragonboat.ErrTimeoutTooSmall, context.DeadlineExceeded},
		{dragonboat.ErrInvalidDeadline, context.DeadlineExceeded},
		{dragonboat.ErrShardNotReady, ErrNoLeader},
		{dragonboat.ErrSystemBusy, ErrNoLeader},
		{dragonboat.ErrTimeout, ErrOutcomeUnknown},
		{context.Canceled, context.Canceled},
	} {
		err := proposeError(tc.err)
		if !errors.Is(err, tc.want) {
			t.Errorf("%v: %v, want %v", tc.err, err, tc.want)
		}
		if dropped := errors.Is(err, ErrDropped); dropped != (tc.err == dragonboat.ErrShardNotReady || tc.err == dragonboat.ErrSystemBusy) {
			t.Errorf("%v: dropped %v", tc.err, dropped)
		}
	}
}

// A range that has not settled by the end of the move wait ends with the
// shard's refusal and where the router's map now puts the key (a negative
// move wait: no time to retry), which the API layer sends as RangeMoved.
func TestRetryMovedSaysWhereTheRangeWent(t *testing.T) {
	m := placement.NewMap(&placementv1.State{
		Nodes:  []*placementv1.Node{{Id: 2, ListenAddr: "10.0.0.2:7070"}},
		Ranges: []*shardv1.RangeDescriptor{{ShardId: 1}},
		Shards: []*placementv1.Shard{{Id: 1, Replicas: []*placementv1.Replica{{ReplicaId: 1, NodeId: 2}}}},
	})
	r := New(nil, nil, m, nil, Config{MoveWait: -time.Second, Logger: slog.New(slog.DiscardHandler)}, NewPeers("", nil))
	_, err := r.retryMoved(context.Background(), "orders/42", func() (*shardv1.Result, error) {
		return &shardv1.Result{Code: shardv1.Code_CODE_WRONG_SHARD, Reason: "the shard no longer owns the resource"}, nil
	})
	var re *ResultError
	if !errors.As(err, &re) || re.Res.GetCode() != shardv1.Code_CODE_WRONG_SHARD {
		t.Fatalf("%v: want the shard's refusal", err)
	}
	if want := (RangeMoved{ShardID: 1}); re.Moved == nil || *re.Moved != want {
		t.Fatalf("moved %v, want %v", re.Moved, want)
	}
}
