package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// errWaitTimedOut: wait_timeout passed without a grant.
var errWaitTimedOut = errors.New("router: waited wait_timeout without a grant")

// leaderPoll is how often a waiting RPC checks that the leader it queued
// through still leads.
const leaderPoll = 250 * time.Millisecond

// awaitGrant waits for the queued request's hand-off. It returns the
// granted lease, or:
//   - errWaitTimedOut when the wait deadline (shard time, Unix ns) passes
//     or the shard dropped the waiter; the waiter is removed by a cancel
//     command, which also releases a grant that raced it;
//   - the context's error when the caller gave up, after the same cancel;
//   - ErrNoLeader when the shard's leader changed: the client retries with
//     the same request_id and finds its place in the queue or its grant.
func (r *Router) awaitGrant(ctx context.Context, sub *subscription, resource, requestID string, deadline int64) (*shardv1.LeaseInfo, error) {
	_, n, t, err := r.route(ctx, resource)
	if err != nil {
		return nil, err
	}
	timer := time.NewTimer(time.Until(time.Unix(0, deadline)))
	defer timer.Stop()
	poll := time.NewTicker(leaderPoll)
	defer poll.Stop()
	for {
		select {
		case ev := <-sub.ch:
			if ev.GetLease() != nil {
				return ev.GetLease(), nil
			}
			return nil, errWaitTimedOut
		case <-timer.C:
			select {
			case ev := <-sub.ch: // granted just in time
				if ev.GetLease() != nil {
					return ev.GetLease(), nil
				}
			default:
			}
			r.cancelWait(resource, requestID)
			return nil, errWaitTimedOut
		case <-ctx.Done():
			r.cancelWait(resource, requestID)
			return nil, ctx.Err()
		case <-poll.C:
			if !r.leads(n, sub.key.shardID, t) {
				return nil, fmt.Errorf("%w: the leader changed while waiting; retry with the same request_id", ErrNoLeader)
			}
		}
	}
}

// cancelWait proposes the removal of an abandoned waiter. If it fails, the
// leader's timer drops the waiter at its deadline, and a lease granted to
// nobody ends with its TTL.
func (r *Router) cancelWait(resource, requestID string) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ProposeTimeout)
	defer cancel()
	_, err := r.propose(ctx, resource, &shardv1.Envelope{Command: &shardv1.Envelope_CancelWait{CancelWait: &shardv1.CancelWaitCmd{
		Resource: resource, RequestId: requestID}}})
	if err != nil {
		r.cfg.Logger.Warn("cancelling an abandoned wait", "resource", resource, "request_id", requestID, "err", err)
	}
}
