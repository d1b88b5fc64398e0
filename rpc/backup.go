package rpc

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
)

// ExportShard implements NodeService.ExportShard: it writes this node's
// replica of the shard to a file beside the node's data (a linearizable
// read, so the state holds every entry committed before the call), then
// streams the file and removes it.
func (s *NodeServer) ExportShard(ctx context.Context, req *connect.Request[placementv1.ExportShardRequest], stream *connect.ServerStream[placementv1.ExportShardResponse]) error {
	id := req.Msg.GetShardId()
	n := s.r.ops.HostOf(id)
	if n == nil {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("shard_id: node hosts no replica of shard %d", id))
	}
	return router.ExportLocal(ctx, n, id, stream.Send)
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
func (s *AdminServer) Backup(ctx context.Context, _ *connect.Request[wardenv1.BackupRequest], stream *connect.ServerStream[wardenv1.BackupResponse]) (err error) {
	var cancel context.CancelFunc
	if d, ok := ctx.Deadline(); ok {
		// Give up a tenth earlier than the caller (at most 10 s), so that
		// it hears what the backup waited on rather than its own
		// deadline_exceeded: a CI run saw the CLI's 90 s pass with
		// nothing left on any node to tell why.
		ctx, cancel = context.WithDeadline(ctx, d.Add(-min(time.Until(d)/10, 10*time.Second)))
	} else {
		ctx, cancel = context.WithTimeout(ctx, backupWait)
	}
	defer cancel()
	phase := "waiting for a quiet placement map"
	defer func() {
		if err != nil && ctx.Err() != nil {
			err = connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("backup: gave up %s: %w", phase, err))
		}
	}()
	before, err := s.r.ops.QuiescentPlacement(ctx)
	if err != nil {
		return err
	}
	var idb [16]byte
	_, _ = rand.Read(idb[:])
	man := &wardenv1.BackupManifest{BackupId: hex.EncodeToString(idb[:]), CreatedAt: timestamppb.New(s.r.Now()),
		Generation: before.GetGeneration(), EpochLimit: before.GetEpochLimit(), LastEpoch: before.GetLastEpoch()}
	for _, n := range before.GetNodes() {
		man.Nodes = append(man.Nodes, &wardenv1.BackupNode{Id: n.GetId(), Zone: n.GetZone()})
		if s.r.IsLocal(n.GetId()) {
			man.WardenVersion = n.GetBuildVersion()
		}
	}
	for _, rg := range before.GetRanges() {
		phase = fmt.Sprintf("reading shard %d", rg.GetShardId())
		bs, err := backupShard(ctx, s.r, before, rg.GetShardId(), stream)
		if err != nil {
			return err
		}
		bs.Start, bs.End = rg.GetStart(), rg.GetEnd()
		man.Shards = append(man.Shards, bs)
	}
	phase = "reading the placement map again"
	after, err := s.r.ops.QuiescentPlacement(ctx)
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

// backupShard streams one data shard's file (shard-<id>.snap) from one of
// its replicas, trying each in turn (a local one first) until one
// answers, and returns its manifest entry. A replica that fails after it
// began sending fails the backup: the file is half written.
func backupShard(ctx context.Context, r *node, st *placementv1.State, shardID uint64, out *connect.ServerStream[wardenv1.BackupResponse]) (*wardenv1.BackupShard, error) {
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
		if r.IsLocal(a.GetNodeId()) == r.IsLocal(b.GetNodeId()) {
			return 0
		}
		if r.IsLocal(a.GetNodeId()) {
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
		end, err := r.ops.ExportFrom(ctx, node, shardID, func(data []byte) error {
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
