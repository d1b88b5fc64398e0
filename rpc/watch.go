package rpc

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/shard"
)

// Watch implements LockService.Watch on this node's replica of the
// resource's shard (router.WatchLock): any replica serves, since each
// derives the same events at the same positions, so a watch is never
// forwarded.
func (s *LockServer) Watch(ctx context.Context, req *connect.Request[wardenv1.WatchRequest], stream *connect.ServerStream[wardenv1.WatchResponse]) error {
	m := req.Msg
	if err := validateResource(m.GetResource()); err != nil {
		return err
	}
	var from *router.Cursor
	var fromShard uint64
	if m.GetCursor() != "" {
		c, shardID, err := decodeCursor(m.GetCursor())
		if err != nil {
			return err
		}
		from, fromShard = &c, shardID
	}
	err := s.r.WatchLock(ctx, m.GetResource(), fromShard, from, func(it router.WatchItem) error {
		return stream.Send(watchResponse(m.GetResource(), it))
	})
	if errors.Is(err, router.ErrHistoryGone) {
		return s.historyGone(ctx, m.GetResource(), err)
	}
	return err
}

// historyGone is Watch's OUT_OF_RANGE answer to a cursor whose events
// are not kept here, with the resource's current state as its detail.
func (s *LockServer) historyGone(ctx context.Context, resource string, gone error) error {
	e := connect.NewError(connect.CodeOutOfRange, fmt.Errorf("watch %s: %w; describe it again and watch without a cursor", resource, gone))
	if cur, err := s.describe(ctx, &wardenv1.DescribeRequest{Resource: resource}); err == nil {
		e = withDetail(e, cur.Msg)
	}
	return e
}

// watchResponse is a watch item of resource as the API sends it.
func watchResponse(resource string, it router.WatchItem) *wardenv1.WatchResponse {
	if it.Progress {
		return &wardenv1.WatchResponse{Resource: resource, Progress: true, ShardId: it.ShardID, Cursor: encodeCursor(it.ShardID, it.Cursor)}
	}
	e := it.Event
	return &wardenv1.WatchResponse{
		Type: eventTypes[e.Kind], Resource: e.Resource, Holder: e.Holder, FencingToken: e.FencingToken,
		ExpiresAt: timestamp(e.ExpiresAtUnixNano), Initial: it.Initial,
		ShardId: it.ShardID, Index: e.Index, Seq: e.Seq, Cursor: encodeCursor(it.ShardID, it.Cursor),
	}
}

var eventTypes = map[shard.EventKind]wardenv1.LockEventType{
	shard.EventGranted:  wardenv1.LockEventType_LOCK_EVENT_TYPE_GRANTED,
	shard.EventReleased: wardenv1.LockEventType_LOCK_EVENT_TYPE_RELEASED,
	shard.EventExpired:  wardenv1.LockEventType_LOCK_EVENT_TYPE_EXPIRED,
	shard.EventRevoked:  wardenv1.LockEventType_LOCK_EVENT_TYPE_REVOKED,
}

// A cursor is "w1." and the unpadded URL-safe base64 of three uvarints:
// the shard id, the index whose entries the watcher has seen all events
// of, and how many events of the next entry it has seen (router.Cursor).
// The version prefix lets a later format (a prefix watch spanning shards)
// refuse an old cursor by name instead of misreading it.
const cursorPrefix = "w1."

// maxCursorBytes bounds a cursor's encoding: three uvarints.
const maxCursorBytes = 3 * binary.MaxVarintLen64

func encodeCursor(shardID uint64, c router.Cursor) string {
	b := binary.AppendUvarint(nil, shardID)
	b = binary.AppendUvarint(b, c.Index)
	b = binary.AppendUvarint(b, uint64(c.Next))
	return cursorPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// decodeCursor reads a cursor of encodeCursor; anything else is an
// invalid_argument naming the field.
func decodeCursor(s string) (router.Cursor, uint64, error) {
	bad := func(why string) (router.Cursor, uint64, error) {
		return router.Cursor{}, 0, &shard.FieldError{Field: "cursor", Reason: why + " (use a cursor a watch sent, unchanged)"}
	}
	rest, ok := strings.CutPrefix(s, cursorPrefix)
	if !ok {
		return bad("is not a watch cursor of this version")
	}
	if base64.RawURLEncoding.DecodedLen(len(rest)) > maxCursorBytes {
		return bad("is too long")
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return bad("is not base64")
	}
	var v [3]uint64
	for i := range v {
		n := 0
		if v[i], n = binary.Uvarint(b); n <= 0 {
			return bad("is truncated")
		}
		b = b[n:]
	}
	c := router.Cursor{Index: v[1], Next: uint32(v[2])}
	// Only the one encoding of each cursor (no trailing bytes or bits,
	// no overlong varints), so a cursor names one place.
	if len(b) > 0 || v[0] == 0 || v[2] > 1<<32-1 || encodeCursor(v[0], c) != s {
		return bad("is malformed")
	}
	return c, v[0], nil
}
