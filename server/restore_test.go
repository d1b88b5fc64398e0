package server

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/shard"
)

// A restore uses only bytes it checked: a shard file that differs from
// the manifest when the restore reads it (swapped after OpenBackup
// checked it) is refused, even when it is a well-formed shard stream,
// and the placement file parsed is the one hashed.
func TestRestoreChecksTheBytesItUses(t *testing.T) {
	// A well-formed stream: an empty replica's export.
	sm := shard.NewStateMachine(t.TempDir(), shard.Hooks{})(shard.FirstShard, 1).(*shard.StateMachine)
	if _, err := sm.Open(nil); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := sm.Lookup(shard.ExportQuery{Path: filepath.Join(dir, "shard-1.snap")}); err != nil {
		t.Fatal(err)
	}
	if err := sm.Close(); err != nil {
		t.Fatal(err)
	}
	stream, err := os.ReadFile(filepath.Join(dir, "shard-1.snap"))
	if err != nil {
		t.Fatal(err)
	}
	// The manifest's file: the one checked, of which this stream is
	// not the copy (its last byte differs).
	checked := append([]byte(nil), stream...)
	checked[len(checked)-1] ^= 1
	checkedSum, streamSum := sha256.Sum256(checked), sha256.Sum256(stream)
	file := &wardenv1.BackupFile{Name: "shard-1.snap", Size: int64(len(checked)), Sha256: checkedSum[:]}
	b := &Backup{Dir: dir, Manifest: &wardenv1.BackupManifest{Shards: []*wardenv1.BackupShard{{ShardId: shard.FirstShard, File: file}}}}
	err = restoreReplica(b, t.TempDir(), shard.FirstShard, 1, 7)
	if err == nil || !strings.Contains(err.Error(), "is damaged") {
		t.Fatalf("restoreReplica of a stream the manifest does not describe = %v; want refused as damaged", err)
	}
	// The same stream, described by the manifest, restores: the premise
	// that it is well-formed.
	file.Sha256 = streamSum[:]
	if err := restoreReplica(b, t.TempDir(), shard.FirstShard, 1, 7); err != nil {
		t.Fatalf("restoreReplica of the stream the manifest describes: %v", err)
	}

	// The placement file: readChecked returns the bytes it hashed.
	if err := os.WriteFile(filepath.Join(dir, "placement.pb"), checked, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readChecked(dir, &wardenv1.BackupFile{Name: "placement.pb", Size: int64(len(checked)), Sha256: checkedSum[:]})
	if err != nil || string(got) != string(checked) {
		t.Fatalf("readChecked = %d bytes, %v; want the %d bytes checked", len(got), err, len(checked))
	}
	if _, err := readChecked(dir, &wardenv1.BackupFile{Name: "placement.pb", Size: int64(len(stream)), Sha256: streamSum[:]}); err == nil || !strings.Contains(err.Error(), "is damaged") {
		t.Fatalf("readChecked of a file the manifest does not describe = %v; want refused as damaged", err)
	}
}
