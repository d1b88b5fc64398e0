package server

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"slices"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/shard"
)

// ManifestFile is the name of a backup directory's manifest (a
// warden.v1.BackupManifest in protojson), which `warden admin backup`
// writes beside the files it lists.
const ManifestFile = "manifest.json"

// Backup is a backup directory, read and checked (OpenBackup).
type Backup struct {
	Dir      string
	Manifest *wardenv1.BackupManifest
	// State is the backed-up placement state.
	State *placementv1.State
}

// BackupTrust is what OpenBackup requires of a backup's signature
// (SignatureFile). Exactly one is set: a backup holds the auth state, so
// whoever could write one could plant credentials, and a restore either
// checks who signed it or says on purpose that it does not.
type BackupTrust struct {
	// Key, if set, must have signed the manifest (wardend restore
	// --verify-key): an unsigned backup, one signed by another key, and
	// one whose manifest or any file changed since it was signed are
	// refused, naming the signature.
	Key ed25519.PublicKey
	// AllowUnsigned restores without checking a signature (wardend
	// restore --allow-unsigned), for backups taken without
	// --signing-key; the files are still checked against the manifest.
	AllowUnsigned bool
}

// OpenBackup reads the backup in dir: its manifest, its signature as
// trust requires (VerifyManifest, before the manifest is parsed), and
// every file the manifest lists, each checked against the manifest's
// size and SHA-256. A missing, damaged or altered file is an error naming
// it (and, for a checksum, both digests); nothing is restored from a
// backup that fails.
func OpenBackup(dir string, trust BackupTrust) (*Backup, error) {
	path := filepath.Join(dir, ManifestFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	switch {
	case trust.Key != nil && trust.AllowUnsigned:
		return nil, errors.New("restore: --verify-key and --allow-unsigned exclude each other")
	case trust.Key != nil:
		sig, err := os.ReadFile(filepath.Join(dir, SignatureFile))
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("restore: %w: backup %s is not signed (no %s): it was taken without warden admin backup --signing-key, "+
				"or its signature was removed; restore it with --allow-unsigned only if you know where it came from", ErrSignature, dir, SignatureFile)
		} else if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		if err := VerifyManifest(trust.Key, b, sig); err != nil {
			return nil, fmt.Errorf("restore: backup %s: %w", dir, err)
		}
	case !trust.AllowUnsigned:
		return nil, errors.New("restore: give --verify-key FILE.pub (the public key of the warden admin backup-key pair whose private key signed the backup), " +
			"or --allow-unsigned to restore without checking who wrote the backup: it holds the auth state, so whoever can write it can plant credentials")
	}
	man := &wardenv1.BackupManifest{}
	if err := protojson.Unmarshal(b, man); err != nil {
		return nil, fmt.Errorf("restore: %s: %w", path, err)
	}
	if man.GetBackupId() == "" || man.GetPlacement() == nil || len(man.GetShards()) == 0 {
		return nil, fmt.Errorf("restore: %s: backup_id, placement and shards are required", path)
	}
	// The placement file is read once, and what was checked is parsed.
	pb, err := readChecked(dir, man.GetPlacement())
	if err != nil {
		return nil, err
	}
	// The shard files are checked now, so that a damaged backup fails
	// before anything is written, and again as restoreReplica reads
	// them: a check holds only for the bytes it hashed.
	for _, s := range man.GetShards() {
		if err := checkFile(dir, s.GetFile()); err != nil {
			return nil, err
		}
	}
	st := &placementv1.State{}
	if err := proto.Unmarshal(pb, st); err != nil {
		return nil, fmt.Errorf("restore: backup file %s: %w", man.GetPlacement().GetName(), err)
	}
	for _, s := range man.GetShards() {
		if !slices.ContainsFunc(st.GetShards(), func(p *placementv1.Shard) bool { return p.GetId() == s.GetShardId() }) {
			return nil, fmt.Errorf("restore: %s lists shard %d, which the backed-up placement state does not have", path, s.GetShardId())
		}
	}
	if len(man.GetShards()) != len(st.GetRanges()) {
		return nil, fmt.Errorf("restore: %s lists %d shards, the placement state has %d ranges", path, len(man.GetShards()), len(st.GetRanges()))
	}
	return &Backup{Dir: dir, Manifest: man, State: st}, nil
}

// checkFile checks file f of backup dir against its size and digest.
func checkFile(dir string, f *wardenv1.BackupFile) error {
	r, err := openChecked(dir, f)
	if err != nil {
		return err
	}
	defer r.Close()
	return r.check()
}

// readChecked reads file f of backup dir once and checks those bytes
// against its size and digest: what it returns is what was checked.
func readChecked(dir string, f *wardenv1.BackupFile) ([]byte, error) {
	r, err := openChecked(dir, f)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("restore: backup file %s: %w", r.path, err)
	}
	return b, r.check()
}

// checkedReader reads a backup file and hashes every byte it returns, so
// that check verifies exactly the bytes its reader used: a file changed
// after an earlier check (OpenBackup) is never used unchecked.
type checkedReader struct {
	path string
	want *wardenv1.BackupFile
	in   *os.File
	h    hash.Hash
	n    int64
}

// openChecked opens file f of backup dir, whose name must be a plain
// name, for a checkedReader.
func openChecked(dir string, f *wardenv1.BackupFile) (*checkedReader, error) {
	name := f.GetName()
	if name == "" || filepath.Base(name) != name {
		return nil, fmt.Errorf("restore: %s: file name %q is not a plain name", filepath.Join(dir, ManifestFile), name)
	}
	path := filepath.Join(dir, name)
	in, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("restore: backup file %s: %w", path, err)
	}
	return &checkedReader{path: path, want: f, in: in, h: sha256.New()}, nil
}

func (r *checkedReader) Read(p []byte) (int, error) {
	n, err := r.in.Read(p)
	r.h.Write(p[:n])
	r.n += int64(n)
	return n, err
}

// check reads what the reader has not yet returned, then compares the
// bytes read in all with the manifest's size and SHA-256: an error names
// the file and both digests.
func (r *checkedReader) check() error {
	if _, err := io.Copy(io.Discard, r); err != nil {
		return fmt.Errorf("restore: backup file %s: %w", r.path, err)
	}
	if got := r.h.Sum(nil); r.n != r.want.GetSize() || !bytes.Equal(got, r.want.GetSha256()) {
		return fmt.Errorf("restore: backup file %s is damaged: %d bytes with SHA-256 %s, but the manifest says %d bytes with SHA-256 %s",
			r.path, r.n, hex.EncodeToString(got), r.want.GetSize(), hex.EncodeToString(r.want.GetSha256()))
	}
	return nil
}

// Close closes the file.
func (r *checkedReader) Close() error { return r.in.Close() }

// RestoreResult is what RestoreNode wrote.
type RestoreResult struct {
	RestoreID string
	// Epochs is the epoch each restored shard's tokens take, by shard id.
	Epochs map[uint64]uint64
	// Replicas is how many shard replicas the node's directory holds.
	Replicas int
}

// RestoreNode writes the data directory dataDir (absent or empty) of node
// nodeID from backup b, for the node's first start in the restored
// cluster: its replicas' records under new epochs (placement.PrepareRestore,
// with minEpoch), a new identity and the pending restore. zone, when set,
// must be the node's zone in the backup. Every node of the backup
// restores its own directory from the same backup and minEpoch, then
// starts with --initial-members naming them all (their addresses may
// differ from the backed-up ones). On an error, what it wrote is removed.
func RestoreNode(b *Backup, nodeID uint64, zone, dataDir string, minEpoch uint64) (*RestoreResult, error) {
	i := slices.IndexFunc(b.State.GetNodes(), func(n *placementv1.Node) bool { return n.GetId() == nodeID })
	if i < 0 {
		var ids []uint64
		for _, n := range b.State.GetNodes() {
			ids = append(ids, n.GetId())
		}
		return nil, fmt.Errorf("restore: node %d is not in the backup (its nodes: %v)", nodeID, ids)
	}
	if z := b.State.GetNodes()[i].GetZone(); zone != "" && zone != z {
		return nil, fmt.Errorf("restore: node %d was in zone %q in the backup, not --zone %q", nodeID, z, zone)
	}
	prepared, restoreID, epochs, err := placement.PrepareRestore(b.State, b.Manifest.GetBackupId(), minEpoch)
	if err != nil {
		return nil, err
	}
	if entries, err := os.ReadDir(dataDir); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("restore: --data-dir %s is not empty: a node restores into an empty directory", dataDir)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("restore: %w", err)
	}
	res := &RestoreResult{RestoreID: restoreID, Epochs: epochs}
	err = func() error {
		for _, s := range prepared.GetShards() {
			for _, r := range s.GetReplicas() {
				if r.GetNodeId() != nodeID {
					continue
				}
				if err := restoreReplica(b, dataDir, s.GetId(), r.GetReplicaId(), epochs[s.GetId()]); err != nil {
					return err
				}
				res.Replicas++
			}
		}
		_, err := placement.WriteRestore(dataDir, nodeID, &placementv1.RestoreCmd{State: prepared, RestoreId: restoreID})
		return err
	}()
	if err != nil {
		removeContents(dataDir)
		return nil, err
	}
	return res, nil
}

func restoreReplica(b *Backup, dataDir string, shardID, replicaID, epoch uint64) error {
	i := slices.IndexFunc(b.Manifest.GetShards(), func(s *wardenv1.BackupShard) bool { return s.GetShardId() == shardID })
	if i < 0 {
		return fmt.Errorf("restore: the backup has no file of shard %d", shardID)
	}
	r, err := openChecked(b.Dir, b.Manifest.GetShards()[i].GetFile())
	if err != nil {
		return err
	}
	defer r.Close()
	err = shard.RestoreReplica(filepath.Join(dataDir, "sm"), shardID, replicaID, r, epoch)
	// The bytes restored are checked, not only the file OpenBackup read:
	// on a mismatch RestoreNode removes what was written. A mismatch is
	// the cause of a malformed stream, so it is reported first.
	if cerr := r.check(); cerr != nil {
		return cerr
	}
	if err != nil {
		return fmt.Errorf("restore: backup file %s: %w", r.path, err)
	}
	return nil
}

// removeContents empties dir (a failed restore's leftovers).
func removeContents(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

// RestoreDev writes a dev cluster's data directory (DevConfig.DataDir:
// node-1, node-2 and node-3) from backup b, which must be of nodes 1 to 3
// in zones az1 to az3 (a dev cluster's backup); wardend --dev then starts
// the restored cluster.
func RestoreDev(b *Backup, dataDir string, minEpoch uint64) ([]*RestoreResult, error) {
	if entries, err := os.ReadDir(dataDir); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("restore: --data-dir %s is not empty: a dev cluster restores into an empty directory", dataDir)
	}
	if n := len(b.State.GetNodes()); n != DevNodes {
		return nil, fmt.Errorf("restore: the backup has %d nodes; a dev cluster has %d", n, DevNodes)
	}
	var out []*RestoreResult
	for i := range DevNodes {
		res, err := RestoreNode(b, uint64(i+1), fmt.Sprintf("az%d", i+1), filepath.Join(dataDir, fmt.Sprintf("node-%d", i+1)), minEpoch)
		if err != nil {
			removeContents(dataDir)
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}
