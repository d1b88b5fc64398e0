package router

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// backupChunk is the size of a backup stream's data messages: 1 MiB,
// well under the 4 MiB a gRPC client accepts by default.
const backupChunk = 1 << 20

// ExportShard implements NodeService.ExportShard: it writes this node's
// replica of the shard to a file beside the node's data (a linearizable
// read, so the state holds every entry committed before the call), then
// streams the file and removes it.
func (s *NodeServer) ExportShard(ctx context.Context, req *connect.Request[placementv1.ExportShardRequest], stream *connect.ServerStream[placementv1.ExportShardResponse]) error {
	id := req.Msg.GetShardId()
	n := s.r.hostOf(id)
	if n == nil {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("shard_id: node hosts no replica of shard %d", id))
	}
	return exportLocal(ctx, n, id, stream.Send)
}

// exportLocal exports local node n's replica of shard id to a file and
// sends it, chunk by chunk, then its end.
func exportLocal(ctx context.Context, n *LocalNode, id uint64, send func(*placementv1.ExportShardResponse) error) error {
	exp, path, err := n.raft.export(ctx, id)
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

// hostOf returns the local node that runs a replica of shardID, or nil.
func (r *Router) hostOf(shardID uint64) *LocalNode {
	for i := range r.nodes {
		if _, _, _, err := r.nodes[i].raft.leaderOf(shardID); err == nil {
			return &r.nodes[i]
		}
	}
	return nil
}

// localNode returns local node id, or nil.
func (r *Router) localNode(id uint64) *LocalNode {
	for i := range r.nodes {
		if r.nodes[i].id == id {
			return &r.nodes[i]
		}
	}
	return nil
}

// backupWait bounds the wait for operators in progress to end before a
// backup starts, when the call has no deadline of its own.
const backupWait = 10 * time.Minute

// Backup implements AdminService.Backup. A split or move in progress is
// waited out first; each data shard is then read on one of its replicas
// (one on this node if there is one, so a backup through a node of a
// three-node cluster reads locally), and the placement state read again
// at the end, once no split or move is in progress: if a split began in
// between, the shards may not match one map, and the backup fails
// (ABORTED) rather than record a mix. Moves (a node removal's steps) only
// change replicas, and a job in progress is left out of the restore.
func (s *AdminServer) Backup(ctx context.Context, _ *connect.Request[wardenv1.BackupRequest], stream *connect.ServerStream[wardenv1.BackupResponse]) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, backupWait)
		defer cancel()
	}
	before, err := s.r.quiescentPlacement(ctx)
	if err != nil {
		return err
	}
	var idb [16]byte
	_, _ = rand.Read(idb[:])
	man := &wardenv1.BackupManifest{BackupId: hex.EncodeToString(idb[:]), CreatedAt: timestamppb.New(s.r.now()),
		Generation: before.GetGeneration(), EpochLimit: before.GetEpochLimit(), LastEpoch: before.GetLastEpoch()}
	for _, n := range before.GetNodes() {
		man.Nodes = append(man.Nodes, &wardenv1.BackupNode{Id: n.GetId(), Zone: n.GetZone()})
		if s.r.isLocal(n.GetId()) {
			man.WardenVersion = n.GetBuildVersion()
		}
	}
	for _, rg := range before.GetRanges() {
		bs, err := s.r.backupShard(ctx, before, rg.GetShardId(), stream)
		if err != nil {
			return err
		}
		bs.Start, bs.End = rg.GetStart(), rg.GetEnd()
		man.Shards = append(man.Shards, bs)
	}
	after, err := s.r.quiescentPlacement(ctx)
	if err != nil {
		return err
	}
	if !placement.NoSplitSince(after, before.GetNextOperatorId()) || after.GetGeneration() != before.GetGeneration() {
		return connect.NewError(connect.CodeAborted, fmt.Errorf("a split began while the shards were read (operator %d or later): take the backup again", before.GetNextOperatorId()))
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(after)
	if err != nil {
		return err
	}
	h := sha256.Sum256(b)
	man.Placement = &wardenv1.BackupFile{Name: "placement.pb", Size: int64(len(b)), Sha256: h[:]}
	for _, m := range []*wardenv1.BackupResponse{
		{Part: &wardenv1.BackupResponse_File{File: &wardenv1.BackupFileStart{Name: man.Placement.GetName()}}},
		{Part: &wardenv1.BackupResponse_Data{Data: b}},
		{Part: &wardenv1.BackupResponse_End{End: man.Placement}},
		{Part: &wardenv1.BackupResponse_Manifest{Manifest: man}},
	} {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	return nil
}

// quiescentPlacement reads the placement state, linearizably, until no
// split or move is in progress (a node removal or rebalance may be:
// between its steps the map is whole), for as long as ctx allows.
func (r *Router) quiescentPlacement(ctx context.Context) (*placementv1.State, error) {
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

// backupShard streams one data shard's file (shard-<id>.snap) from one of
// its replicas, trying each in turn (a local one first) until one
// answers, and returns its manifest entry. A replica that fails after it
// began sending fails the backup: the file is half written.
func (r *Router) backupShard(ctx context.Context, st *placementv1.State, shardID uint64, out *connect.ServerStream[wardenv1.BackupResponse]) (*wardenv1.BackupShard, error) {
	m := placement.NewMap(st)
	s := m.Shard(shardID)
	if s == nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("shard %d owns a range but is not in the map", shardID))
	}
	name := fmt.Sprintf("shard-%d.snap", shardID)
	if err := out.Send(&wardenv1.BackupResponse{Part: &wardenv1.BackupResponse_File{File: &wardenv1.BackupFileStart{Name: name}}}); err != nil {
		return nil, err
	}
	replicas := slices.Clone(s.GetReplicas())
	slices.SortStableFunc(replicas, func(a, b *placementv1.Replica) int {
		if r.isLocal(a.GetNodeId()) == r.isLocal(b.GetNodeId()) {
			return 0
		}
		if r.isLocal(a.GetNodeId()) {
			return -1
		}
		return 1
	})
	var errs []error
	for _, rep := range replicas {
		node := m.Node(rep.GetNodeId())
		if node == nil {
			continue
		}
		sent := false
		end, err := r.exportFrom(ctx, node, shardID, func(data []byte) error {
			sent = true
			return out.Send(&wardenv1.BackupResponse{Part: &wardenv1.BackupResponse_Data{Data: data}})
		})
		if err == nil {
			file := &wardenv1.BackupFile{Name: name, Size: end.GetSize(), Sha256: end.GetSha256()}
			if err := out.Send(&wardenv1.BackupResponse{Part: &wardenv1.BackupResponse_End{End: file}}); err != nil {
				return nil, err
			}
			return &wardenv1.BackupShard{ShardId: shardID, Epoch: end.GetMeta().GetEpoch(), Revision: end.GetMeta().GetRevision(),
				AppliedIndex: end.GetAppliedIndex(), NodeId: node.GetId(), Records: end.GetPairs(), File: file}, nil
		}
		if sent || ctx.Err() != nil {
			return nil, fmt.Errorf("shard %d from node %d: %w", shardID, node.GetId(), err)
		}
		errs = append(errs, fmt.Errorf("node %d: %w", node.GetId(), err))
	}
	return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("shard %d: no replica could be read: %w", shardID, errors.Join(errs...)))
}

// exportFrom streams node's replica of shardID through send, chunk by
// chunk, and returns the stream's end, checked against what was sent.
func (r *Router) exportFrom(ctx context.Context, node *placementv1.Node, shardID uint64, send func([]byte) error) (*placementv1.ExportShardEnd, error) {
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
	if n := r.localNode(node.GetId()); n != nil {
		if err := exportLocal(ctx, n, shardID, take); err != nil {
			return nil, err
		}
	} else {
		st, err := r.peers.get(node.GetListenAddr()).node.ExportShard(ctx, connect.NewRequest(&placementv1.ExportShardRequest{ShardId: shardID}))
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
