package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// errWaitTimedOut: wait_timeout passed without a grant.
var ErrWaitTimedOut = errors.New("router: waited wait_timeout without a grant")

// waitPoll is how often a waiting RPC checks that its node still hosts
// a replica of the resource's shard and that the replica knows a leader.
const waitPoll = 100 * time.Millisecond

// WaitRideThrough is how long a waiting RPC keeps waiting while no local
// replica of the shard knows a leader (CheckQuorum makes a leader cut off
// from a quorum step down, and a follower cut off from the leader forgets
// it at its election timeout) before it answers unavailable. Elections
// and leadership transfers are shorter.
const WaitRideThrough = time.Second

// errWaitElsewhere: this node no longer hosts a replica of the waiting
// resource's shard (a move took it, or a split put the resource in a
// shard placed elsewhere), so it would never see the grant applied. The
// Acquire is handed on, with the time it has left, to a node that hosts
// one.
var ErrWaitElsewhere = errors.New("router: this node no longer hosts the resource's shard")

// AwaitGrant waits for the hand-off of queue entry seq of the request. The
// wait is replicated state and every replica applies its grant, so it
// rides through leader changes: the grant is taken from a local replica's
// applied log, whichever replica leads. deadline (shard time, Unix ns)
// is when this attempt stops waiting; placeDeadline is the deadline the
// shard recorded for the waiter (later than deadline for a retry that
// has less time left than the attempt that took the place). It returns
// the granted lease, or:
//   - errWaitTimedOut when the shard dropped the waiter. At deadline the
//     router asks the shard to drop it (DropWaiters, which acts only
//     once the leader's clock has passed the place's deadline and only
//     on a waiter still queued) and takes whichever of the grant and the
//     drop the log applies first, so the answer is the log's. A retry
//     with less time left cancels its place instead, and is told the
//     wait timed out once the cancel has applied (a grant that raced the
//     cancel is released by it), or that the outcome is unknown if the
//     cancel's own outcome is;
//   - the context's error when the caller gave up, after the same cancel
//     (also when the grant arrived just as the caller left);
//   - ErrNoLeader when no local replica has known a leader for
//     waitRideThrough: the client retries with the same request_id and
//     finds its place in the queue or its grant;
//   - errWaitElsewhere when this node stops hosting the shard;
//   - ErrOutcomeUnknown when a later attempt of the request took its place
//     before the grant (the grant is that attempt's).
//
// attempt is this attempt's lease id: a cancel counts only while no later
// attempt of the request has arrived.
func (r *Router) AwaitGrant(ctx context.Context, sub *Subscription, resource, requestID string, attempt []byte, seq uint64, deadline, placeDeadline int64) (*shardv1.LeaseInfo, error) {
	// On this node's clock, as the leader's clock decides the shard's time.
	timer := time.NewTimer(time.Unix(0, deadline).Sub(r.Now()))
	defer timer.Stop()
	poll := time.NewTicker(waitPoll)
	defer poll.Stop()
	outcome := func(ev *shardv1.WaiterEvent) (*shardv1.LeaseInfo, error) {
		if ev.GetLease() == nil {
			return nil, ErrWaitTimedOut
		}
		if a := ev.GetAttemptId(); len(a) > 0 && !bytes.Equal(a, attempt) {
			// A retry of the request took its place before the grant: the
			// grant is the retry's, and its cancel may release it. (Told
			// here, this caller would hold a lease someone else may end.)
			return nil, fmt.Errorf("%w: a later attempt of this request_id took its place in the queue; retry with it to learn the outcome", ErrOutcomeUnknown)
		}
		if ctx.Err() != nil { // granted as the caller left: nobody will get it
			r.CancelWait(resource, requestID, attempt)
			return nil, ctx.Err()
		}
		return ev.GetLease(), nil
	}
	var leaderless time.Time // since when no local replica knows a leader
	for {
		select {
		case <-sub.notify:
			if ev := sub.find(seq); ev != nil {
				return outcome(ev)
			}
		case <-timer.C:
			if ev := sub.find(seq); ev != nil { // granted or dropped just in time
				return outcome(ev)
			}
			if deadline < placeDeadline {
				return nil, r.EndWait(resource, requestID, attempt)
			}
			// Cancelling here raced a grant applied between the look at the
			// subscription and the cancel: the caller was told that its
			// wait timed out while a lease had been granted to it (and then
			// released by the cancel), which Describe showed. The drop, by
			// the leader's clock, comes to the subscription like a grant;
			// until the leader's clock passes the deadline it does nothing,
			// and the router asks again.
			r.dropWaiter(ctx, resource, seq, placeDeadline)
			timer.Reset(waitPoll)
		case <-ctx.Done():
			r.CancelWait(resource, requestID, attempt)
			return nil, ctx.Err()
		case <-poll.C:
			rg, err := r.Map().ShardFor(resource)
			if err != nil {
				return nil, err
			}
			hosted, led := r.replicaView(rg.GetShardId())
			switch {
			case !hosted:
				return nil, ErrWaitElsewhere
			case led:
				leaderless = time.Time{}
			case leaderless.IsZero():
				leaderless = time.Now()
			case time.Since(leaderless) > WaitRideThrough:
				return nil, fmt.Errorf("%w: no replica of shard %d here has known a leader for %v; retry with the same request_id", ErrNoLeader, rg.GetShardId(), WaitRideThrough)
			}
		}
	}
}

// replicaView reports whether a local node hosts a replica of shardID,
// and whether one of them knows the shard's leader.
func (r *Router) replicaView(shardID uint64) (hosted, led bool) {
	for i := range r.nodes {
		id, _, valid, err := r.nodes[i].leaderOf(shardID)
		if err != nil {
			continue
		}
		hosted = true
		if valid && id != 0 {
			led = true
		}
	}
	return hosted, led
}

// CancelWait proposes the removal of an abandoned attempt's waiter (or the
// release of a grant nobody received) and reports whether it applied. If
// it fails, the leader's timer drops the waiter at its deadline, and a
// lease granted to nobody ends with its TTL.
func (r *Router) CancelWait(resource, requestID string, attempt []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ProposeTimeout)
	defer cancel()
	_, err := r.Propose(ctx, resource, &shardv1.Envelope{Command: &shardv1.Envelope_CancelWait{CancelWait: &shardv1.CancelWaitCmd{
		Resource: resource, RequestId: requestID, AttemptId: attempt}}})
	if err != nil {
		r.cfg.Logger.Warn("cancelling an abandoned wait", "resource", resource, "request_id", requestID, "err", err)
	}
	return err
}

// EndWait cancels an attempt whose time to wait is over while its caller
// still listens, and says what to answer: the wait timed out once the
// cancel applied (the place is gone, and a grant that raced the cancel
// was released by it, so no lease is left to the request), or, when the
// cancel's outcome is unknown, that the request's is too.
func (r *Router) EndWait(resource, requestID string, attempt []byte) error {
	if err := r.CancelWait(resource, requestID, attempt); err != nil {
		return fmt.Errorf("%w: the wait timed out, and the cancel of its place did not complete (%v): retry with the same request_id to learn the outcome", ErrOutcomeUnknown, err)
	}
	return ErrWaitTimedOut
}

// dropWaiter asks the shard to drop waiter seq of resource if it still
// waits and the leader's clock has passed deadline, its recorded
// deadline. A failure is left to the caller's next try, the leader's own
// timer and waitRideThrough.
func (r *Router) dropWaiter(ctx context.Context, resource string, seq uint64, deadline int64) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ProposeTimeout)
	defer cancel()
	_, err := r.Propose(ctx, resource, &shardv1.Envelope{Command: &shardv1.Envelope_DropWaiters{DropWaiters: &shardv1.DropWaitersCmd{
		Items: []*shardv1.WaiterRef{{Resource: resource, Seq: seq, DeadlineUnixNano: deadline}}}}})
	if err != nil && ctx.Err() == nil {
		r.cfg.Logger.Debug("dropping a waiter past its deadline", "resource", resource, "seq", seq, "err", err)
	}
}
