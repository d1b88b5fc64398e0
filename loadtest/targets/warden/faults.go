package warden

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/loadtest/harness"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// SetupQuota implements harness.QuotaTarget: limits on pool-NN and
// pool-NN/tenant-NN.
func (t *Target) SetupQuota(ctx context.Context, pools, tenants int, poolLimit, tenantLimit int64) error {
	set := func(key string, limit int64) error {
		return t.call(ctx, poolOf(key), func(c conn) error {
			_, err := c.quota.SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: key, Limit: limit}))
			return err
		})
	}
	for p := range pools {
		pool := fmt.Sprintf("pool-%02d", p)
		if err := set(pool, poolLimit); err != nil {
			return fmt.Errorf("set limit %s: %w", pool, err)
		}
		for n := range tenants {
			key := fmt.Sprintf("%s/tenant-%02d", pool, n)
			if err := set(key, tenantLimit); err != nil {
				return fmt.Errorf("set limit %s: %w", key, err)
			}
		}
	}
	return nil
}

type reservation struct{ key, id string }

// poolOf is the routing key of a quota key: its pool, the first segment
// (a pool's whole tree lives in one shard).
func poolOf(key string) string {
	pool, _, _ := strings.Cut(key, "/")
	return pool
}

// Reserve implements harness.QuotaTarget; retries keep the reservation id.
func (t *Target) Reserve(ctx context.Context, key string, amount int64, ttl time.Duration) (any, error) {
	req := &wardenv1.ReserveRequest{Key: key, Amount: amount, ReservationId: requestID(), Ttl: durationpb.New(ttl)}
	err := t.call(ctx, poolOf(key), func(c conn) error {
		_, err := c.quota.Reserve(ctx, connect.NewRequest(req))
		return err
	})
	switch {
	case err == nil:
		return reservation{key, req.ReservationId}, nil
	case connect.CodeOf(err) == connect.CodeResourceExhausted:
		return nil, harness.ErrExhausted
	}
	return nil, codeErr(err)
}

// Commit implements harness.QuotaTarget.
func (t *Target) Commit(ctx context.Context, r any) error {
	res := r.(reservation)
	err := t.call(ctx, poolOf(res.key), func(c conn) error {
		_, err := c.quota.Commit(ctx, connect.NewRequest(&wardenv1.CommitRequest{Key: res.key, ReservationId: res.id}))
		return err
	})
	if err != nil {
		return codeErr(err)
	}
	return nil
}

// ReleaseReservation implements harness.QuotaTarget.
func (t *Target) ReleaseReservation(ctx context.Context, r any) error {
	res := r.(reservation)
	err := t.call(ctx, poolOf(res.key), func(c conn) error {
		_, err := c.quota.Release(ctx, connect.NewRequest(&wardenv1.QuotaServiceReleaseRequest{Key: res.key, ReservationId: res.id}))
		return err
	})
	if err != nil {
		return codeErr(err)
	}
	return nil
}

// Fault implements harness.Faulter on a deploy/local cluster:
//   - kill: SIGKILL (cluster.sh kill N) a node that leads no data shard;
//   - kill-leader: SIGKILL the node leading the first shard;
//   - restart: start the killed nodes again (cluster.sh start);
//   - snapshot: AdminService.Snapshot of every shard: each replica takes
//     a snapshot and compacts its Raft log behind it;
//   - transfer-leader: move each shard's leadership to another live replica.
func (t *Target) Fault(ctx context.Context, kind string) error {
	_, err := t.Measure(ctx, kind)
	return err
}

// Measure implements harness.Measurer: a backup says how many shards,
// records and bytes it streamed, and how long it took; a kill, which
// node it killed and which node led the placement group before it.
func (t *Target) Measure(ctx context.Context, kind string) (string, error) {
	switch kind {
	case "backup":
		return t.backup(ctx)
	case "kill", "kill-leader":
		return t.kill(ctx, kind)
	}
	return "", t.fault(ctx, kind)
}

// kill SIGKILLs a node (cluster.sh kill N) for the kill and kill-leader
// faults and says which, and which node led the placement group just
// before: its Raft group elects again when it loses its leader too,
// which a data shard's route does not show.
func (t *Target) kill(ctx context.Context, kind string) (string, error) {
	// The routes say which nodes lead, with no call to a cluster that
	// may be too busy to answer quickly.
	leaders, first, err := t.leaders(ctx)
	if err != nil {
		return "", err
	}
	victim := 0
	for i := range t.cfg.Endpoints {
		n := i + 1
		if t.isKilled(n) {
			continue
		}
		if kind == "kill" && !leaders[n] || kind == "kill-leader" && n == first {
			victim = n
			break
		}
	}
	if victim == 0 {
		return "", fmt.Errorf("%s: no node to kill among %d (leaders %v)", kind, len(t.cfg.Endpoints), leaders)
	}
	placement := "unknown (no node answered ListNodes within 500 ms)"
	lctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	nodes, err := adminCall(lctx, t, func(a wardenv1connect.AdminServiceClient) (*connect.Response[wardenv1.ListNodesResponse], error) {
		return a.ListNodes(lctx, connect.NewRequest(&wardenv1.ListNodesRequest{}))
	})
	cancel()
	if err == nil {
		placement = "unknown to the answering node"
		if id := nodes.GetPlacementLeaderId(); id != 0 {
			placement = fmt.Sprintf("node %d", id)
		}
	}
	if err := t.script(ctx, "kill", strconv.Itoa(victim)); err != nil {
		return "", err
	}
	t.killedMu.Lock()
	t.killed = append(t.killed, victim)
	t.killedMu.Unlock()
	return fmt.Sprintf("killed node %d; placement leader before: %s", victim, placement), nil
}

// backup streams AdminService.Backup from a node into a temporary file
// (written and synced as warden admin backup writes its files, then
// removed), on /dev/shm where there is one: warden admin backup runs on
// another machine than the nodes, and on the one machine of a load test
// a file on the nodes' disk would charge its writeback to their fsyncs.
func (t *Target) backup(ctx context.Context) (string, error) {
	dir := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		dir = "/dev/shm"
	}
	f, err := os.CreateTemp(dir, "warden-load-backup-")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	start := time.Now()
	man, err := adminCall(ctx, t, func(a wardenv1connect.AdminServiceClient) (*connect.Response[wardenv1.BackupManifest], error) {
		if _, err := f.Seek(0, 0); err != nil {
			return nil, err
		}
		stream, err := a.Backup(ctx, connect.NewRequest(&wardenv1.BackupRequest{}))
		if err != nil {
			return nil, err
		}
		defer stream.Close()
		for stream.Receive() {
			if m := stream.Msg().GetManifest(); m != nil {
				return connect.NewResponse(m), f.Sync()
			}
			if _, err := f.Write(stream.Msg().GetData()); err != nil {
				return nil, err
			}
		}
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, errors.New("the backup ended without its manifest")
	})
	if err != nil {
		return "", err
	}
	var records uint64
	var size int64
	for _, s := range man.GetShards() {
		records += s.GetRecords()
		size += s.GetFile().GetSize()
	}
	return fmt.Sprintf("backup of %d shards, %d records, %d bytes in %.2f s", len(man.GetShards()), records, size, time.Since(start).Seconds()), nil
}

// fault injects the faults that say nothing of what they did (Measure
// handles the others).
func (t *Target) fault(ctx context.Context, kind string) error {
	switch kind {
	case "restart":
		if err := t.script(ctx, "start"); err != nil {
			return err
		}
		t.killedMu.Lock()
		t.killed = nil
		t.killedMu.Unlock()
		return nil
	case "snapshot":
		resp, err := adminCall(ctx, t, func(a wardenv1connect.AdminServiceClient) (*connect.Response[wardenv1.SnapshotResponse], error) {
			return a.Snapshot(ctx, connect.NewRequest(&wardenv1.SnapshotRequest{}))
		})
		if err != nil {
			return err
		}
		var errs []error
		for _, s := range resp.GetSnapshots() {
			if s.GetError() != "" && !t.isKilled(int(s.GetNodeId())) {
				errs = append(errs, fmt.Errorf("shard %d node %d: %s", s.GetShardId(), s.GetNodeId(), s.GetError()))
			}
		}
		return errors.Join(errs...)
	case "transfer-leader":
		shards, err := t.shards(ctx)
		if err != nil {
			return err
		}
		for _, s := range shards {
			to := uint64(0)
			for _, r := range s.GetReplicas() {
				if r.GetNodeId() != s.GetLeaderNodeId() && !t.isKilled(int(r.GetNodeId())) {
					to = r.GetNodeId()
					break
				}
			}
			if to == 0 {
				return fmt.Errorf("transfer-leader: shard %d has no other live replica", s.GetId())
			}
			if _, err := adminCall(ctx, t, func(a wardenv1connect.AdminServiceClient) (*connect.Response[wardenv1.TransferLeaderResponse], error) {
				return a.TransferLeader(ctx, connect.NewRequest(&wardenv1.TransferLeaderRequest{ShardId: s.GetId(), NodeId: to}))
			}); err != nil {
				return fmt.Errorf("transfer-leader shard %d to node %d: %w", s.GetId(), to, err)
			}
		}
		return nil
	}
	return fmt.Errorf("fault: unknown kind %q (kill, kill-leader, restart, snapshot, transfer-leader)", kind)
}

// isKilled reports whether a kill fault took node n (1-based) since the
// last restart.
func (t *Target) isKilled(n int) bool {
	t.killedMu.Lock()
	defer t.killedMu.Unlock()
	return slices.Contains(t.killed, n)
}

// leaders returns the nodes (1-based, as cluster.sh numbers them) that
// lead a data shard, and the one that leads the first shard, from the
// cached routes, or from ListShards before the first refresh.
func (t *Target) leaders(ctx context.Context) (map[int]bool, int, error) {
	rs := t.routes.Load()
	if rs == nil || len(*rs) == 0 {
		loaded, err := t.loadRoutes(ctx)
		if err != nil {
			return nil, 0, err
		}
		rs = &loaded
	}
	if len(*rs) == 0 {
		return nil, 0, errors.New("no shard leader known")
	}
	leaders := map[int]bool{}
	for _, r := range *rs {
		leaders[r.endpoint+1] = true
	}
	return leaders, (*rs)[0].endpoint + 1, nil
}

// shards lists the active data shards, the first shard first.
func (t *Target) shards(ctx context.Context) ([]*wardenv1.ShardInfo, error) {
	resp, err := adminCall(ctx, t, func(a wardenv1connect.AdminServiceClient) (*connect.Response[wardenv1.ListShardsResponse], error) {
		return a.ListShards(ctx, connect.NewRequest(&wardenv1.ListShardsRequest{}))
	})
	if err != nil {
		return nil, err
	}
	var out []*wardenv1.ShardInfo
	for _, s := range resp.GetShards() {
		if s.GetState() == "active" {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no active shard")
	}
	return out, nil
}

// adminCall runs f against each live node in turn until one answers.
func adminCall[R any](ctx context.Context, t *Target, f func(wardenv1connect.AdminServiceClient) (*connect.Response[R], error)) (*R, error) {
	var errs []error
	for i, a := range t.admins {
		if t.isKilled(i + 1) {
			continue
		}
		r, err := f(a)
		if err == nil {
			return r.Msg, nil
		}
		errs = append(errs, fmt.Errorf("node %d: %w", i+1, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// script runs the cluster script (with bash) with args and ClusterEnv.
func (t *Target) script(ctx context.Context, args ...string) error {
	if t.cfg.ClusterScript == "" {
		return errors.New("no cluster script configured (--cluster-script)")
	}
	return harness.RunScript(ctx, t.cfg.ClusterScript, t.cfg.ClusterEnv, args...)
}
