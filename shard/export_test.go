package shard

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// exportOf runs an ExportQuery on r into a file under dir.
func exportOf(t *testing.T, r *replica, dir string) (*ExportedSnapshot, []byte) {
	t.Helper()
	path := filepath.Join(dir, "shard.snap")
	out, err := r.sm.Lookup(ExportQuery{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return out.(*ExportedSnapshot), b
}

// A backup restores to the same records under a new epoch, revision 0
// and no applied index, so the restored replica starts as a new Raft
// group's would (Open returns 0) and its next grant's token is above
// every token of the exported shard.
func TestExportRestore(t *testing.T) {
	src := newReplica(t)
	fill(src)
	exp, b := exportOf(t, src, t.TempDir())
	if exp.AppliedIndex != src.index || exp.Size != int64(len(b)) || !bytes.Equal(exp.SHA256, sha256Of(b)) {
		t.Fatalf("export %+v of %d bytes, replica at index %d", exp, len(b), src.index)
	}
	if exp.Meta.GetRevision() == 0 || exp.Meta.GetEpoch() != 1 {
		t.Fatalf("exported meta %v: want epoch 1 and some grants", exp.Meta)
	}
	if !bytes.Equal(b, snapshotOf(t, src)) {
		t.Fatal("the export is not the snapshot stream SaveSnapshot writes")
	}
	// The file must not exist: an export never overwrites.
	if _, err := src.sm.Lookup(ExportQuery{Path: t.TempDir()}); err == nil {
		t.Fatal("export over an existing path succeeded")
	}

	smDir := t.TempDir()
	if err := RestoreReplica(smDir, FirstShard, 1, bytes.NewReader(b), 7); err != nil {
		t.Fatal(err)
	}
	if err := RestoreReplica(smDir, FirstShard, 1, bytes.NewReader(b), 7); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Fatalf("a second restore into the same directory: %v", err)
	}
	dst := openReplica(t, smDir, FirstShard)
	defer dst.sm.Close()
	if dst.index != 0 {
		t.Fatalf("restored replica opens at index %d, want 0 (a new group)", dst.index)
	}
	// The restore marks the pool restored (TestRestoreDropsWaitersAndFreezesPools).
	pool := fmt.Sprintf("%q=", poolKey("pool"))
	strip := func(s string) string {
		var keep []string
		for _, l := range strings.Split(s, "\n") {
			if !strings.HasPrefix(l, `"`+string(keyMeta)+`"`) && !strings.HasPrefix(l, `"`+string(keyApplied)+`"`) && !strings.HasPrefix(l, pool) {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	if a, c := strip(dump(t, src)), strip(dump(t, dst)); a != c {
		t.Fatalf("restored records differ:\n%s\nvs\n%s", a, c)
	}
	meta := dst.query(0, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}}).GetMeta()
	if meta.GetEpoch() != 7 || meta.GetRevision() != 0 || meta.GetLastNowUnixNano() != exp.Meta.GetLastNowUnixNano() {
		t.Fatalf("restored meta %v: want epoch 7, revision 0, the exported time", meta)
	}
	out := dst.propose(exp.Meta.GetLastNowUnixNano(), acquireCmd("fresh", "after-restore", 0, "h", bytes.Repeat([]byte{0xee}, 16)))
	if out.GetCode() != shardv1.Code_CODE_OK || out.GetLease().GetFencingToken() <= Token(1, exp.Meta.GetRevision()) {
		t.Fatalf("grant after the restore: %v, want a token above %#x", out, Token(1, exp.Meta.GetRevision()))
	}
}

// A truncated or damaged stream restores nothing: the error says the
// snapshot is corrupt and the replica directory is left absent.
func TestRestoreCorrupt(t *testing.T) {
	src := newReplica(t)
	fill(src)
	_, b := exportOf(t, src, t.TempDir())
	for name, bad := range map[string][]byte{
		"truncated": b[:len(b)/2],
		"header":    append([]byte("x"), b[1:]...),
		"count":     append(bytes.Clone(b[:len(b)-1]), b[len(b)-1]+1),
	} {
		smDir := t.TempDir()
		err := RestoreReplica(smDir, FirstShard, 1, bytes.NewReader(bad), 7)
		if !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: %v, want ErrCorruptSnapshot", name, err)
		}
		if _, serr := os.Stat(ReplicaDir(smDir, FirstShard, 1)); !errors.Is(serr, os.ErrNotExist) {
			t.Errorf("%s: the replica directory is left behind", name)
		}
	}
	if err := RestoreReplica(t.TempDir(), 2, 1, bytes.NewReader(b), 7); !errors.Is(err, ErrCorruptSnapshot) || !strings.Contains(err.Error(), "shard 1's, not shard 2's") {
		t.Errorf("another shard's stream: %v", err)
	}
}

func sha256Of(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

// A restore drops the backup's queued waiters (their callers waited on
// the old cluster) and freezes its pools: from VersionRestoredPools a
// Reserve is refused, naming the pool and RESTORED, until UnfreezePool or
// a correcting ReportUsage of the pool's root; an entry of an older
// version keeps the old rule. (DESIGN.md §6 "Backup and restore".)
func TestRestoreDropsWaitersAndFreezesPools(t *testing.T) {
	src := newReplica(t)
	now := int64(1_700_000_000) * second
	lease := bytes.Repeat([]byte{1}, 16)
	if out := src.propose(now, acquireCmd("r", "held", 0, "h", lease)); out.GetCode() != shardv1.Code_CODE_OK {
		t.Fatal(out)
	}
	for i, tenant := range []string{"t1", "t2"} {
		env := acquireCmd("r", fmt.Sprintf("w%d", i), 0, "w", bytes.Repeat([]byte{byte(2 + i)}, 16))
		env.GetAcquire().Tenant, env.GetAcquire().WaitTimeoutNanos = tenant, 60*second
		if out := src.propose(now, env); out.GetCode() != shardv1.Code_CODE_QUEUED {
			t.Fatalf("waiter %d: %v", i, out)
		}
	}
	for _, pool := range []string{"gpu", "cpu"} {
		if out := src.propose(now, setLimitCmd(pool, 10)); out.GetCode() != shardv1.Code_CODE_OK {
			t.Fatal(out)
		}
	}
	if out := src.propose(now, reserveCmd("gpu/a", "before", 4)); out.GetCode() != shardv1.Code_CODE_OK {
		t.Fatal(out)
	}
	_, b := exportOf(t, src, t.TempDir())

	restored := func() *replica {
		smDir := t.TempDir()
		if err := RestoreReplica(smDir, FirstShard, 1, bytes.NewReader(b), 7); err != nil {
			t.Fatal(err)
		}
		r := openReplica(t, smDir, FirstShard)
		t.Cleanup(func() { r.sm.Close() })
		return r
	}
	dst := restored()
	lock := dst.query(now, &shardv1.Query{Query: &shardv1.Query_Describe{Describe: &shardv1.DescribeQuery{Resource: "r"}}}).GetLock()
	if !lock.GetHeld() || !bytes.Equal(lock.GetLeaseId(), lease) || lock.GetWaiters() != 0 {
		t.Fatalf("restored lock %v: want held by the backup's lease, no waiters", lock)
	}
	if d := dump(t, dst); strings.Contains(d, `"t1"`) || strings.Contains(d, `"w0"`) {
		t.Fatalf("a waiter, its dedup record or its tenant count survived the restore:\n%s", d)
	}
	meta := dst.query(now, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}}).GetMeta()
	if meta.GetQueuedWaiters() != 0 {
		t.Fatalf("restored meta counts %d queued waiters", meta.GetQueuedWaiters())
	}

	// Frozen: the refusal names the pool; the replay of a reservation the
	// backup holds still answers; the query says frozen.
	out := dst.propose(now, reserveCmd("gpu/b", "after", 1))
	if out.GetCode() != shardv1.Code_CODE_FAILED_PRECONDITION || out.GetQuota().GetLevel() != "gpu" || out.GetQuota().GetReason() != ReasonRestored {
		t.Fatalf("Reserve in a restored pool: %v, want failed_precondition naming gpu, RESTORED", out)
	}
	if out := dst.propose(now, reserveCmd("gpu/a", "before", 4)); out.GetCode() != shardv1.Code_CODE_OK || !out.GetQuota().GetReplayed() {
		t.Fatalf("replay of a restored reservation: %v", out)
	}
	q := &shardv1.Query{Query: &shardv1.Query_Quota{Quota: &shardv1.QuotaQuery{Key: "gpu"}}}
	if !dst.query(now, q).GetRestored() {
		t.Fatal("QuotaQuery does not say the restored pool is frozen")
	}
	// The old rule for older entries.
	dst.version = VersionRevoke
	if out := dst.propose(now, reserveCmd("gpu/b", "old", 1)); out.GetCode() != shardv1.Code_CODE_OK {
		t.Fatalf("Reserve at version %d in a restored pool: %v, want the old rule (granted)", VersionRevoke, out)
	}
	if out := dst.propose(now, unfreezeCmd("gpu")); out.GetCode() != shardv1.Code_CODE_INVALID_ARGUMENT {
		t.Fatalf("UnfreezePool at version %d: %v, want unknown", VersionRevoke, out)
	}
	dst.version = 0

	// Unfreeze: once, with a ledger event; then Reserve grants.
	if out := dst.propose(now, unfreezeCmd("gpu/a")); out.GetCode() != shardv1.Code_CODE_INVALID_ARGUMENT || out.GetField() != "pool" {
		t.Fatalf("UnfreezePool of a sub-level: %v, want invalid pool", out)
	}
	if out := dst.propose(now, unfreezeCmd("gpu")); out.GetCode() != shardv1.Code_CODE_OK || out.GetCount() != 1 {
		t.Fatalf("UnfreezePool: %v", out)
	}
	if out := dst.propose(now, unfreezeCmd("gpu")); out.GetCode() != shardv1.Code_CODE_OK || out.GetCount() != 0 {
		t.Fatalf("a second UnfreezePool: %v, want nothing changed", out)
	}
	if dst.query(now, q).GetRestored() {
		t.Fatal("the pool is still frozen after UnfreezePool")
	}
	events := dst.query(now, &shardv1.Query{Query: &shardv1.Query_Ledger{Ledger: &shardv1.LedgerQuery{Key: "gpu", Limit: 100}}}).GetLedger()
	if last := events[len(events)-1]; last.GetKind() != LedgerUnfreeze || last.GetKey() != "gpu" {
		t.Fatalf("last ledger event %v, want UNFREEZE of gpu", last)
	}
	if out := dst.propose(now, reserveCmd("gpu/b", "after", 1)); out.GetCode() != shardv1.Code_CODE_OK {
		t.Fatalf("Reserve after UnfreezePool: %v", out)
	}
	// The other pool: a correction of a sub-level leaves it frozen, one of
	// its root unfreezes it.
	if out := dst.propose(now, reportCmd("cpu/x", "c1", 0)); out.GetCode() != shardv1.Code_CODE_OK {
		t.Fatal(out)
	}
	if out := dst.propose(now, reserveCmd("cpu/x", "r1", 1)); out.GetCode() != shardv1.Code_CODE_FAILED_PRECONDITION {
		t.Fatalf("Reserve after correcting a sub-level only: %v, want still frozen", out)
	}
	if out := dst.propose(now, reportCmd("cpu", "c2", 3)); out.GetCode() != shardv1.Code_CODE_OK {
		t.Fatal(out)
	}
	if out := dst.propose(now, reserveCmd("cpu/x", "r1", 1)); out.GetCode() != shardv1.Code_CODE_OK {
		t.Fatalf("Reserve after correcting the pool: %v", out)
	}
}

func setLimitCmd(key string, limit int64) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_SetLimit{SetLimit: &shardv1.SetLimitCmd{Key: key, Limit: limit}}}
}

func unfreezeCmd(pool string) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_UnfreezePool{UnfreezePool: &shardv1.UnfreezePoolCmd{Pool: pool}}}
}

// reportCmd is a correcting ReportUsage of key as of the pool's ledger now.
func reportCmd(key, id string, observed int64) *shardv1.Envelope {
	seq := uint64(0)
	return &shardv1.Envelope{Command: &shardv1.Envelope_ReportUsage{ReportUsage: &shardv1.ReportUsageCmd{Key: key, ReportId: id, Observed: observed, Correct: true, ObservedSeq: &seq}}}
}
