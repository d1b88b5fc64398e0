package client

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// ErrWatchGap: the cluster no longer keeps the events after the watch's
// cursor (a restart, a trimmed history, a moved range), so it cannot
// resume without a gap. Describe the lock again and watch without a
// cursor; the error's detail (a DescribeResponse) holds the current state.
var ErrWatchGap = errors.New("warden: the watch cannot resume without a gap")

// EventType says what an Event reports.
type EventType string

// The lock event types, as the CLI prints them.
const (
	Granted  EventType = "GRANTED"
	Released EventType = "RELEASED"
	Expired  EventType = "EXPIRED"
	Revoked  EventType = "REVOKED"
)

var eventTypes = map[wardenv1.LockEventType]EventType{
	wardenv1.LockEventType_LOCK_EVENT_TYPE_GRANTED:  Granted,
	wardenv1.LockEventType_LOCK_EVENT_TYPE_RELEASED: Released,
	wardenv1.LockEventType_LOCK_EVENT_TYPE_EXPIRED:  Expired,
	wardenv1.LockEventType_LOCK_EVENT_TYPE_REVOKED:  Revoked,
}

// Event is one change of a watched lock (LockService.Watch): a lease
// granted, released, expired or revoked, with its holder and fencing
// token. It never carries a lease id.
type Event struct {
	Type     EventType
	Resource string
	Holder   string
	Token    uint64
	// ExpiresAt is the lease's expiry on the server's clock as the event
	// left it.
	ExpiresAt time.Time
	// Initial marks the first event of a watch begun without a cursor:
	// the holder at that moment, not a change.
	Initial bool
	// Cursor resumes a watch just after this event (Watch's cursor).
	Cursor string
}

// Watch follows the lock events of resource: without a cursor ("") it
// begins with the current holder, if the lock is held; with the Cursor
// of an earlier Event it begins just after that event. Each event comes
// once, in commit order. When the stream breaks (a node dies, a
// connection drops, the service is unavailable) Watch resumes after the
// last event on the next endpoint, with backoff, so none is lost or
// repeated. It ends with an error (ErrWatchGap, a denial, ctx's end)
// yielded last; stopping the loop ends the watch.
func (c *Client) Watch(ctx context.Context, resource, cursor string) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stopped := false
		err := c.retry(ctx, func(ctx context.Context, i int) error {
			st, err := c.locks[i].Watch(ctx, connect.NewRequest(&wardenv1.WatchRequest{Resource: resource, Cursor: cursor}))
			if err != nil {
				return resumable(err)
			}
			defer st.Close()
			for st.Receive() {
				m := st.Msg()
				if m.GetProgress() { // no event: only a newer place to resume from
					cursor = m.GetCursor()
					continue
				}
				ev := Event{Type: eventTypes[m.GetType()], Resource: m.GetResource(), Holder: m.GetHolder(), Token: m.GetFencingToken(),
					Initial: m.GetInitial(), Cursor: m.GetCursor()}
				if m.GetExpiresAt() != nil {
					ev.ExpiresAt = m.GetExpiresAt().AsTime()
				}
				cursor = ev.Cursor
				if !yield(ev, nil) {
					stopped = true
					return nil
				}
			}
			if err := st.Err(); err != nil {
				return resumable(err)
			}
			// The server ends a watch only with an error: an end without
			// one is a connection that closed.
			return connect.NewError(connect.CodeUnavailable, errors.New("warden: the watch stream ended"))
		})
		if stopped {
			return
		}
		if connect.CodeOf(err) == connect.CodeOutOfRange {
			err = fmt.Errorf("%w: %w", ErrWatchGap, err)
		}
		yield(Event{}, err)
	}
}

// resumable returns err as an Unavailable error (which retry retries)
// when a watch may resume after it. A watch reads only, so a stream that
// failed on the client's side (a connection cut mid-message, which
// Connect reports as a protocol error, not as an answer of the server)
// resumes from its cursor, as after an Unavailable answer. The server's
// own answers (the history is gone, the call refused) and the caller's
// end are final.
func resumable(err error) error {
	ce := new(connect.Error)
	if Retryable(err) || !errors.As(err, &ce) || connect.IsWireError(ce) {
		return err
	}
	switch ce.Code() {
	case connect.CodeCanceled, connect.CodeDeadlineExceeded:
		return err
	}
	return connect.NewError(connect.CodeUnavailable, err)
}
