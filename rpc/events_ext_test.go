package rpc_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/server"
	"github.com/warden-dev/warden/shard"
)

// Every replica derives the same lock events at the same positions
// (DESIGN.md §2 "Lock events"), and each node's History keeps its own
// replica's: a grant, a release, a grant and an expiry by the leader's
// timer, read from the three nodes' histories, are the same list on all.
func TestReplicasReportTheSameLockEvents(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	const resource = "events/r"
	rng, err := c.dev.Router.Map().ShardFor(resource)
	if err != nil {
		t.Fatal(err)
	}
	a := c.mustAcquire(resource, "a", 10*time.Second)
	if ok, err := c.release(resource, a.GetLeaseId()); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	b := c.mustAcquire(resource, "b", time.Second) // left to expire
	want := []string{
		fmt.Sprintf("GRANTED %d", a.GetFencingToken()),
		fmt.Sprintf("RELEASED %d", a.GetFencingToken()),
		fmt.Sprintf("GRANTED %d", b.GetFencingToken()),
		fmt.Sprintf("EXPIRED %d", b.GetFencingToken()),
	}
	var lists [][]shard.LockEvent
	for i, n := range c.dev.Nodes {
		evs := eventsOf(t, n.History, rng.GetShardId(), resource, len(want))
		var got []string
		for _, e := range evs {
			got = append(got, fmt.Sprintf("%s %d", e.Kind, e.FencingToken))
		}
		if !slices.Equal(got, want) {
			t.Fatalf("node %d's history of %s: %v, want %v", i+1, resource, got, want)
		}
		lists = append(lists, evs)
	}
	for i := range lists[1:] {
		if !slices.Equal(lists[i+1], lists[0]) {
			t.Fatalf("node %d's events differ from node 1's:\n%+v\n%+v", i+2, lists[i+1], lists[0])
		}
	}
}

// eventsOf follows h's events of shardID from its start until n of them
// are resource's, and returns those.
func eventsOf(t *testing.T, h *router.History, shardID uint64, resource string, n int) []shard.LockEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []shard.LockEvent
	cur := router.Through(0) // a new cluster's replicas open at index 0
	for len(out) < n {
		evs, next, changed, err := h.Since(shardID, cur, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Resource == resource {
				out = append(out, e)
			}
		}
		if next == cur {
			select {
			case <-changed:
			case <-ctx.Done():
				t.Fatalf("%d events of %s after 20 s, want %d: %+v", len(out), resource, n, out)
			}
		}
		cur = next
	}
	return out
}

// A lock watch (router.WatchLock) begins with the current holder, then
// reports each change in commit order, once; resumed after any item's
// cursor it reports exactly what followed that item; and after the
// nodes restart, a cursor from before their state was loaded is refused
// (ErrHistoryGone), never served from a later point.
func TestWatchLockFollowsAndResumes(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	const resource = "events/w"
	a := c.mustAcquire(resource, "a", 10*time.Second)

	items := make(chan router.WatchItem, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	watch := func(ctx context.Context, shardID uint64, from *router.Cursor) chan error {
		done := make(chan error, 1)
		go func() {
			done <- c.dev.Router.WatchLock(ctx, resource, shardID, from, func(it router.WatchItem) error {
				items <- it
				return nil
			})
		}()
		return done
	}
	next := func(what string) router.WatchItem {
		t.Helper()
		select {
		case it := <-items:
			return it
		case <-ctx.Done():
			t.Fatalf("no %s within 20 s", what)
		}
		return router.WatchItem{}
	}
	wctx, stop := context.WithCancel(ctx)
	done := watch(wctx, 0, nil)
	first := next("initial holder")
	if !first.Initial || first.Progress || first.Event.Kind != shard.EventGranted || first.Event.FencingToken != a.GetFencingToken() {
		t.Fatalf("first item %+v, want the holder with token %d", first, a.GetFencingToken())
	}
	if ok, err := c.release(resource, a.GetLeaseId()); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	b := c.mustAcquire(resource, "b", 10*time.Second)
	want := []string{fmt.Sprintf("RELEASED %d", a.GetFencingToken()), fmt.Sprintf("GRANTED %d", b.GetFencingToken())}
	var followed []router.WatchItem
	for range want {
		followed = append(followed, next("event"))
	}
	if got := kinds(followed); !slices.Equal(got, want) {
		t.Fatalf("watched %v, want %v", got, want)
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the watch ended with %v, want its context's cancel", err)
	}

	// Resumed after each item, it reports what followed that item.
	for i, from := range append([]router.WatchItem{first}, followed[:1]...) {
		wctx, stop := context.WithCancel(ctx)
		done := watch(wctx, from.ShardID, &from.Cursor)
		var got []router.WatchItem
		for range followed[i:] {
			got = append(got, next("resumed event"))
		}
		if !slices.Equal(kinds(got), kinds(followed[i:])) || got[0].Event != followed[i].Event {
			t.Fatalf("resumed after item %d: %v, want %v", i, kinds(got), kinds(followed[i:]))
		}
		stop()
		<-done
	}

	c.restart()
	err := <-watch(ctx, first.ShardID, &first.Cursor)
	if !errors.Is(err, router.ErrHistoryGone) || errors.Is(err, router.ErrWatchMoved) {
		t.Fatalf("a cursor from before the restart: %v, want ErrHistoryGone", err)
	}
}

func kinds(items []router.WatchItem) []string {
	var out []string
	for _, it := range items {
		out = append(out, fmt.Sprintf("%s %d", it.Event.Kind, it.Event.FencingToken))
	}
	return out
}

// LockService.Watch over Connect: the holder first, then each change with
// a cursor that resumes just after it; a bad cursor is an
// invalid_argument naming the field; a cursor from before a restart is
// OUT_OF_RANGE with the current state as its detail.
func TestWatchOverConnect(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	const resource = "events/connect"
	a := c.mustAcquire(resource, "a", 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open := func(cursor string) *connect.ServerStreamForClient[wardenv1.WatchResponse] {
		t.Helper()
		st, err := c.locks.Watch(ctx, connect.NewRequest(&wardenv1.WatchRequest{Resource: resource, Cursor: cursor}))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	receive := func(st *connect.ServerStreamForClient[wardenv1.WatchResponse]) *wardenv1.WatchResponse {
		t.Helper()
		if !st.Receive() {
			t.Fatalf("the watch ended: %v", st.Err())
		}
		return st.Msg()
	}
	st := open("")
	first := receive(st)
	if !first.GetInitial() || first.GetType() != wardenv1.LockEventType_LOCK_EVENT_TYPE_GRANTED || first.GetFencingToken() != a.GetFencingToken() || first.GetCursor() == "" {
		t.Fatalf("first event %v, want the holder with token %d", first, a.GetFencingToken())
	}
	if ok, err := c.release(resource, a.GetLeaseId()); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	b := c.mustAcquire(resource, "b", 10*time.Second)
	rel, gr := receive(st), receive(st)
	if rel.GetType() != wardenv1.LockEventType_LOCK_EVENT_TYPE_RELEASED || rel.GetFencingToken() != a.GetFencingToken() ||
		gr.GetType() != wardenv1.LockEventType_LOCK_EVENT_TYPE_GRANTED || gr.GetFencingToken() != b.GetFencingToken() || gr.GetInitial() {
		t.Fatalf("events %v then %v", rel, gr)
	}
	if rel.GetIndex() < first.GetIndex() || gr.GetIndex() < rel.GetIndex() {
		t.Fatalf("positions go back: %d, %d, %d", first.GetIndex(), rel.GetIndex(), gr.GetIndex())
	}
	st.Close()

	// Resumed after the release, the next event is the grant.
	st = open(rel.GetCursor())
	if got := receive(st); got.GetType() != gr.GetType() || got.GetFencingToken() != gr.GetFencingToken() || got.GetCursor() != gr.GetCursor() {
		t.Fatalf("resumed after the release: %v, want %v", got, gr)
	}
	st.Close()

	st = open("w1.not-a-cursor")
	if st.Receive() || connect.CodeOf(st.Err()) != connect.CodeInvalidArgument || !strings.Contains(st.Err().Error(), "cursor") {
		t.Fatalf("a bad cursor: %v, want invalid_argument naming cursor", st.Err())
	}

	c.restart()
	st, err := c.locks.Watch(ctx, connect.NewRequest(&wardenv1.WatchRequest{Resource: resource, Cursor: rel.GetCursor()}))
	if err != nil {
		t.Fatal(err)
	}
	if st.Receive() || connect.CodeOf(st.Err()) != connect.CodeOutOfRange {
		t.Fatalf("a cursor from before the restart: %v, want out_of_range", st.Err())
	}
	var ce *connect.Error
	if !errors.As(st.Err(), &ce) {
		t.Fatal(st.Err())
	}
	var state *wardenv1.DescribeResponse
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			state, _ = v.(*wardenv1.DescribeResponse)
		}
	}
	if !state.GetHeld() || state.GetFencingToken() != b.GetFencingToken() {
		t.Fatalf("out_of_range's state %v, want held with token %d", state, b.GetFencingToken())
	}
}

// A watch ends when the replica serving it stops (router.History.Close:
// a move took it away, or its node stops), and its cursor resumes on
// another replica, which derived the same events: nothing lost.
func TestWatchResumesOnAnotherReplica(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	const resource = "events/replica"
	a := c.mustAcquire(resource, "a", 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	items := make(chan router.WatchItem, 16)
	watch := func(shardID uint64, from *router.Cursor) chan error {
		done := make(chan error, 1)
		go func() {
			done <- c.dev.Router.WatchLock(ctx, resource, shardID, from, func(it router.WatchItem) error {
				items <- it
				return nil
			})
		}()
		return done
	}
	done := watch(0, nil)
	var first router.WatchItem
	select {
	case first = <-items:
	case err := <-done:
		t.Fatalf("the watch ended: %v", err)
	}
	// The first local node with a history serves it: node 1's replica.
	c.stopReplica(0)
	select {
	case err := <-done:
		if !errors.Is(err, router.ErrNoHistory) {
			t.Fatalf("the watch ended with %v, want ErrNoHistory when its replica stopped", err)
		}
	case <-ctx.Done():
		t.Fatal("the watch went on after its replica stopped")
	}
	if ok, err := c.release(resource, a.GetLeaseId()); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	b := c.mustAcquire(resource, "b", 10*time.Second)
	done = watch(first.ShardID, &first.Cursor)
	var got []router.WatchItem
	for len(got) < 2 {
		select {
		case it := <-items:
			got = append(got, it)
		case err := <-done:
			t.Fatalf("the resumed watch ended: %v", err)
		case <-ctx.Done():
			t.Fatalf("resumed on another replica: %v after 20 s", kinds(got))
		}
	}
	want := []string{fmt.Sprintf("RELEASED %d", a.GetFencingToken()), fmt.Sprintf("GRANTED %d", b.GetFencingToken())}
	if !slices.Equal(kinds(got), want) {
		t.Fatalf("resumed on another replica: %v, want %v", kinds(got), want)
	}
	cancel()
	<-done
}

// A watcher of a quiet lock on a busy shard gets progress messages, so
// its cursor stays within what the node keeps: after 1,500 events of
// other resources it resumes from its last message, while its first
// cursor is gone by then (the premise: without progress it would have
// had to start again). An attack found such a watcher lost after three
// batches of other resources.
func TestWatchProgressKeepsCursorsResumable(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	const resource = "events/quiet"
	a := c.mustAcquire(resource, "a", time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := c.locks.Watch(ctx, connect.NewRequest(&wardenv1.WatchRequest{Resource: resource}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() || !st.Msg().GetInitial() {
		t.Fatalf("no initial holder: %v", st.Err())
	}
	first := st.Msg().GetCursor()
	for b := range 3 {
		req := &wardenv1.BatchRequest{}
		for i := range 500 {
			req.Ops = append(req.Ops, acquireOp(fmt.Sprintf("events/busy-%d-%d", b, i), fmt.Sprintf("q-%d-%d", b, i)))
		}
		if _, err := c.locks.Batch(ctx, connect.NewRequest(req)); err != nil {
			t.Fatal(err)
		}
	}
	last, progress := first, 0
	for progress < 1500/256 {
		if !st.Receive() {
			t.Fatalf("after %d progress messages: %v", progress, st.Err())
		}
		m := st.Msg()
		if !m.GetProgress() || m.GetType() != wardenv1.LockEventType_LOCK_EVENT_TYPE_UNSPECIFIED || m.GetResource() != resource {
			t.Fatalf("a message of a quiet lock: %v, want progress", m)
		}
		last, progress = m.GetCursor(), progress+1
	}
	st.Close()

	resumed, err := c.locks.Watch(ctx, connect.NewRequest(&wardenv1.WatchRequest{Resource: resource, Cursor: last}))
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close()
	if ok, err := c.release(resource, a.GetLeaseId()); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	for resumed.Receive() && resumed.Msg().GetProgress() {
	}
	if m := resumed.Msg(); resumed.Err() != nil || m.GetType() != wardenv1.LockEventType_LOCK_EVENT_TYPE_RELEASED || m.GetFencingToken() != a.GetFencingToken() {
		t.Fatalf("resumed after the last progress: %v %v, want the release", m, resumed.Err())
	}
	gone, err := c.locks.Watch(ctx, connect.NewRequest(&wardenv1.WatchRequest{Resource: resource, Cursor: first}))
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	if gone.Receive() || connect.CodeOf(gone.Err()) != connect.CodeOutOfRange {
		t.Fatalf("the first cursor, 1,500 events back: %v, want out_of_range", gone.Err())
	}
}

// A cursor ahead of the shard's log (another cluster's, one recreated
// since, or forged) is refused with out_of_range at once, never waited
// on until the log reaches it and then served from there.
func TestWatchRefusesACursorAheadOfTheLog(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, pos := range [][2]uint64{{1_000_000, 0}, {1<<64 - 1, 0}} {
		b := binary.AppendUvarint(nil, shardID)
		b = binary.AppendUvarint(b, pos[0])
		b = binary.AppendUvarint(b, pos[1])
		cursor := "w1." + base64.RawURLEncoding.EncodeToString(b)
		st, err := c.locks.Watch(ctx, connect.NewRequest(&wardenv1.WatchRequest{Resource: "events/ahead", Cursor: cursor}))
		if err != nil {
			t.Fatal(err)
		}
		if st.Receive() || connect.CodeOf(st.Err()) != connect.CodeOutOfRange {
			t.Fatalf("cursor at index %d: %v, want out_of_range", pos[0], st.Err())
		}
		st.Close()
	}
	// Without a cursor, the free lock's watch begins with a progress
	// message: a cursor, no event.
	st, err := c.locks.Watch(ctx, connect.NewRequest(&wardenv1.WatchRequest{Resource: "events/ahead"}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() || !st.Msg().GetProgress() || st.Msg().GetInitial() || st.Msg().GetCursor() == "" {
		t.Fatalf("a watch of a free lock began with %v (%v), want progress with a cursor", st.Msg(), st.Err())
	}
}
