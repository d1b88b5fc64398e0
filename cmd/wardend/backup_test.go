package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/internal/ledgertest"
	"github.com/warden-dev/warden/keyspace"
	"github.com/warden-dev/warden/placement"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/shard"
)

// tokens records every fencing token and lease id a test saw issued.
type tokens struct {
	mu      sync.Mutex
	highest uint64
	leases  map[string]bool
}

func (k *tokens) add(a *wardenv1.AcquireResponse) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.highest = max(k.highest, a.GetFencingToken())
	k.leases[a.GetLeaseId()] = true
}

var cycleSeq atomic.Int64 // request ids of cycles, unique in the test process

// cycles runs n acquire/release cycles over resources prefix1..prefix10
// through every node in turn, recording each grant in k.
func (c *procCluster) cycles(k *tokens, prefix string, n int) {
	c.t.Helper()
	for i := range n {
		r := fmt.Sprintf("%s%d", prefix, i%10+1)
		var a *wardenv1.AcquireResponse
		if err := retryUnavailable(func() (err error) {
			a, err = c.nodes[i%len(c.nodes)].acquire(r, fmt.Sprintf("cycle-%d", cycleSeq.Add(1)), 10*time.Second, 0)
			return err
		}); err != nil {
			c.t.Fatalf("cycle %d on %s: %v", i, r, err)
		}
		k.add(a)
		if ok, err := c.nodes[i%len(c.nodes)].release(r, a.GetLeaseId()); err != nil || !ok {
			c.t.Fatalf("cycle %d on %s: release %v %v", i, r, ok, err)
		}
	}
}

// backup runs warden admin backup against node i into dir and returns
// the manifest it wrote.
func (c *procCluster) backup(i int, dir string) *wardenv1.BackupManifest {
	c.t.Helper()
	// Bounded twice: the server gives up first and says what it waited
	// on (a split or move in progress, a shard's read); a backup that
	// hangs past that (seen under CI's load, not yet explained) fails
	// with what each node's Warden goroutines were doing (SIGQUIT), not
	// at the package's timeout with nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, cliBinary, "--addr", "http://"+c.nodes[i].listen, "admin", "backup", "--deadline", "90s", "--out", dir).CombinedOutput()
	if err != nil {
		c.t.Errorf("warden admin backup: %v\n%s", err, out)
		for _, n := range c.nodes {
			_ = n.cmd.Process.Signal(syscall.SIGQUIT)
		}
		time.Sleep(2 * time.Second) // the dumps reach the logs
		for i, n := range c.nodes {
			c.t.Logf("node %d's busy goroutines in Warden's code:\n%s", i+1, wardenGoroutines(n.log.String()))
		}
		c.t.FailNow()
	}
	c.t.Logf("warden admin backup:\n%s", out)
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		c.t.Fatal(err)
	}
	man := &wardenv1.BackupManifest{}
	if err := protojson.Unmarshal(b, man); err != nil {
		c.t.Fatal(err)
	}
	return man
}

// idleLoops are the frames of a node's goroutines that wait for work
// all their life; a hang report leaves them out.
var idleLoops = []string{"probeFsync", "watchDisk", "compactIdle", "runTimers", "watchClock", "watchAuth", "server.Start.func", "(*Server).Serve("}

// wardenGoroutines picks from a goroutine dump (SIGQUIT) the goroutines
// with a frame in Warden's own packages, other than idle loops, each as
// its header and function names (no arguments, files or runtime frames),
// at most 200 lines: CI's log keeps only part of a long failure.
func wardenGoroutines(dump string) string {
	var out []string
	for _, g := range strings.Split(dump, "\n\n") {
		g = strings.TrimSpace(g)
		if !strings.HasPrefix(g, "goroutine ") || !strings.Contains(g, "warden-dev/warden/") || slices.ContainsFunc(idleLoops, func(l string) bool { return strings.Contains(g, l) }) {
			continue
		}
		lines := strings.Split(g, "\n")
		out = append(out, lines[0])
		for _, l := range lines[1:] {
			if l = strings.TrimSpace(l); l == "" || strings.HasPrefix(l, "/") || strings.HasPrefix(l, "runtime.") {
				continue
			}
			if i := strings.LastIndex(l, "("); i > 0 && !strings.HasPrefix(l, "created by") {
				l = l[:i]
			}
			out = append(out, "  "+l)
		}
		if len(out) >= 200 {
			return strings.Join(append(out[:200], "…"), "\n")
		}
	}
	return strings.Join(out, "\n")
}

// restore runs wardend restore for each node of c from backup dir.
func (c *procCluster) restore(dir string, extra ...string) {
	c.t.Helper()
	for _, n := range c.nodes {
		args := append([]string{"restore", "--from", dir, "--node-id", fmt.Sprint(n.id), "--zone", n.zone, "--data-dir", n.dir}, extra...)
		if out, err := exec.Command(binary, args...).CombinedOutput(); err != nil {
			c.t.Fatalf("wardend restore of node %d: %v\n%s", n.id, err, out)
		}
	}
}

// Backup and restore on three processes, and case L19's restore half.
// Grants, quota reservations and commits, and a split; a backup through
// warden admin backup while acquire/release load runs; then more grants
// and another split after the backup (the epochs they take are not in
// it). The old cluster is killed and a fresh three-process cluster, on
// new addresses, is restored from the backup with wardend restore. It
// has the backup's shards and ranges (not the later split), each under a
// new epoch above the backup's window plus the gap; every lease held at
// the backup is held with its token and absolute expiry; every quota
// total and ledger is back exactly and the ledger replays to Query;
// every replica of a shard holds the same state; and every token issued
// after the restore is above every token ever issued before it, by the
// old cluster before or after the backup, and no lease id repeats. A
// backup file altered by one byte, or a restore into a directory that
// holds anything, is refused naming the file and both digests.
func TestClusterBackupRestore(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	seen := &tokens{leases: map[string]bool{}}
	c.cycles(seen, "r", 300)

	const at = uint64(1) << 63
	var pools []string // one on each side of the split
	for i := 0; len(pools) < 2; i++ {
		p := fmt.Sprintf("bkpool%d", i)
		if (len(pools) == 0) == (keyspace.Hash(p) < at) {
			pools = append(pools, p)
		}
	}
	var keys []string
	for _, p := range pools {
		keys = append(keys, p, p+"/team", p+"/team/a", p+"/team/b")
		for _, k := range []string{p, p + "/team/a"} {
			if err := call(func(ctx context.Context) error {
				_, err := c.any().quota().SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: k, Limit: 1000}))
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 40 {
			k := fmt.Sprintf("%s/team/%c", p, "ab"[i%2])
			id := fmt.Sprintf("res-%d", i)
			if err := call(func(ctx context.Context) error {
				_, err := c.any().quota().Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: k, Amount: int64(1 + i%5), ReservationId: id, Ttl: durationpb.New(10 * time.Minute)}))
				return err
			}); err != nil {
				t.Fatalf("reserve %s %s: %v", k, id, err)
			}
			if i%3 == 0 {
				if err := call(func(ctx context.Context) error {
					_, err := c.any().quota().Commit(ctx, connect.NewRequest(&wardenv1.CommitRequest{Key: k, ReservationId: id, Amount: 1}))
					return err
				}); err != nil {
					t.Fatalf("commit %s %s: %v", k, id, err)
				}
			}
		}
	}
	split := func(shardID, at uint64) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := c.any().admin.SplitShard(ctx, connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: shardID, SplitAt: at})); err != nil {
			t.Fatalf("split of shard %d at %#x: %v", shardID, at, err)
		}
	}
	split(c.shardOf(pools[0]).GetId(), at)
	held := c.holdMany("held", 50, 10*time.Minute)
	for _, a := range held {
		seen.add(a)
	}
	// A waiter queued at the backup, whose caller dies with the old
	// cluster: the restore drops it (its deadline is minutes away).
	waitOn := slices.Sorted(maps.Keys(held))[0]
	waiterDone := make(chan struct{})
	go func() {
		defer close(waiterDone)
		_, _ = c.nodes[0].acquire(waitOn, "doomed-waiter", time.Minute, 5*time.Minute)
	}()
	for {
		if d, err := c.any().describe(waitOn); err == nil && d.GetWaiters() == 1 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	wantTotals := c.totals(keys)
	wantLedger := map[string]int{}
	for _, p := range pools {
		evs, _ := c.ledgerOf(p)
		wantLedger[p] = len(evs)
	}

	// The backup, under acquire/release load.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var loadOps atomic.Int64
	for w := range 3 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				r := fmt.Sprintf("load-%d-%d", w, i%50)
				n := c.nodes[(w+i)%3]
				a, err := n.acquire(r, fmt.Sprintf("load-%d-%d", w, i), 10*time.Second, 0)
				if err != nil {
					continue
				}
				seen.add(a)
				loadOps.Add(1)
				_, _ = n.release(r, a.GetLeaseId())
			}
		})
	}
	backupDir := filepath.Join(t.TempDir(), "backup")
	start := time.Now()
	man := c.backup(1, backupDir)
	took := time.Since(start)
	stop.Store(true)
	wg.Wait()
	if len(man.GetShards()) != 2 || man.GetEpochLimit() == 0 || len(man.GetNodes()) != 3 {
		t.Fatalf("manifest %v: want 2 shards, 3 nodes and the epoch window", man)
	}
	t.Logf("backup of %d shards took %s while %d acquire/release cycles ran", len(man.GetShards()), took, loadOps.Load())

	// After the backup: more grants, more reservations, another split.
	c.cycles(seen, "r", 300)
	split(c.shardOf(pools[1]).GetId(), at+at/2)
	c.cycles(seen, "after-split", 100)
	if err := call(func(ctx context.Context) error {
		_, err := c.any().quota().Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: pools[0] + "/team/a", Amount: 7, ReservationId: "after-backup"}))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if n := len(c.checkShards()); n != 3 {
		t.Fatalf("%d shards after the second split, want 3", n)
	}
	for i := range c.nodes {
		c.kill(i)
	}
	<-waiterDone

	// Damaged backups and busy directories are refused, naming the file.
	bad := filepath.Join(t.TempDir(), "bad")
	if err := os.CopyFS(bad, os.DirFS(backupDir)); err != nil {
		t.Fatal(err)
	}
	name := man.GetShards()[0].GetFile().GetName()
	b, err := os.ReadFile(filepath.Join(bad, name))
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x40
	if err := os.WriteFile(filepath.Join(bad, name), b, 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "node")
	out, err := exec.Command(binary, "restore", "--allow-unsigned", "--from", bad, "--node-id", "1", "--data-dir", empty).CombinedOutput()
	if err == nil || !strings.Contains(string(out), name) || !strings.Contains(string(out), "SHA-256") {
		t.Fatalf("restore from a damaged backup: %v\n%s", err, out)
	}
	if entries, _ := os.ReadDir(empty); len(entries) > 0 {
		t.Fatalf("a refused restore wrote %d entries", len(entries))
	}
	busy := t.TempDir()
	if err := os.WriteFile(filepath.Join(busy, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(binary, "restore", "--allow-unsigned", "--from", backupDir, "--node-id", "1", "--data-dir", busy).CombinedOutput(); err == nil || !strings.Contains(string(out), "not empty") {
		t.Fatalf("restore into a directory that holds a file: %v\n%s", err, out)
	}

	// A fresh cluster, on new addresses, restored from the backup.
	r := newProcCluster(t)
	r.restore(backupDir, "--allow-unsigned")
	r.boot()
	shards := r.checkShards()
	if len(shards) != 2 {
		t.Fatalf("the restored cluster has %d shards, want the backup's 2: %v", len(shards), shards)
	}
	for _, s := range shards {
		i := slices.IndexFunc(man.GetShards(), func(b *wardenv1.BackupShard) bool { return b.GetShardId() == s.GetId() })
		if i < 0 || s.GetRangeStart() != man.GetShards()[i].GetStart() || s.GetRangeEnd() != man.GetShards()[i].GetEnd() {
			t.Fatalf("restored shard %v is not one of the backup's %v", s, man.GetShards())
		}
		if s.GetEpoch() < man.GetEpochLimit()+placement.RestoreEpochGap {
			t.Fatalf("restored shard %d has epoch %d, not above the backup's window %d plus the gap", s.GetId(), s.GetEpoch(), man.GetEpochLimit())
		}
	}
	for res, a := range held {
		d, err := r.any().describe(res)
		if err != nil || !d.GetHeld() || d.GetFencingToken() != a.GetFencingToken() || !d.GetExpiresAt().AsTime().Equal(a.GetExpiresAt().AsTime()) {
			t.Fatalf("%s after the restore: %v %v; held with token %#x until %v before", res, d, err, a.GetFencingToken(), a.GetExpiresAt().AsTime())
		}
	}
	if got := r.totals(keys); !maps.Equal(got, wantTotals) {
		t.Fatalf("quota totals after the restore: %v, at the backup: %v", got, wantTotals)
	}
	if d, err := r.any().describe(waitOn); err != nil || d.GetWaiters() != 0 {
		t.Fatalf("%s after the restore: %v %v, want the backup's waiter dropped", waitOn, d, err)
	}
	now := time.Now()
	for _, p := range pools {
		evs, cps := r.ledgerOf(p)
		if len(evs) != wantLedger[p] {
			t.Fatalf("%s's ledger has %d events after the restore, %d at the backup", p, len(evs), wantLedger[p])
		}
		l := ledgertest.New(t, evs, cps...)
		got := r.totals(keys)
		for _, k := range keys {
			if shard.Under(k, p) && got[k] != [2]int64{l.Committed[k], l.Reserved(k, now)} {
				t.Fatalf("%s after the restore: Query says %v, the ledger replays to %d, %d", k, got[k], l.Committed[k], l.Reserved(k, now))
			}
		}
	}
	r.checkRestoredPools(pools)
	before := seen.highest
	after := &tokens{leases: map[string]bool{}}
	for _, prefix := range []string{"r", "after-split", "new"} {
		r.cycles(after, prefix, 20)
	}
	for id := range after.leases {
		if seen.leases[id] {
			t.Fatalf("lease id %s was issued before the restore", id)
		}
	}
	lowest := uint64(1<<64 - 1)
	for _, s := range []string{"r1", "r2", "after-split1", "new1"} {
		n := r.any()
		a, err := n.acquire(s, "probe-"+s, time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		lowest = min(lowest, a.GetFencingToken())
		if ok, err := n.release(s, a.GetLeaseId()); err != nil || !ok {
			t.Fatalf("release %s: %v %v", s, ok, err)
		}
	}
	if lowest <= before {
		t.Fatalf("a token after the restore, %#x, is not above the highest before it, %#x", lowest, before)
	}
	// The load's leases held at the backup (10 s) expire on the restored
	// cluster at their old expiry: let those Expire entries apply before
	// the replicas stop, so that they stop at the same index.
	time.Sleep(time.Until(start.Add(took + 10*time.Second + 2*time.Second)))
	r.replicasAgree()
	// A second start (digests stopped the nodes) is a plain restart: the
	// pending restore is gone.
	for i := range r.nodes {
		if _, err := os.Stat(filepath.Join(r.nodes[i].dir, "restore.pb")); err == nil {
			t.Fatalf("node %d still has its pending restore after its first start", i+1)
		}
		r.start(i)
	}
	for i := range r.nodes {
		r.waitServing(i)
	}
	if !bytes.Contains([]byte(r.nodes[0].log.String()), []byte(`"start":["restart"]`)) {
		t.Fatalf("the second start of a restored node was not a restart:\n%s", r.nodes[0].log.Tail(5))
	}
}

// The dev cluster's backup and restore, as a newcomer would run them
// after docs/operations.md "Backup and restore": warden admin
// backup-key, warden admin backup --signing-key against wardend --dev,
// wardend restore --dev --verify-key into a new directory, wardend --dev
// on it. The held lock comes back with its
// token, the restored cluster's next token is above it, and a second
// restore into the same directory is refused. The key file is its
// owner's alone. Refused, naming the signature: a byte flipped in any
// file of the backup with the manifest's SHA-256 recomputed, the backup
// without its signature, and another key; and with neither --verify-key
// nor --allow-unsigned, any restore. --allow-unsigned restores the
// unsigned copy.
func TestDevBackupRestore(t *testing.T) {
	t.Parallel()
	src := startServer(t, t.TempDir())
	held, err := src.acquire("dev/held", "held", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	keys := t.TempDir()
	key, otherKey := filepath.Join(keys, "backup.key"), filepath.Join(keys, "other.key")
	for _, k := range []string{key, otherKey} {
		if out, err := exec.Command(cliBinary, "admin", "backup-key", "--out", k).CombinedOutput(); err != nil {
			t.Fatalf("warden admin backup-key: %v\n%s", err, out)
		}
	}
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the private key file: %v, %v; want mode 0600", fi, err)
	}
	if out, err := exec.Command(cliBinary, "admin", "backup-key", "--out", key).CombinedOutput(); err == nil {
		t.Fatalf("warden admin backup-key overwrote a key:\n%s", out)
	}
	dir := filepath.Join(t.TempDir(), "backup")
	if out, err := exec.Command(cliBinary, "--addr", "http://"+src.addr, "admin", "backup", "--out", dir, "--signing-key", key).CombinedOutput(); err != nil {
		t.Fatalf("warden admin backup: %v\n%s", err, out)
	}
	src.signal(syscall.SIGTERM)
	if err := src.waitExit(); err != nil {
		t.Fatalf("wardend --dev stopping: %v", err)
	}
	refused := func(what, from string, want string, flags ...string) {
		t.Helper()
		data := filepath.Join(t.TempDir(), "refused")
		out, err := exec.Command(binary, append([]string{"restore", "--dev", "--from", from, "--data-dir", data}, flags...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Fatalf("%s: restore %v; want refused saying %q\n%s", what, err, want, out)
		}
		if entries, _ := os.ReadDir(data); len(entries) > 0 {
			t.Fatalf("%s: the refused restore wrote %d entries", what, len(entries))
		}
	}
	man := &wardenv1.BackupManifest{}
	text, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(text, man); err != nil {
		t.Fatal(err)
	}
	for i := range backupFiles(man) {
		bad := filepath.Join(t.TempDir(), "bad")
		if err := os.CopyFS(bad, os.DirFS(dir)); err != nil {
			t.Fatal(err)
		}
		m := proto.CloneOf(man)
		f := backupFiles(m)[i]
		b, err := os.ReadFile(filepath.Join(bad, f.GetName()))
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0x01
		sum := sha256.Sum256(b)
		f.Sha256 = sum[:]
		text, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		for name, content := range map[string][]byte{f.GetName(): b, "manifest.json": text} {
			if err := os.WriteFile(filepath.Join(bad, name), content, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		refused("a flipped byte in "+f.GetName(), bad, "signature", "--verify-key", key+".pub")
	}
	unsigned := filepath.Join(t.TempDir(), "unsigned")
	if err := os.CopyFS(unsigned, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(unsigned, "manifest.json.sig")); err != nil {
		t.Fatal(err)
	}
	refused("an unsigned backup", unsigned, "not signed", "--verify-key", key+".pub")
	refused("another key", dir, "signature", "--verify-key", otherKey+".pub")
	refused("neither flag", dir, "--allow-unsigned")
	if out, err := exec.Command(binary, "restore", "--dev", "--from", unsigned, "--data-dir", filepath.Join(t.TempDir(), "allowed"), "--allow-unsigned").CombinedOutput(); err != nil {
		t.Fatalf("wardend restore --allow-unsigned of an unsigned backup: %v\n%s", err, out)
	}
	data := filepath.Join(t.TempDir(), "restored")
	if out, err := exec.Command(binary, "restore", "--dev", "--from", dir, "--data-dir", data, "--verify-key", key+".pub").CombinedOutput(); err != nil || !strings.Contains(string(out), "wardend --dev --data-dir") {
		t.Fatalf("wardend restore --dev: %v\n%s", err, out)
	}
	if out, err := exec.Command(binary, "restore", "--dev", "--from", dir, "--data-dir", data, "--verify-key", key+".pub").CombinedOutput(); err == nil || !strings.Contains(string(out), "not empty") {
		t.Fatalf("a second restore into the same directory: %v\n%s", err, out)
	}
	dst := startServer(t, data)
	if d := dst.describe("dev/held"); !d.GetHeld() || d.GetFencingToken() != held.GetFencingToken() {
		t.Fatalf("the held lock after the restore: %v, want token %#x", d, held.GetFencingToken())
	}
	a, err := dst.acquire("dev/new", "new", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if a.GetFencingToken() <= held.GetFencingToken() || a.GetLeaseId() == held.GetLeaseId() {
		t.Fatalf("a grant after the restore: token %#x (before: %#x), lease id %s", a.GetFencingToken(), held.GetFencingToken(), a.GetLeaseId())
	}
	for i := range 3 {
		if _, err := os.Stat(filepath.Join(data, fmt.Sprintf("node-%d", i+1), "restore.pb")); err == nil {
			t.Fatalf("node %d's pending restore is still there after the first start", i+1)
		}
	}
}

// checkRestoredPools checks that every pool of a restored cluster is
// frozen: Query says so, and a Reserve is refused with failed_precondition
// and a PoolFrozen detail naming the pool, until pools[0] is unfrozen
// through the CLI and pools[1]'s usage is corrected at its root.
func (c *procCluster) checkRestoredPools(pools []string) {
	c.t.Helper()
	reserve := func(pool, id string) error {
		return call(func(ctx context.Context) error {
			_, err := c.any().quota().Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: pool + "/team/a", Amount: 1, ReservationId: id}))
			return err
		})
	}
	for _, p := range pools {
		var q *wardenv1.QueryResponse
		if err := call(func(ctx context.Context) error {
			resp, err := c.any().quota().Query(ctx, connect.NewRequest(&wardenv1.QueryRequest{Key: p}))
			q = resp.Msg
			return err
		}); err != nil || !q.GetFrozen() {
			c.t.Fatalf("Query %s after the restore: %v %v, want frozen", p, q, err)
		}
		err := reserve(p, "after-restore")
		if frozen := poolFrozen(err); connect.CodeOf(err) != connect.CodeFailedPrecondition || frozen.GetPool() != p || frozen.GetReason() != shard.ReasonRestored {
			c.t.Fatalf("Reserve in restored pool %s: %v (detail %v), want failed_precondition with PoolFrozen naming it", p, err, frozen)
		}
	}
	if out, err := exec.Command(cliBinary, "--addr", "http://"+c.nodes[0].listen, "quota", "unfreeze", pools[0]).CombinedOutput(); err != nil || !strings.Contains(string(out), "unfrozen") {
		c.t.Fatalf("warden quota unfreeze %s: %v\n%s", pools[0], err, out)
	}
	var seq uint64
	if err := call(func(ctx context.Context) error {
		resp, err := c.any().quota().Query(ctx, connect.NewRequest(&wardenv1.QueryRequest{Key: pools[1]}))
		if err == nil {
			seq = resp.Msg.GetLedgerSeq()
			_, err = c.any().quota().ReportUsage(ctx, connect.NewRequest(&wardenv1.ReportUsageRequest{Key: pools[1], Observed: resp.Msg.GetLevels()[0].GetCommitted(),
				ReportId: "after-restore", Correct: true, ObservedSeq: &seq}))
		}
		return err
	}); err != nil {
		c.t.Fatalf("correct %s: %v", pools[1], err)
	}
	for _, p := range pools {
		if err := reserve(p, "after-thaw"); err != nil {
			c.t.Fatalf("Reserve in %s once unfrozen: %v", p, err)
		}
	}
}

// poolFrozen is err's PoolFrozen detail, or nil.
func poolFrozen(err error) *wardenv1.PoolFrozen {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if f, ok := v.(*wardenv1.PoolFrozen); ok {
				return f
			}
		}
	}
	return nil
}

// Node 3 restored alone from an older backup while the cluster runs must
// not start Raft: it exits naming the placement state it did not create,
// before its empty placement replica acknowledges anything. Its original
// directory, put back, then starts and serves, and the cluster keeps
// every lease. Before, the restored node acknowledged placement entries
// under node 3's id and then exited; the original directory then panicked
// on every start ("invalid commitTo index ..."), its log behind what the
// leader had recorded for it.
func TestClusterRestoreIntoRunningClusterRefused(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	leases := c.holdMany("held", 8, 10*time.Minute)
	backupDir := filepath.Join(t.TempDir(), "backup")
	c.backup(0, backupDir)
	for res, a := range c.holdMany("later", 8, 10*time.Minute) {
		leases[res] = a
	}
	n := c.nodes[2]
	c.kill(2)
	orig := n.dir + ".orig"
	if err := os.Rename(n.dir, orig); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(binary, "restore", "--allow-unsigned", "--from", backupDir, "--node-id", "3", "--zone", n.zone, "--data-dir", n.dir).CombinedOutput(); err != nil {
		t.Fatalf("wardend restore of node 3: %v\n%s", err, out)
	}
	c.expectRefusal(2, "did not create")
	for _, sub := range []string{"nodehost", "wal"} {
		if _, err := os.Stat(filepath.Join(n.dir, sub)); err == nil {
			t.Fatalf("the refused restore started Raft: %s/ exists", sub)
		}
	}
	// The cluster moves on meanwhile, then node 3 gets its own data back.
	for res, a := range c.holdMany("meanwhile", 8, 10*time.Minute) {
		leases[res] = a
	}
	if err := os.RemoveAll(n.dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(orig, n.dir); err != nil {
		t.Fatal(err)
	}
	c.start(2)
	c.waitServing(2)
	c.checkLeases(leases)
	c.checkNextTokens(leases)
	// Node 3 serves on: its replicas caught up rather than panicked.
	deadline := time.Now().Add(60 * time.Second)
	for code, body := n.probe(t, "/readyz"); code != http.StatusOK; code, body = n.probe(t, "/readyz") {
		if time.Now().After(deadline) {
			t.Fatalf("node 3 not ready on its own data: %d %s", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	select {
	case err := <-n.exited:
		t.Fatalf("node 3 exited (%v) on its own data:\n%s", err, n.log.Tail(30))
	default:
	}
	if strings.Contains(n.log.String(), "panic") {
		t.Fatalf("node 3 panicked on its own data:\n%s", n.log.Tail(30))
	}
}

// backupFiles lists the files man describes: the placement state's, then
// each shard's.
func backupFiles(man *wardenv1.BackupManifest) []*wardenv1.BackupFile {
	out := []*wardenv1.BackupFile{man.GetPlacement()}
	for _, s := range man.GetShards() {
		out = append(out, s.GetFile())
	}
	return out
}
