package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/shard"
)

// buildBefore returns wardend as it was just before the commit that
// added marker to path, built from this repository's history. It skips
// the test when the history is not there (a shallow clone).
//
// Each such binary is built once per test process (a -count=N run
// reuses it), and ahead of time: the first call starts a background
// worker that builds, one at a time under nice 19, the binaries of
// the later tests in oldBuilds that -run selects, so that they compile
// while the tests before them run their clusters (a build takes about
// 20 s of CPU, a mixed-version test's cluster about 15 s, mostly
// waiting). A test whose binary the worker is still building waits for
// it and raises the build's priority back to normal (as root; CI runs
// as root); one whose build has not begun builds it itself, as before.
func buildBefore(t *testing.T, path, marker string) string {
	t.Helper()
	b := oldBuildOf(path, marker)
	b.run(false)
	if b.skip != "" {
		t.Skip(b.skip)
	}
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.bin
}

// oldBuilds are the binaries the mixed-version tests build, with the
// test that needs each, in the order the tests run (file order), which
// is the order the worker builds them in.
var oldBuilds = []struct{ test, path, marker string }{
	{"TestClusterMixedBinariesAgree", "shard/apply.go", "const CommandVersion = 4"},
	{"TestClusterMixedPlacementAgree", "placement/meta.go", "MetaCommandVersion uint32 = 2"},
	{"TestClusterMixedReplayPrincipal", "shard/apply.go", "VersionPrincipal = 8"},
	{"TestClusterMixedAuthPlacement", "placement/meta.go", "MetaCommandVersion uint32 = 3"},
	{"TestClusterMixedRemoveNode", "placement/meta.go", "MetaCommandVersion uint32 = 5"},
	{"TestClusterMixedRevokeLease", "shard/apply.go", "VersionRevoke = 9"},
	{"TestClusterMixedReleaseReplay", "shard/apply.go", "VersionReleaseReplay = 10"},
	{"TestClusterMixedRestoredPools", "shard/apply.go", "VersionRestoredPools = 11"},
	{"TestClusterMixedOperations", "placement/meta.go", "MetaCommandVersion uint32 = 6"},
}

// oldBuild is one binary of buildBefore: built by the first of the
// worker and the tests to claim it, done when done is closed.
type oldBuild struct {
	path, marker string
	claimed      atomic.Bool
	urgent       atomic.Bool  // a test waits: build at normal priority
	pgid         atomic.Int64 // the running build's process group, 0 when none
	done         chan struct{}
	bin, skip    string
	err          error
}

var oldBuildState struct {
	mu     sync.Mutex
	builds map[string]*oldBuild
	dir    string // holds the sources and binaries; removed by stopOldBuilds
	dirErr error
	start  sync.Once
	ctx    context.Context
	cancel context.CancelFunc
	worker sync.WaitGroup
}

func oldBuildOf(path, marker string) *oldBuild {
	s := &oldBuildState
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.builds == nil {
		s.builds = map[string]*oldBuild{}
	}
	key := path + "\x00" + marker
	if s.builds[key] == nil {
		s.builds[key] = &oldBuild{path: path, marker: marker, done: make(chan struct{})}
	}
	return s.builds[key]
}

// startOldBuilds starts the worker (once): it builds, in oldBuilds'
// order, the binaries of the tests that -run and -skip select and no
// test has begun building.
func startOldBuilds() {
	s := &oldBuildState
	s.start.Do(func() {
		s.ctx, s.cancel = context.WithCancel(context.Background())
		s.dir, s.dirErr = os.MkdirTemp("", "wardend-old-")
		s.worker.Go(func() {
			for _, o := range oldBuilds {
				if s.ctx.Err() != nil {
					return
				}
				if selected(o.test) {
					oldBuildOf(o.path, o.marker).run(true)
				}
			}
		})
	})
}

// stopOldBuilds (TestMain, after the tests) kills a background build
// still running, waits for the worker and removes what it built.
func stopOldBuilds() {
	s := &oldBuildState
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.worker.Wait()
	os.RemoveAll(s.dir)
}

// selected reports whether -test.run and -test.skip let the top-level
// test name run (their first /-separated element; a wrong guess only
// costs a build ahead of time, or a build not ahead of time).
func selected(name string) bool {
	matches := func(flagName string) (match, set bool) {
		f := flag.Lookup(flagName)
		if f == nil || f.Value.String() == "" {
			return false, false
		}
		elems := strings.Split(f.Value.String(), "/")
		if flagName == "test.skip" && len(elems) > 1 {
			return false, false // skips subtests only
		}
		re, err := regexp.Compile(elems[0])
		return err == nil && re.MatchString(name), true
	}
	if m, set := matches("test.run"); set && !m {
		return false
	}
	m, _ := matches("test.skip")
	return !m
}

// run builds b unless the worker or a test has claimed it. A test
// (background unset) waits for the build, raising the worker's to
// normal priority; the worker (background) builds under nice 19, and
// goes on at once past a build a test claimed.
func (b *oldBuild) run(background bool) {
	if !background {
		b.urgent.Store(true)
	}
	mine := b.claimed.CompareAndSwap(false, true)
	if !background {
		startOldBuilds() // after claiming b: the worker passes it
	}
	if mine {
		b.bin, b.skip, b.err = b.build(background)
		close(b.done)
		return
	}
	if background {
		return
	}
	for {
		if pgid := b.pgid.Load(); pgid != 0 {
			_ = syscall.Setpriority(syscall.PRIO_PGRP, int(pgid), 0) // root only
		}
		select {
		case <-b.done:
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (b *oldBuild) build(background bool) (bin, skip string, err error) {
	s := &oldBuildState
	if s.dirErr != nil {
		return "", "", s.dirErr
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Sprintf("no git repository: %v", err), nil
	}
	root := strings.TrimSpace(string(top))
	// -S lists the commits that changed how often marker occurs: the
	// oldest of them added it (later ones may have removed it).
	changed, err := exec.Command("git", "-C", root, "log", "--reverse", "--format=%H", "-S", b.marker, "--", b.path).Output()
	intro, _, _ := strings.Cut(strings.TrimSpace(string(changed)), "\n")
	if err != nil || intro == "" {
		return "", fmt.Sprintf("the commit that added %q to %s is not in the history (shallow clone?): %v", b.marker, b.path, err), nil
	}
	old := intro + "^"
	work, err := os.MkdirTemp(s.dir, "build-")
	if err != nil {
		return "", "", err
	}
	src, tarball := filepath.Join(work, "src"), filepath.Join(work, "old.tar")
	defer os.RemoveAll(src)
	defer os.Remove(tarball)
	if out, err := exec.Command("git", "-C", root, "archive", "-o", tarball, old).CombinedOutput(); err != nil {
		return "", fmt.Sprintf("git archive %s: %v %s", old, err, out), nil
	}
	if err := os.Mkdir(src, 0o755); err != nil {
		return "", "", err
	}
	if out, err := exec.Command("tar", "-xf", tarball, "-C", src).CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("untar: %v %s", err, out)
	}
	bin = filepath.Join(work, "wardend-old")
	args := []string{"go", "build", "-o", bin, "./cmd/wardend"}
	if nice, err := exec.LookPath("nice"); background && !b.urgent.Load() && err == nil {
		args = append([]string{nice, "-n", "19"}, args...)
	}
	build := exec.CommandContext(s.ctx, args[0], args[1:]...)
	build.Dir = src
	// Its own process group: raised in priority, or killed, whole.
	build.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	build.Cancel = func() error { return syscall.Kill(-build.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	build.Stdout, build.Stderr = &out, &out
	if err := build.Start(); err != nil {
		return "", "", fmt.Errorf("building wardend at %s: %v", old, err)
	}
	b.pgid.Store(int64(build.Process.Pid))
	err = build.Wait()
	b.pgid.Store(0)
	if err != nil {
		return "", "", fmt.Errorf("building wardend at %s: %v\n%s", old, err, out.String())
	}
	return bin, "", nil
}

// replicasAgree stops every node (digests) and fails the test unless
// every replica of each shard has applied the same index and holds the
// same state; it returns the shards' ids.
func (c *procCluster) replicasAgree() []uint64 {
	c.t.Helper()
	var ids []uint64
	for _, s := range c.checkShards() {
		ids = append(ids, s.GetId())
	}
	idxs, digs := c.digests(ids...)
	for _, id := range ids {
		for i := range digs[id] {
			if digs[id][i] != digs[id][0] || idxs[id][i] != idxs[id][0] {
				c.t.Fatalf("shard %d's replicas differ: applied %v, digests %v", id, idxs[id], digs[id])
			}
		}
	}
	return ids
}

// digests stops every node gracefully once all replicas of each shard
// in ids have applied the same index, opens each replica's state offline,
// and returns, per shard, each replica's applied index and state digest
// (in node order).
func (c *procCluster) digests(ids ...uint64) (indexes map[uint64][]uint64, digests map[uint64][]string) {
	c.t.Helper()
	replicaOf := map[uint64]map[uint64]uint64{} // shard → node → replica
	for _, s := range c.checkShards() {
		replicaOf[s.GetId()] = map[uint64]uint64{}
		for _, r := range s.GetReplicas() {
			replicaOf[s.GetId()][r.GetNodeId()] = r.GetReplicaId()
		}
	}
	for _, id := range ids {
		deadline := time.Now().Add(30 * time.Second)
		for {
			var seen []uint64
			for _, n := range c.nodes {
				if replicaOf[id][n.id] == 0 {
					continue
				}
				ctx, cancel := rpcCtx()
				resp, err := n.node().AppliedIndex(ctx, connect.NewRequest(&placementv1.AppliedIndexRequest{ShardId: id}))
				cancel()
				if err != nil {
					c.t.Fatalf("node %d applied index of shard %d: %v", n.id, id, err)
				}
				seen = append(seen, resp.Msg.GetIndex())
			}
			if slices.Min(seen) == slices.Max(seen) {
				break
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("shard %d's replicas' applied indexes did not meet: %v", id, seen)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// All at once: stopped one by one, a node took seconds more to stop
	// once another was gone (5.4 s of 6.6, measured).
	for _, n := range c.nodes {
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
	}
	for i, n := range c.nodes {
		err := <-n.exited
		n.cmd = nil
		n.up.Store(false)
		if err != nil {
			c.t.Fatalf("node %d stopping: %v", i+1, err)
		}
	}
	indexes, digests = map[uint64][]uint64{}, map[uint64][]string{}
	for _, id := range ids {
		for _, n := range c.nodes {
			rep := replicaOf[id][n.id]
			if rep == 0 {
				continue
			}
			sm := shard.NewStateMachine(filepath.Join(n.dir, "sm"), shard.Hooks{})(id, rep).(*shard.StateMachine)
			idx, err := sm.Open(nil)
			if err != nil {
				c.t.Fatalf("open node %d's replica of shard %d: %v", n.id, id, err)
			}
			out, err := sm.Lookup(&shardv1.Query{Query: &shardv1.Query_Digest{Digest: &shardv1.DigestQuery{}}})
			sm.Close()
			if err != nil {
				c.t.Fatalf("digest of node %d's replica of shard %d: %v", n.id, id, err)
			}
			indexes[id] = append(indexes[id], idx)
			digests[id] = append(digests[id], fmt.Sprintf("%x", out.(*shardv1.QueryResult).GetDigest()))
		}
	}
	return indexes, digests
}

// A rolling upgrade across the change of what Reserve decides (envelope
// version 4, max-min fair shares). Nodes 1 and 2 run this binary, node 3
// the one before the change: the routers keep proposing version 3, the
// Reserve that only the new rule admits is refused by the old rule
// (FAIR_SHARE, 5 left), and the three replicas hold identical state at
// the same applied index. Node 3 is then upgraded in place: version 4 is
// proposed, the same
// Reserve succeeds, and the replicas again agree. The same goes for
// observed_seq (version 5) and for lowering max_clock_skew, accepted by
// the old rule and refused by version 7's. Had the new binary
// applied the old entries by the new rule, or proposed version 4 to an
// old replica, the digests would differ or node 3 would stop.
func TestClusterMixedBinariesAgree(t *testing.T) {
	t.Parallel()
	old := buildBefore(t, "shard/apply.go", "const CommandVersion = 4")
	c := newProcCluster(t)
	c.bins = map[int]string{2: old}
	c.boot()
	c.waitClockReadings()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := c.nodes[0].quota()
	for _, l := range []struct {
		key   string
		limit int64
	}{{"mix", 10}, {"mix/x", 2}, {"mix/y", 10}} {
		if _, err := q.SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: l.key, Limit: l.limit})); err != nil {
			t.Fatal(err)
		}
	}
	reserve := func(n *node, key, id string, amount int64) error {
		_, err := n.quota().Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: key, Amount: amount, ReservationId: id, Ttl: durationpb.New(time.Hour)}))
		return err
	}
	if err := reserve(c.nodes[0], "mix/x", "x", 2); err != nil {
		t.Fatal(err)
	}
	c.holdMany("mixed", 20, 10*time.Minute)
	for _, n := range c.nodes[:2] { // whichever node leads, it proposes version 3
		err := reserve(n, "mix/y", fmt.Sprintf("y-old-%d", n.id), 8)
		if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "FAIR_SHARE: mix/y has 5 left") {
			t.Fatalf("Reserve(mix/y, 8) via node %d with an old replica: %v, want the old rule's FAIR_SHARE (5 left)", n.id, err)
		}
	}
	// A reconciliation against a ledger sequence needs envelope version
	// 5, which the old replica would stop on: refused, retryably.
	seq := uint64(4)
	report := func(n *node, id string) error {
		_, err := n.quota().ReportUsage(ctx, connect.NewRequest(&wardenv1.ReportUsageRequest{Key: "mix/x", Observed: 2, ReportId: id, Correct: true, ObservedSeq: &seq}))
		return err
	}
	if err := report(c.nodes[0], "rec-old"); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("ReportUsage with observed_seq beside an old replica: %v, want unavailable", err)
	}
	// Lowering max_clock_skew is refused from envelope version 7; beside
	// an old replica the routers propose the old version, whose rule
	// every replica applies alike: the lowering is accepted.
	skew := func(n *node, d time.Duration) error {
		_, err := n.admin.SetShardConfig(ctx, connect.NewRequest(&wardenv1.SetShardConfigRequest{ShardId: 1, MaxClockSkew: durationpb.New(d)}))
		return err
	}
	if err := skew(c.nodes[0], time.Second); err != nil {
		t.Fatalf("raising max_clock_skew: %v", err)
	}
	if err := skew(c.nodes[1], 600*time.Millisecond); err != nil {
		t.Fatalf("lowering max_clock_skew beside an old replica (the old rule): %v", err)
	}
	c.agree("mixed binaries")

	c.upgradeInPlace()
	if err := retryUnavailable(func() error { return reserve(c.nodes[0], "mix/y", "y-new", 8) }); err != nil {
		t.Fatalf("Reserve(mix/y, 8) once every replica applies version 4: %v", err)
	}
	if err := reserve(c.nodes[1], "mix/y", "y-more", 1); connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "LIMIT: mix has 0 left") {
		t.Fatalf("Reserve(mix/y, 1) with mix full: %v, want LIMIT naming mix", err)
	}
	if err := retryUnavailable(func() error { return report(c.nodes[1], "rec-new") }); err != nil {
		t.Fatalf("ReportUsage with observed_seq once every replica applies version 5: %v", err)
	}
	if err := skew(c.nodes[0], 500*time.Millisecond); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "max_clock_skew") {
		t.Fatalf("lowering max_clock_skew once every replica applies version 7: %v, want invalid_argument naming it", err)
	}
	if err := skew(c.nodes[1], 700*time.Millisecond); err != nil {
		t.Fatalf("raising max_clock_skew after the upgrade: %v", err)
	}
	c.agree("upgraded")
}

// agree stops the cluster (digests) and fails the test unless the three
// replicas of shard 1 applied the same index and hold the same state;
// what names the stage in the failure and the log.
func (c *procCluster) agree(what string) {
	c.t.Helper()
	idxs, digs := c.digests(1)
	idx, dig := idxs[1], digs[1]
	if dig[0] != dig[1] || dig[1] != dig[2] || idx[0] != idx[1] || idx[1] != idx[2] {
		c.t.Fatalf("%s: the replicas diverged: applied %v, digests %v", what, idx, dig)
	}
	c.t.Logf("%s: replicas at index %d, digest %s…", what, idx[0], dig[0][:16])
}

// placementDigest reads the placement state from every running node
// (every one the cluster counts up) and returns
// its SHA-256 once all of them agree. ReadMeta is served by the node's
// own replica of the placement group (a linearizable read: the leader
// confirms the index, the local replica answers from its state once it
// has applied it), so equal answers are equal replica states. A command
// committed between the reads makes them differ for a moment; replicas
// that diverged differ for good, and the wait ends in a failure.
func (c *procCluster) placementDigest() (string, *placementv1.State) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var sums []string
		var st *placementv1.State
		for _, n := range c.nodes {
			if !n.up.Load() {
				continue
			}
			var resp *connect.Response[placementv1.ReadMetaResponse]
			err := retryUnavailable(func() (err error) {
				ctx, cancel := rpcCtx()
				defer cancel()
				resp, err = n.node().ReadMeta(ctx, connect.NewRequest(&placementv1.ReadMetaRequest{}))
				return err
			})
			if err != nil {
				c.t.Fatalf("node %d ReadMeta: %v", n.id, err)
			}
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(resp.Msg.GetState())
			if err != nil {
				c.t.Fatal(err)
			}
			sums = append(sums, fmt.Sprintf("%x", sha256.Sum256(b)))
			st = resp.Msg.GetState()
		}
		if len(slices.Compact(slices.Clone(sums))) == 1 {
			return sums[0], st
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the placement replicas' states differ: %v", sums)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A rolling upgrade across placement command version 2 (a split's new
// shard is created with ordered_config_change). Nodes 1 and 2 run this
// binary, node 3 the one before the change: the placement leader stamps
// the split version 1, every replica creates the new shard unordered,
// and the three replicas' placement states are identical. Node 3 is then
// upgraded in place; once it registers version 2, the next split's shard
// is ordered, again on every replica. Had a new replica applied the
// version-1 split by the new rule, or the leader stamped version 2
// beside the old binary (which would refuse it), the states would differ
// or the split would not finish.
func TestClusterMixedPlacementAgree(t *testing.T) {
	t.Parallel()
	old := buildBefore(t, "placement/meta.go", "MetaCommandVersion uint32 = 2")
	c := newProcCluster(t)
	c.bins = map[int]string{2: old}
	c.boot()
	split := func(via int, shardID uint64) uint64 {
		t.Helper()
		var resp *connect.Response[wardenv1.SplitShardResponse]
		err := retryUnavailable(func() (err error) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			resp, err = c.nodes[via].admin.SplitShard(ctx, connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: shardID}))
			return err
		})
		if err != nil {
			t.Fatalf("SplitShard(%d) via node %d: %v", shardID, via+1, err)
		}
		return resp.Msg.GetNewShardId()
	}
	shardOf := func(st *placementv1.State, id uint64) *placementv1.Shard {
		t.Helper()
		for _, s := range st.GetShards() {
			if s.GetId() == id {
				return s
			}
		}
		t.Fatalf("shard %d is not in the placement state", id)
		return nil
	}

	mixed := split(0, 1)
	sum, st := c.placementDigest()
	if s := shardOf(st, mixed); s.GetOrderedConfigChange() {
		t.Fatalf("shard %d, split beside a version-1 binary, is ordered", mixed)
	}
	t.Logf("mixed binaries: placement generation %d, %d shards, digest %s…", st.GetGeneration(), len(st.GetShards()), sum[:16])

	c.upgradeNode3(2)
	upgraded := split(1, mixed)
	sum, st = c.placementDigest()
	if s := shardOf(st, upgraded); !s.GetOrderedConfigChange() {
		t.Fatalf("shard %d, split once every node runs version 2, is not ordered", upgraded)
	}
	if s := shardOf(st, mixed); s.GetOrderedConfigChange() {
		t.Fatalf("shard %d changed its ordered_config_change after creation", mixed)
	}
	t.Logf("upgraded: placement generation %d, %d shards, digest %s…", st.GetGeneration(), len(st.GetShards()), sum[:16])
}

// A rolling upgrade across envelope version 8 (a request id replays only
// to the principal that made it), on a TLS cluster with authentication.
// Nodes 1 and 2 run this binary, node 3 the one before: the routers
// propose the old version without principals, so another principal's
// replay gets the lease back (the old rule) on every replica alike, and
// the three replicas hold identical state. Node 3 upgraded in place, a
// new request replays to its own principal and is refused to another,
// and the replicas agree again. Had the new rule applied to the old
// entries, or principals been proposed beside the old binary, the
// digests would differ.
func TestClusterMixedReplayPrincipal(t *testing.T) {
	t.Parallel()
	old := buildBefore(t, "shard/apply.go", "VersionPrincipal = 8")
	c := newSecureCluster(t)
	c.bins = map[int]string{2: old}
	orders := c.orders
	c.boot()
	c.waitClockReadings()
	acquire := func(cl wardenv1connect.LockServiceClient, resource, reqID string) (*wardenv1.AcquireResponse, error) {
		var resp *connect.Response[wardenv1.AcquireResponse]
		err := retryUnavailable(func() (err error) {
			ctx, cancel := rpcCtx()
			defer cancel()
			resp, err = cl.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: resource, RequestId: reqID, LeaseTtl: durationpb.New(10 * time.Minute)}))
			return err
		})
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	// A new binary leads the shard, so it is a new router that proposes
	// beside the old replica (a leader on node 3 would decide by its own
	// old code alone).
	deadline := time.Now().Add(30 * time.Second)
	for c.leaderIndex("orders/mixed") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("node 1 did not take the shard's leadership")
		}
		ctx, cancel := rpcCtx()
		_, _ = c.nodes[0].admin.TransferLeader(ctx, connect.NewRequest(&wardenv1.TransferLeaderRequest{ShardId: 1, NodeId: 1}))
		cancel()
		time.Sleep(200 * time.Millisecond)
	}
	mine, err := acquire(orders[0], "orders/mixed", "m1")
	if err != nil {
		t.Fatal(err)
	}
	// The old rule: the admin's replay of orders' request gets its lease.
	theirs, err := acquire(c.nodes[1].locks, "orders/mixed", "m1")
	if err != nil || theirs.GetLeaseId() != mine.GetLeaseId() {
		t.Fatalf("another principal's replay beside an old replica: %v, %v; want the old rule's replay", theirs, err)
	}
	c.agree("mixed binaries")

	c.upgradeInPlace()
	mine, err = acquire(orders[0], "orders/upgraded", "u1")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := acquire(orders[2], "orders/upgraded", "u1"); err != nil || again.GetLeaseId() != mine.GetLeaseId() {
		t.Fatalf("orders replays its own request after the upgrade: %v, %v", again, err)
	}
	if _, err := acquire(c.nodes[1].locks, "orders/upgraded", "u1"); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("another principal's replay once every replica applies version 8: %v, want permission_denied", err)
	}
	// The request made under the old rule recorded no principal: no one
	// replays it now.
	if _, err := acquire(orders[0], "orders/mixed", "m1"); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("replaying a request recorded before version 8: %v, want permission_denied", err)
	}
	c.agree("upgraded")
}

// A rolling upgrade across placement command version 3 (the auth state,
// AuthCmd). Nodes 1 and 2 run this binary with --auth-bootstrap, node 3
// the one before (which knows no auth): the bootstrap needs version 3,
// so it is not proposed, the new nodes refuse client calls rather than
// serve them unauthenticated, and the three placement replicas agree
// with no auth state. Node 3 upgraded in place (given the flag too), the
// bootstrap commits, authentication holds, and the replicas agree again.
func TestClusterMixedAuthPlacement(t *testing.T) {
	t.Parallel()
	old := buildBefore(t, "placement/meta.go", "MetaCommandVersion uint32 = 3")
	c := newSecureCluster(t)
	full := c.extra[2]
	c.extra[2] = slices.DeleteFunc(slices.Clone(full), func(a string) bool { return a == "--auth-bootstrap" || strings.HasSuffix(a, "auth.json") })
	c.bins = map[int]string{2: old}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			if n.cmd != nil {
				_ = n.cmd.Process.Kill()
				<-n.exited
			}
		}
	})
	for i := range c.nodes {
		c.start(i)
	}
	// The old node serves without authentication: a call its own replica
	// leads is answered, one it forwards to a new node's is refused while
	// authentication is set up (which of the two depends on where the
	// shard's leader is).
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := rpcCtx()
		_, err := c.nodes[2].locks.Describe(ctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: "probe"}))
		cancel()
		if err == nil || connect.CodeOf(err) == connect.CodeUnavailable && strings.Contains(err.Error(), "being set up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the old node 3 does not answer: %v\n%s", err, c.nodes[2].log.Tail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, i := range []int{0, 1} {
		for {
			ctx, cancel := rpcCtx()
			_, err := c.nodes[i].locks.Describe(ctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: "probe"}))
			cancel()
			if connect.CodeOf(err) == connect.CodeUnavailable && strings.Contains(err.Error(), "being set up") {
				break
			}
			if err == nil {
				t.Fatalf("node %d served a call beside a replica that cannot apply the auth bootstrap", i+1)
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d: %v, want unavailable while auth is set up", i+1, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if _, st := c.placementDigest(); st.GetAuth() != nil {
		t.Fatalf("the auth state beside an old replica: %v, want none", st.GetAuth())
	}

	_ = c.nodes[2].cmd.Process.Signal(syscall.SIGTERM) // node 3 upgraded in place
	<-c.nodes[2].exited
	c.nodes[2].cmd = nil
	c.bins, c.extra[2] = nil, full
	c.start(2)
	for i := range c.nodes {
		c.waitServing(i) // with the admin token: the bootstrap committed
	}
	ctx, cancel := rpcCtx()
	defer cancel()
	if _, err := c.orders[2].Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "payments/1", RequestId: "p1"})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("orders acquires payments/1 after the upgrade: %v, want permission_denied", err)
	}
	if _, st := c.placementDigest(); !st.GetAuth().GetEnabled() || st.GetAuth().GetRevision() == 0 {
		t.Fatalf("the auth state after the upgrade: %v", st.GetAuth())
	}
}

// A rolling upgrade across placement command version 5 (RemoveNodeCmd).
// Nodes 1 and 2 run this binary, node 3 the one before; node 4 joins
// (this binary) with no replica. Removing node 4 is refused up front
// while node 3 registers version 4 (nothing is proposed, and the
// placement replicas agree); node 3 upgraded in place, the removal
// goes through and every placement replica records it alike.
func TestClusterMixedRemoveNode(t *testing.T) {
	t.Parallel()
	old := buildBefore(t, "placement/meta.go", "MetaCommandVersion uint32 = 5")
	c := newProcCluster(t)
	c.bins = map[int]string{2: old}
	c.boot()
	c.join("az1")
	removeAt := func(i int) (*connect.Response[wardenv1.RemoveNodeResponse], error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return c.nodes[i].admin.RemoveNode(ctx, connect.NewRequest(&wardenv1.RemoveNodeRequest{NodeId: 4}))
	}
	// Asked at every new node: whichever leads the placement group (node
	// 3, the old binary, would answer unimplemented), the refusal names
	// the version.
	for _, i := range []int{0, 1, 3} {
		if _, err := removeAt(i); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "version") {
			t.Fatalf("removing node 4 at node %d beside a version 4 binary: %v, want failed_precondition naming the version", i+1, err)
		}
	}
	remove := func() (*connect.Response[wardenv1.RemoveNodeResponse], error) { return removeAt(0) }
	sum, st := c.placementDigest()
	if len(st.GetRemovedNodeIds()) != 0 || !slices.ContainsFunc(st.GetNodes(), func(n *placementv1.Node) bool { return n.GetId() == 4 }) {
		t.Fatalf("a refused removal changed the map: nodes %v, removed %v", st.GetNodes(), st.GetRemovedNodeIds())
	}
	t.Logf("mixed binaries: digest %s…", sum[:16])

	c.upgradeNode3(5)
	if _, err := retryResponse(remove); err != nil {
		t.Fatalf("removing node 4 once every node runs version 5: %v", err)
	}
	c.kill(3) // removed: the placement replicas are on nodes 1 to 3
	c.nodes = c.nodes[:3]
	sum, st = c.placementDigest()
	if !slices.Equal(st.GetRemovedNodeIds(), []uint64{4}) || slices.ContainsFunc(st.GetNodes(), func(n *placementv1.Node) bool { return n.GetId() == 4 }) {
		t.Fatalf("after the removal: nodes %v, removed %v", st.GetNodes(), st.GetRemovedNodeIds())
	}
	t.Logf("upgraded: node 4 removed on every placement replica, digest %s…", sum[:16])
}

// retryResponse runs f until it answers anything but unavailable (a
// placement leader changing after a restart).
func retryResponse[T any](f func() (*connect.Response[T], error)) (*connect.Response[T], error) {
	var resp *connect.Response[T]
	err := retryUnavailable(func() (err error) { resp, err = f(); return err })
	return resp, err
}

// upgradeInPlace starts every node of the stopped cluster (agree stops
// it) on this binary, node 3 upgraded in place with its data, and waits
// until each serves and the clock readings report the versions.
func (c *procCluster) upgradeInPlace() {
	c.t.Helper()
	c.bins = nil
	for i := range c.nodes {
		c.start(i)
	}
	for i := range c.nodes {
		c.waitServing(i)
	}
	c.waitClockReadings()
}

// upgradeNode3 restarts node 3 on this binary (in place, its data kept)
// and waits until the placement state records that it applies placement
// command version v.
func (c *procCluster) upgradeNode3(v uint32) {
	c.t.Helper()
	c.kill(2)
	c.bins = nil
	c.start(2)
	c.waitServing(2)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, st := c.placementDigest()
		if i := slices.IndexFunc(st.GetNodes(), func(n *placementv1.Node) bool { return n.GetId() == 3 }); i >= 0 && st.GetNodes()[i].GetMetaCommandVersion() >= v {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node 3 did not register placement version %d after its upgrade: %v", v, st.GetNodes())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A rolling upgrade across envelope version 9 (RevokeCmd): beside a
// replica of the binary before it, AdminService.RevokeLease is refused
// with FAILED_PRECONDITION naming the upgrade, and the lease stays. Once
// node 3 is upgraded in place, a revoke of the token Describe shows hands
// the lock to the waiter under a larger token, the revoked holder's
// renewal fails, a stale token revokes nothing, and the three replicas
// hold the same state.
func TestClusterMixedRevokeLease(t *testing.T) {
	t.Parallel()
	old := buildBefore(t, "shard/apply.go", "VersionRevoke = 9")
	c := newProcCluster(t)
	c.bins = map[int]string{2: old}
	c.boot()
	c.waitClockReadings()
	acquire := func(n *node, reqID string, wait time.Duration) (*wardenv1.AcquireResponse, error) {
		resp, err := retryResponse(func() (*connect.Response[wardenv1.AcquireResponse], error) {
			ctx, cancel := context.WithTimeout(context.Background(), wait+20*time.Second)
			defer cancel()
			return n.locks.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "revoke/mixed", RequestId: reqID,
				LeaseTtl: durationpb.New(10 * time.Minute), WaitTimeout: durationpb.New(wait), Holder: reqID}))
		})
		return resp.Msg, err
	}
	revoke := func(n *node, token uint64) (*wardenv1.RevokeLeaseResponse, error) {
		ctx, cancel := rpcCtx()
		defer cancel()
		resp, err := n.admin.RevokeLease(ctx, connect.NewRequest(&wardenv1.RevokeLeaseRequest{Resource: "revoke/mixed", FencingToken: token}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	stuck, err := acquire(c.nodes[0], "stuck", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.nodes[:2] {
		if _, err := revoke(n, stuck.GetFencingToken()); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "rolling upgrade") {
			t.Fatalf("RevokeLease via node %d beside an old replica: %v, want failed_precondition naming the upgrade", n.id, err)
		}
	}
	c.agree("mixed binaries")

	c.upgradeInPlace()
	ctx, cancel := rpcCtx()
	d, err := c.nodes[1].locks.Describe(ctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: "revoke/mixed"}))
	cancel()
	if err != nil || !d.Msg.GetHeld() || d.Msg.GetFencingToken() != stuck.GetFencingToken() {
		t.Fatalf("after the upgrade: %v, %v; want the refused revoke to have left the lease held under token %d", d, err, stuck.GetFencingToken())
	}
	next := make(chan *wardenv1.AcquireResponse, 1)
	go func() {
		a, err := acquire(c.nodes[1], "next", 30*time.Second)
		if err != nil {
			t.Error(err)
		}
		next <- a
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := rpcCtx()
		d, err := c.nodes[0].locks.Describe(ctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: "revoke/mixed"}))
		cancel()
		if err == nil && d.Msg.GetWaiters() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second Acquire did not queue: %v, %v", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r, err := revoke(c.nodes[2], stuck.GetFencingToken()+1); err != nil || r.GetRevoked() {
		t.Fatalf("RevokeLease of a token the lock is not held under: %v, %v; want revoked false", r, err)
	}
	var r *wardenv1.RevokeLeaseResponse
	if err := retryUnavailable(func() (err error) { r, err = revoke(c.nodes[2], stuck.GetFencingToken()); return err }); err != nil || !r.GetRevoked() {
		t.Fatalf("RevokeLease after the upgrade: %v, %v; want revoked", r, err)
	}
	got := <-next
	if got.GetFencingToken() <= stuck.GetFencingToken() {
		t.Fatalf("the waiter got token %d after revoking token %d", got.GetFencingToken(), stuck.GetFencingToken())
	}
	ctx, cancel = rpcCtx()
	_, err = c.nodes[0].locks.Renew(ctx, connect.NewRequest(&wardenv1.RenewRequest{Resource: "revoke/mixed", LeaseId: stuck.GetLeaseId()}))
	cancel()
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("the revoked holder's renewal: %v, want failed_precondition (the lease is lost)", err)
	}
	c.agree("upgraded")
}

// A rolling upgrade across envelope version 10 (a repeated Release says
// the lease was already released; reservation ids unique per pool).
// Beside a replica of the binary before it, the routers keep the old
// rules: a repeat of a Release answers plain released false, and a
// second key of a pool takes a reservation_id the first holds; the
// replicas agree. Once node 3 is upgraded in place (its database, which
// the old binary wrote, gets the pool index of ids at open), a repeat
// answers already_released, and an id that a key of the pool holds,
// even one reserved before the upgrade, is refused on another key with
// invalid_argument; the replicas again agree.
func TestClusterMixedReleaseReplay(t *testing.T) {
	t.Parallel()
	old := buildBefore(t, "shard/apply.go", "VersionReleaseReplay = 10")
	c := newProcCluster(t)
	c.bins = map[int]string{2: old}
	c.boot()
	c.waitClockReadings()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	release := func(n *node, reqID string) (first, repeat *wardenv1.ReleaseResponse) {
		t.Helper()
		a, err := retryResponse(func() (*connect.Response[wardenv1.AcquireResponse], error) {
			return n.locks.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "release/mixed", RequestId: reqID, LeaseTtl: durationpb.New(time.Minute)}))
		})
		if err != nil {
			t.Fatal(err)
		}
		var out [2]*wardenv1.ReleaseResponse
		for i := range out {
			r, err := retryResponse(func() (*connect.Response[wardenv1.ReleaseResponse], error) {
				return n.locks.Release(ctx, connect.NewRequest(&wardenv1.ReleaseRequest{Resource: "release/mixed", LeaseId: a.Msg.GetLeaseId()}))
			})
			if err != nil {
				t.Fatal(err)
			}
			out[i] = r.Msg
		}
		return out[0], out[1]
	}
	reserve := func(n *node, key, id string) error {
		return retryUnavailable(func() error {
			_, err := n.quota().Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: key, Amount: 1, ReservationId: id, Ttl: durationpb.New(time.Hour)}))
			return err
		})
	}
	if _, err := c.nodes[0].quota().SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: "ids", Limit: 100})); err != nil {
		t.Fatal(err)
	}
	if first, repeat := release(c.nodes[0], "old"); !first.GetReleased() || repeat.GetReleased() || repeat.GetAlreadyReleased() {
		t.Fatalf("Release and its repeat beside an old replica: %v, %v; want released, then plain false (the old rule)", first, repeat)
	}
	for _, key := range []string{"ids/a", "ids/b"} {
		if err := reserve(c.nodes[1], key, "r-old"); err != nil {
			t.Fatalf("Reserve(%s, r-old) beside an old replica (ids unique per key): %v", key, err)
		}
	}
	c.agree("mixed binaries")

	c.upgradeInPlace()
	if first, repeat := release(c.nodes[1], "new"); !first.GetReleased() || repeat.GetReleased() || !repeat.GetAlreadyReleased() {
		t.Fatalf("Release and its repeat once every replica applies version 10: %v, %v; want released, then already_released", first, repeat)
	}
	if err := reserve(c.nodes[0], "ids/c", "r-new"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ key, id string }{{"ids/d", "r-new"}, {"ids/d", "r-old"}} {
		if err := reserve(c.nodes[2], r.key, r.id); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "reservation_id") {
			t.Fatalf("Reserve(%s, %s), the id held by another key of the pool: %v, want invalid_argument naming reservation_id", r.key, r.id, err)
		}
	}
	if err := reserve(c.nodes[2], "ids/a", "r-old"); err != nil {
		t.Fatalf("a retry of Reserve(ids/a, r-old) on its own key: %v", err)
	}
	c.agree("upgraded")
}

// A restore in the middle of a rolling upgrade across envelope version 11
// (restored pools): the backup's cluster runs this binary, and the
// restored cluster starts with node 2 on the binary before version 11.
// Beside that replica the routers keep the old rule: Reserve in a
// restored pool is granted (the freeze is recorded but only version-11
// entries enforce it) and QuotaService.Unfreeze is refused with
// failed_precondition naming the upgrade; the replicas agree, the
// old binary's pool records keeping the flag it does not know. Once
// node 2 is upgraded in place, Reserve is refused with PoolFrozen until
// Unfreeze, then granted, and the replicas again agree.
func TestClusterMixedRestoredPools(t *testing.T) {
	t.Parallel()
	old := buildBefore(t, "shard/apply.go", "VersionRestoredPools = 11")
	c := newProcCluster(t)
	c.boot()
	reserve := func(c *procCluster, i int, id string) error {
		return call(func(ctx context.Context) error {
			_, err := c.nodes[i].quota().Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: "gpus/team", Amount: 1, ReservationId: id, Ttl: durationpb.New(time.Hour)}))
			return err
		})
	}
	if err := call(func(ctx context.Context) error {
		_, err := c.any().quota().SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: "gpus", Limit: 100}))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := reserve(c, 0, "before-backup"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "backup")
	c.backup(0, dir)
	for i := range c.nodes {
		c.kill(i)
	}

	r := newProcCluster(t)
	r.restore(dir, "--allow-unsigned")
	r.bins = map[int]string{1: old}
	r.boot()
	r.waitClockReadings()
	if err := reserve(r, 1, "beside-old"); err != nil {
		t.Fatalf("Reserve in a restored pool beside a replica older than version 11: %v, want granted (the old rule)", err)
	}
	unfreeze := func() error {
		return call(func(ctx context.Context) error {
			_, err := r.nodes[0].quota().Unfreeze(ctx, connect.NewRequest(&wardenv1.UnfreezeRequest{Pool: "gpus"}))
			return err
		})
	}
	if err := unfreeze(); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("Unfreeze beside a replica older than version 11: %v, want failed_precondition naming the upgrade", err)
	}
	r.agree("mixed binaries")

	r.upgradeInPlace()
	err := reserve(r, 1, "upgraded")
	if frozen := poolFrozen(err); connect.CodeOf(err) != connect.CodeFailedPrecondition || frozen.GetPool() != "gpus" {
		t.Fatalf("Reserve in the restored pool once every replica applies version 11: %v (detail %v), want failed_precondition with PoolFrozen", err, frozen)
	}
	if err := unfreeze(); err != nil {
		t.Fatalf("Unfreeze once every replica applies version 11: %v", err)
	}
	if err := reserve(r, 2, "unfrozen"); err != nil {
		t.Fatalf("Reserve once unfrozen: %v", err)
	}
	r.agree("upgraded")
}
