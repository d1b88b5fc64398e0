package router

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/shard"
)

// QuiescentPlacement reads the placement state, linearizably, until no
// split or move is in progress (a node removal or rebalance may be:
// between its steps the map is whole), for as long as ctx allows.
func (r *Router) QuiescentPlacement(ctx context.Context) (*placementv1.State, error) {
	for {
		st, err := r.meta.Read(ctx)
		if err == nil && placement.RangeOperator(st) == nil {
			return st, nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = fmt.Errorf("operator %d is still in progress", placement.RangeOperator(st).GetId())
			}
			return nil, connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("backup: waiting for a quiet placement map: %w", err))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ExportFrom streams node's replica of shardID through send, chunk by
// chunk, and returns the stream's end, checked against what was sent.
func (r *Router) ExportFrom(ctx context.Context, node *placementv1.Node, shardID uint64, send func([]byte) error) (*placementv1.ExportShardEnd, error) {
	h := sha256.New()
	var size int64
	var end *placementv1.ExportShardEnd
	take := func(m *placementv1.ExportShardResponse) error {
		if end = m.GetEnd(); end != nil {
			if end.GetSize() != size || !slices.Equal(end.GetSha256(), h.Sum(nil)) {
				return fmt.Errorf("export of shard %d: received %d bytes that do not match the %d the node wrote", shardID, size, end.GetSize())
			}
			return nil
		}
		h.Write(m.GetData())
		size += int64(len(m.GetData()))
		return send(m.GetData())
	}
	if n := r.LocalNode(node.GetId()); n != nil {
		if err := ExportLocal(ctx, n, shardID, take); err != nil {
			return nil, err
		}
	} else {
		st, err := r.peers.Get(node.GetListenAddr()).Node.ExportShard(ctx, connect.NewRequest(&placementv1.ExportShardRequest{ShardId: shardID}))
		if err != nil {
			return nil, err
		}
		defer st.Close()
		for end == nil && st.Receive() {
			if err := take(st.Msg()); err != nil {
				return nil, err
			}
		}
		if err := st.Err(); err != nil {
			return nil, err
		}
	}
	if end == nil {
		return nil, fmt.Errorf("export of shard %d from node %d ended without its end", shardID, node.GetId())
	}
	return end, nil
}

// ExportLocal exports local node n's replica of shard id to a file and
// sends it, chunk by chunk, then its end.
func ExportLocal(ctx context.Context, n *LocalNode, id uint64, send func(*placementv1.ExportShardResponse) error) error {
	exp, path, err := exportRetrying(ctx, n, id)
	if err != nil {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("shard %d: export: %w", id, err))
	}
	defer os.Remove(path)
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, backupChunk)
	for {
		k, err := io.ReadFull(f, buf)
		if k > 0 {
			if err := send(&placementv1.ExportShardResponse{Part: &placementv1.ExportShardResponse_Data{Data: buf[:k]}}); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return err
		}
	}
	return send(&placementv1.ExportShardResponse{Part: &placementv1.ExportShardResponse_End{End: &placementv1.ExportShardEnd{
		AppliedIndex: exp.AppliedIndex, Meta: exp.Meta, Pairs: exp.Pairs, Size: exp.Size, Sha256: exp.SHA256}}})
}

// exportTry bounds the wait for one export's read index, and exportTries
// the tries on one replica. A leader drops a follower's ReadIndex while
// it has committed nothing in its own term (just after an election or a
// leader transfer) and does not tell the follower: Dragonboat reports the
// drop only to the leader's own reads. The follower's read would then
// wait out its whole deadline, as a CI backup did for 81 s right after
// the cluster started. Each try asks again; after the last, the caller
// may read another replica (a partitioned one drops every try at once).
// The export that follows a read index is not bounded by the try.
const (
	exportTry   = 5 * time.Second
	exportTries = 3
)

// exportRetrying runs n's export of shard id in up to exportTries tries
// of exportTry, again while its read index is dropped or unanswered (a
// read changes nothing, so asking again is safe) and ctx lasts.
func exportRetrying(ctx context.Context, n *LocalNode, id uint64) (*shard.ExportedSnapshot, string, error) {
	for try := 1; ; try++ {
		tctx, cancel := context.WithTimeout(ctx, exportTry)
		exp, path, err := n.Raft.Export(tctx, id)
		cancel()
		if err == nil || try == exportTries || !errors.Is(err, ErrDropped) && !errors.Is(err, ErrOutcomeUnknown) {
			return exp, path, err
		}
		select {
		case <-ctx.Done():
			return nil, "", fmt.Errorf("%w: %w", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// backupChunk is the size of a backup stream's data messages: 1 MiB,
// well under the 4 MiB a gRPC client accepts by default.
const backupChunk = 1 << 20
