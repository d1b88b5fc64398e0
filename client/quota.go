package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// ErrExhausted matches (errors.Is) a Reserve refused for lack of room.
var ErrExhausted = errors.New("warden: quota exhausted")

// ExhaustedError is a refused Reserve: Level is the key of the level
// without room, Reason "LIMIT" (the level's limit has no room) or
// "FAIR_SHARE" (above the fairness threshold, the key's share of its
// parent's limit has none), Remaining the room left there, RetryAfter the time to the nearest expiry under
// that level (0 when none is pending).
type ExhaustedError struct {
	Level      string
	Reason     string
	Remaining  int64
	RetryAfter time.Duration
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("warden: quota exhausted at %s (%s): %d left", e.Level, e.Reason, e.Remaining)
}

// Is makes errors.Is(err, ErrExhausted) true.
func (e *ExhaustedError) Is(target error) bool { return target == ErrExhausted }

// Reservation is capacity held by Reserve until ExpiresAt.
type Reservation struct {
	Key, ID   string
	Amount    int64
	Remaining int64 // room left at the tightest limited level
	ExpiresAt time.Time
}

// ReserveOptions tunes Reserve. Zero values take the defaults.
type ReserveOptions struct {
	// TTL is how long the reservation holds (default: the shard's, 5 min).
	TTL time.Duration
	// ReservationID is the idempotency key (default: a random one). Every
	// retry of the call carries the same id, so a reserve is charged once
	// however often the network loses its answer.
	ReservationID string
}

// SetLimit sets a quota level's limit and fairness weight (0: 1).
func (c *Client) SetLimit(ctx context.Context, key string, limit int64, weight uint32) error {
	return c.retry(ctx, func(ctx context.Context, i int) error {
		_, err := c.quotas[i].SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: key, Limit: limit, Weight: weight}))
		return err
	})
}

// Reserve holds amount on every level of key's path. A refusal for lack
// of room is an *ExhaustedError; a key without any limit is a Connect
// FailedPrecondition error. It retries unavailable answers with the same
// reservation id until ctx ends.
func (c *Client) Reserve(ctx context.Context, key string, amount int64, opts ReserveOptions) (*Reservation, error) {
	id := opts.ReservationID
	if id == "" {
		id = newRequestID()
	}
	req := &wardenv1.ReserveRequest{Key: key, Amount: amount, ReservationId: id}
	if opts.TTL > 0 {
		req.Ttl = durationpb.New(opts.TTL)
	}
	var out *Reservation
	err := c.retry(ctx, func(ctx context.Context, i int) error {
		resp, err := c.quotas[i].Reserve(ctx, connect.NewRequest(req))
		if err != nil {
			return err
		}
		out = &Reservation{Key: key, ID: id, Amount: amount, Remaining: resp.Msg.GetRemaining(), ExpiresAt: resp.Msg.GetExpiresAt().AsTime()}
		return nil
	})
	var ce *connect.Error
	if connect.CodeOf(err) == connect.CodeResourceExhausted && errors.As(err, &ce) {
		for _, d := range ce.Details() {
			if v, derr := d.Value(); derr == nil {
				if qe, ok := v.(*wardenv1.QuotaExhausted); ok {
					return nil, &ExhaustedError{Level: qe.GetLevel(), Reason: qe.GetReason(), Remaining: qe.GetRemaining(), RetryAfter: qe.GetRetryAfter().AsDuration()}
				}
			}
		}
	}
	return out, err
}

// Commit turns the reservation into usage: amount (0: all of it); the
// rest returns. A repeat returns the first commit's amount.
func (c *Client) Commit(ctx context.Context, r *Reservation, amount int64) (committed int64, err error) {
	err = c.retry(ctx, func(ctx context.Context, i int) error {
		resp, err := c.quotas[i].Commit(ctx, connect.NewRequest(&wardenv1.CommitRequest{Key: r.Key, ReservationId: r.ID, Amount: amount}))
		if err == nil {
			committed = resp.Msg.GetCommitted()
		}
		return err
	})
	return committed, err
}

// ReleaseReservation returns the reservation's capacity; false if it was
// unknown, expired or released already (after a retry, possibly by this
// call's own lost first attempt). Releasing a committed one is a Connect
// FailedPrecondition error.
func (c *Client) ReleaseReservation(ctx context.Context, r *Reservation) (released bool, err error) {
	err = c.retry(ctx, func(ctx context.Context, i int) error {
		resp, err := c.quotas[i].Release(ctx, connect.NewRequest(&wardenv1.QuotaServiceReleaseRequest{Key: r.Key, ReservationId: r.ID}))
		if err == nil {
			released = resp.Msg.GetReleased()
		}
		return err
	})
	return released, err
}
