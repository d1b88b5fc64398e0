package shard

import (
	"bufio"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble"
	"google.golang.org/protobuf/proto"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// ExportQuery is a Lookup that writes the replica's whole state, as of
// one applied index, to the file Path (which must not exist) in the
// snapshot stream format SaveSnapshot writes: a backup. Run through a
// linearizable read, the state holds every entry committed before the
// read began. The file is written while the replica's database handle is
// held for reading, so a RecoverFromSnapshot or Close waits for it
// (about a second per 100,000 records); the stream is then read from the
// file, without the replica.
type ExportQuery struct{ Path string }

// ExportedSnapshot is the answer to an ExportQuery.
type ExportedSnapshot struct {
	// AppliedIndex is the Raft index of the last entry the state holds.
	AppliedIndex uint64
	// Meta is the shard's meta record in it (epoch, revision, range).
	Meta *shardv1.ShardMeta
	// Pairs is the number of key/value pairs; Size the file's bytes and
	// SHA256 their digest.
	Pairs  uint64
	Size   int64
	SHA256 []byte
}

func export(snap *pebble.Snapshot, shardID uint64, path string) (*ExportedSnapshot, error) {
	meta, err := (&records{g: snap, initial: initialMeta(shardID)}).Meta()
	if err != nil {
		return nil, err
	}
	index, err := appliedIndex(snap)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shard: export: %w", err)
	}
	h := sha256.New()
	cw := &countingWriter{w: io.MultiWriter(f, h)}
	pairs, err := writeStream(snap, cw, nil)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("shard: export: %w", err)
	}
	return &ExportedSnapshot{AppliedIndex: index, Meta: meta, Pairs: pairs, Size: cw.n, SHA256: h.Sum(nil)}, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// RestoreReplica writes the state of replica replicaID of shardID, under
// the state-machine directory smDir (ReplicaDir), from a snapshot stream
// an ExportQuery wrote, for a restored cluster's first start. The
// replica directory must not exist. The restored state differs from the
// exported one in two records, the same on every replica restored from
// the same stream and epoch:
//
//   - the meta record takes epoch (above every epoch the backed-up
//     cluster could have assigned) with revision 0, so every token the
//     restored shard issues is above every token issued before the
//     restore, including those issued after the backup;
//   - the applied index is gone (0): the replica starts as a new Raft
//     group whose log begins empty, as Dragonboat requires of a new
//     replica's state machine, and applies that log's entries on top.
//
// A stream that is malformed or truncated is ErrCorruptSnapshot.
func RestoreReplica(smDir string, shardID, replicaID uint64, r io.Reader, epoch uint64) error {
	if epoch == 0 || epoch > MaxEpoch {
		return fmt.Errorf("shard: restore: epoch %d is out of range (1 to %d)", epoch, MaxEpoch)
	}
	dir := ReplicaDir(smDir, shardID, replicaID)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("shard: restore: %s exists already", dir)
	}
	s := &StateMachine{shardID: shardID, replicaID: replicaID, dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	err := s.restore(r, epoch)
	if err != nil {
		os.RemoveAll(dir)
	}
	return err
}

// writeRestored makes a backup's state a restored cluster's: it drops
// every queued waiter (its caller waited on the old cluster and is gone;
// restored, it would be granted a lease that nobody holds or renews) and
// freezes every pool (PoolRecord.restored: its counters do not count what
// was reserved or committed after the backup, so Reserve is refused until
// an operator corrects or unfreezes it). Each node restores its replica
// from the same stream, so the replicas start equal.
func writeRestored(db *pebble.DB, cache *valueCache, shardID uint64) error {
	b := writeBatch{db.NewIndexedBatch(), cache}
	defer b.Close()
	view := &records{g: b, initial: initialMeta(shardID)}
	changes, err := restoredChanges(view)
	if err != nil {
		return err
	}
	for _, c := range changes {
		if err := c.write(view, b); err != nil {
			return err
		}
	}
	if err := view.writeMeta(b); err != nil {
		return err
	}
	return b.Commit(pebble.Sync)
}

// restoredChanges decides writeRestored's changes, reading r a page at a
// time (the changes are written only after the last page).
func restoredChanges(r Reader) ([]Change, error) {
	meta, err := r.Meta()
	if err != nil {
		return nil, err
	}
	a := newApplier(r, meta, CommandVersion)
	for after := []byte(nil); ; {
		page, next, err := r.Records(0, 0, after, 1024)
		if err != nil {
			return nil, err
		}
		for _, w := range page.GetWaiters() {
			lock, err := a.lock(w.GetResource())
			if err != nil {
				return nil, err
			}
			if _, err := a.removeWaiter(lock, w); err != nil {
				return nil, err
			}
		}
		for _, p := range page.GetPools() {
			p = proto.CloneOf(p)
			p.Restored = true
			a.setPool(p)
		}
		if next == nil {
			return a.allChanges(), nil
		}
		after = next
	}
}

func (s *StateMachine) restore(r io.Reader, epoch uint64) error {
	db, err := openDB(filepath.Join(s.dir, "db-1"), nil, nil)
	if err != nil {
		return err
	}
	cache, err := loadSnapshot(db, filepath.Join(s.dir, "db-1"), bufio.NewReaderSize(r, 256<<10), nil)
	if err != nil {
		db.Close()
		return err
	}
	if err := writeRestored(db, cache, s.shardID); err != nil {
		db.Close()
		return err
	}
	meta, err := (&records{g: db, initial: initialMeta(s.shardID)}).Meta()
	if err != nil {
		db.Close()
		return err
	}
	if meta.GetRange().GetShardId() != s.shardID {
		db.Close()
		return fmt.Errorf("%w: the stream is shard %d's, not shard %d's", ErrCorruptSnapshot, meta.GetRange().GetShardId(), s.shardID)
	}
	meta.Epoch, meta.Revision, meta.Fence = epoch, 0, nil
	v, err := proto.MarshalOptions{Deterministic: true}.Marshal(meta)
	if err != nil {
		db.Close()
		return err
	}
	b := db.NewBatch()
	_ = b.Set(keyMeta, v, nil)
	_ = b.Delete(keyApplied, nil)
	if err := b.Commit(pebble.Sync); err != nil {
		db.Close()
		return err
	}
	if err := db.Close(); err != nil {
		return err
	}
	return s.writeCurrent("db-1")
}
