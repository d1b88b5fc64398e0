package shard

import (
	"bytes"
	"crypto/sha256"
	"errors"
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
	strip := func(s string) string {
		var keep []string
		for _, l := range strings.Split(s, "\n") {
			if !strings.HasPrefix(l, `"`+string(keyMeta)+`"`) && !strings.HasPrefix(l, `"`+string(keyApplied)+`"`) {
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
