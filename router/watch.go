package router

import (
	"context"
	"fmt"
	"time"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// A lock watch (issue 43, under way; DESIGN.md §2 "Lock events") follows
// one resource's events in the History of a replica of its shard that
// runs here. Any replica serves: each derives the same events at the same
// positions. It begins with the resource's current holder, read
// linearizably together with the index it is current at, or resumes after
// a cursor; either way the events that follow come in commit order, each
// once, with no gap. Where that cannot be promised it ends with
// ErrHistoryGone, never by starting later.

// WatchItem is one message of a lock watch, with the shard and the
// cursor past it: an event of the watched resource; first when a watch
// begins without a cursor, its current holder (Initial, kind
// EventGranted, position of the read's index), or Progress if the lock
// is free; and Progress (no event) whenever watchProgressEvents events
// of other resources passed since the last item, so that the watcher's
// cursor stays within the history.
type WatchItem struct {
	Event    shard.LockEvent
	Initial  bool
	Progress bool
	ShardID  uint64
	Cursor   Cursor
}

// watchProgressEvents is how many events of other resources a watch lets
// pass before it sends a Progress item: well within HistoryKeep, so a
// watcher whose stream breaks resumes without a gap unless that many
// more came meanwhile.
const watchProgressEvents = 256

// ErrWatchMoved: the watched resource's hash range moved to another
// shard (a split or a move); the watch ends as ErrHistoryGone does, with
// the current state read again. (Following the range is still to build.)
var ErrWatchMoved = fmt.Errorf("%w: the resource's range moved to another shard", ErrHistoryGone)

// watchBatch is how many events a watch takes from the history at a time.
const watchBatch = 256

// WatchLock follows resource's lock events, calling emit with each item
// in order until ctx ends or emit fails (its error is returned). With a
// nil from it begins with the current holder; otherwise it resumes after
// *from on shard fromShard. Errors: ErrNoHistory (no replica of the shard
// here, or it stopped), ErrHistoryGone (the events after the cursor are
// not kept here, or another shard has the resource now: read the state
// again), a read's error.
func (r *Router) WatchLock(ctx context.Context, resource string, fromShard uint64, from *Cursor, emit func(WatchItem) error) error {
	rg, err := r.Map().ShardFor(resource)
	if err != nil {
		return err
	}
	shardID := rg.GetShardId()
	if from != nil && fromShard != shardID {
		return fmt.Errorf("%w: the cursor is of shard %d, the resource is on shard %d", ErrWatchMoved, fromShard, shardID)
	}
	n, err := r.historyOf(ctx, shardID)
	if err != nil {
		return err
	}
	cur := from
	if cur == nil {
		item, err := r.watchStart(ctx, n, shardID, resource)
		if err != nil {
			return err
		}
		// Sent either way: a watch that breaks before the lock's first
		// change resumes from this cursor, not from a later read.
		item.Progress = item.Event.Kind == 0
		item.Initial = !item.Progress
		if err := emit(item); err != nil {
			return err
		}
		cur = &item.Cursor
	} else if err := r.watchCursorKnown(ctx, n, shardID, *cur); err != nil {
		return err
	}
	// The replica's meta is looked at every watchMovedLook: once a move
	// fences the resource's range, its events come from another shard.
	look := time.NewTicker(watchMovedLook)
	defer look.Stop()
	passed := 0 // events of other resources since the last item
	for c := *cur; ; {
		evs, next, changed, err := n.History.Since(shardID, c, watchBatch)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.Resource != resource {
				passed++
				continue
			}
			passed = 0
			if err := emit(WatchItem{Event: e, ShardID: shardID, Cursor: After(e)}); err != nil {
				return err
			}
		}
		if next != c {
			c = next
			if passed >= watchProgressEvents {
				passed = 0
				if err := emit(WatchItem{Progress: true, ShardID: shardID, Cursor: c}); err != nil {
					return err
				}
			}
			continue
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-changed:
		case <-look.C:
			meta, err := n.Raft.StaleRead(shardID, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}})
			if err != nil { // the replica stopped: watch again elsewhere
				return fmt.Errorf("%w: shard %d's replica here: %w", ErrNoHistory, shardID, err)
			}
			if !shard.Serves(meta.GetMeta(), resource) {
				return fmt.Errorf("%w: shard %d no longer serves it", ErrWatchMoved, shardID)
			}
		}
	}
}

// watchCursorKnown refuses (ErrHistoryGone) a cursor ahead of the shard's
// log: no watch of this cluster was sent it (another cluster's, one
// recreated or restored since, or forged), and waiting for the log to
// reach it would serve events from a point the client never saw. The
// read is linearizable, so the local replica has applied every entry a
// cursor could have come from.
func (r *Router) watchCursorKnown(ctx context.Context, n *LocalNode, shardID uint64, c Cursor) error {
	out, err := r.readOn(ctx, n, shardID, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}})
	if err != nil {
		return err
	}
	if c.Index >= out.GetAppliedIndex() && (c.Index > out.GetAppliedIndex() || c.Next > 0) {
		return fmt.Errorf("%w: the cursor (index %d) is ahead of shard %d's log (index %d): it is not of this cluster's history", ErrHistoryGone, c.Index, shardID, out.GetAppliedIndex())
	}
	return nil
}

// readOn reads shardID linearizably on n's replica (a follower's read
// asks its leader for the commit index), retrying while Dragonboat drops
// the request.
func (r *Router) readOn(ctx context.Context, n *LocalNode, shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	var out *shardv1.QueryResult
	err := r.retryDropped(ctx, func() error {
		rctx, cancel := context.WithTimeout(ctx, r.cfg.ProposeTimeout)
		defer cancel()
		var err error
		out, err = n.Raft.Read(rctx, shardID, q)
		return err
	})
	return out, err
}

// watchMovedLook is how often a watch looks whether its resource's range
// was fenced for a move (ErrWatchMoved).
const watchMovedLook = 250 * time.Millisecond

// watchStart reads resource's lock on n's replica of shardID
// linearizably, with the index the answer is current at: the holder, if
// any, as an initial item, and the cursor past that index.
func (r *Router) watchStart(ctx context.Context, n *LocalNode, shardID uint64, resource string) (WatchItem, error) {
	out, err := r.readOn(ctx, n, shardID, &shardv1.Query{Query: &shardv1.Query_Describe{Describe: &shardv1.DescribeQuery{Resource: resource}}})
	if err != nil {
		return WatchItem{}, err
	}
	if !shard.Serves(out.GetMeta(), resource) {
		return WatchItem{}, fmt.Errorf("%w: shard %d no longer owns it", ErrWatchMoved, shardID)
	}
	item := WatchItem{ShardID: shardID, Initial: true, Cursor: Through(out.GetAppliedIndex())}
	if l := out.GetLock(); l.GetHeld() {
		item.Event = shard.LockEvent{Index: out.GetAppliedIndex(), Kind: shard.EventGranted, Resource: resource, Holder: l.GetHolder(),
			FencingToken: l.GetFencingToken(), ExpiresAtUnixNano: l.GetExpiresAtUnixNano(), AtUnixNano: out.GetMeta().GetLastNowUnixNano()}
	}
	return item, nil
}

// historyOf returns a local node that keeps a history of shardID. If
// none does yet but the map places a replica of it here (a node that
// started a moment ago), it waits for that replica to open, as long as
// ctx allows. Otherwise: ErrNoHistory.
func (r *Router) historyOf(ctx context.Context, shardID uint64) (*LocalNode, error) {
	for i := range r.nodes {
		if h := r.nodes[i].History; h != nil && h.Has(shardID) {
			return &r.nodes[i], nil
		}
	}
	for _, rep := range r.Map().Shard(shardID).GetReplicas() {
		if n := r.LocalNode(rep.GetNodeId()); n != nil && n.History != nil {
			select {
			case <-n.History.Opened(shardID):
				return n, nil
			case <-ctx.Done():
				return nil, fmt.Errorf("%w: waiting for shard %d's replica here to open: %w", ErrNoHistory, shardID, context.Cause(ctx))
			}
		}
	}
	return nil, fmt.Errorf("%w: shard %d", ErrNoHistory, shardID)
}
