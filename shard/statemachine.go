package shard

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble"
	"github.com/cockroachdb/pebble/bloom"
	"github.com/cockroachdb/pebble/sstable"
	"github.com/cockroachdb/pebble/vfs"
	sm "github.com/lni/dragonboat/v4/statemachine"
	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/keyspace"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// StateMachine is a data shard's replica: a Dragonboat IOnDiskStateMachine
// whose state lives in a Pebble database under Dir.
//
// Concurrency, as Dragonboat calls it: Update, Sync, PrepareSnapshot,
// RecoverFromSnapshot and Close are mutually exclusive; Lookup and
// SaveSnapshot may run concurrently with any of them. mu guards the
// database handle, which RecoverFromSnapshot swaps; the Update side's
// cached meta (upd) is touched only by the mutually exclusive methods.
type StateMachine struct {
	shardID   uint64
	replicaID uint64
	dir       string
	observe   ApplyObserver
	events    func(shardID, applied uint64, evs []LockEvent)
	reset     func(shardID, applied uint64)
	closed    func(shardID uint64)
	storage   func(kind string, d time.Duration)
	fatal     func(msg string)

	mu struct {
		sync.RWMutex
		db     *pebble.DB
		dbName string
	}
	upd *records // Update's view; reset whenever the database changes
	// cache holds the values Update reads and writes; reset with upd.
	cache *valueCache
	// applied is the Raft index of the last applied entry (Update side).
	applied uint64
	// release gives up the claim on dir (claimDir) when Open succeeded.
	release func()
	// written counts the bytes of the batches Update committed to the
	// live database; at flushAt, when not 0, Update flushes it once
	// (staggerFlush).
	written, flushAt uint64
	// compactTimer runs the compaction Update last asked for
	// (compactLater); compactPending is set until it starts, and
	// compacted once it ran, until Update restarts the flush stagger.
	compactTimer              *time.Timer
	compactPending, compacted atomic.Bool
	// compacting is held by a running compaction, outside mu so that
	// reads go on meanwhile; closing a database (Close, setDB) takes it
	// first, so a compaction never runs on a closed database.
	compacting sync.Mutex
}

// ApplyObserver sees every applied result that granted the lock to
// waiters or dropped them, right after its batch is committed, on the
// apply goroutine: it must not block. Routers use it to wake exactly the
// waiting RPCs concerned. It never affects state.
type ApplyObserver func(shardID uint64, res *shardv1.Result)

// ReplicaDir is where a replica keeps its state under dataDir.
func ReplicaDir(dataDir string, shardID, replicaID uint64) string {
	return filepath.Join(dataDir, fmt.Sprintf("shard-%d-replica-%d", shardID, replicaID))
}

// Hooks are what replicas report as they work, on the goroutines doing
// it (a hook must not block); a nil hook hears nothing. They never affect
// state.
type Hooks struct {
	// Applied sees hand-offs to waiters.
	Applied ApplyObserver
	// Events hears, after each batch of entries is committed, the lock
	// events of its entries in commit order (none, often) and the index
	// of its last entry: the replica's history of them is complete
	// through applied. It never affects state.
	Events func(shardID, applied uint64, evs []LockEvent)
	// Reset hears that the replica's state was loaded at index applied
	// (Open, RecoverFromSnapshot): the events of entries up to applied
	// are not reported, and a history kept from before ends there.
	Reset func(shardID, applied uint64)
	// Closed hears that the replica stopped (Close): its events end.
	Closed func(shardID uint64)
	// Storage is told how long each of a replica's database flushes
	// (kind "flush": a memtable written to a table) and compactions (kind
	// "compaction") took, from Pebble's events.
	Storage func(kind string, d time.Duration)
	// Fatal, if set, hears the message of a fatal error of a replica's
	// database (a background write that failed) before it panics; it may
	// end the process instead (placement.ExitIfOutOfSpace).
	Fatal func(msg string)
}

// NewStateMachine returns a factory for Dragonboat's StartOnDiskReplica.
// Each replica keeps its state in ReplicaDir(dataDir, …) and reports to
// h.
func NewStateMachine(dataDir string, h Hooks) sm.CreateOnDiskStateMachineFunc {
	return func(shardID, replicaID uint64) sm.IOnDiskStateMachine {
		return &StateMachine{
			shardID:   shardID,
			replicaID: replicaID,
			dir:       ReplicaDir(dataDir, shardID, replicaID),
			observe:   h.Applied,
			events:    h.Events,
			reset:     h.Reset,
			closed:    h.Closed,
			storage:   h.Storage,
			fatal:     h.Fatal,
		}
	}
}

// The replica directory holds the live Pebble database in a subdirectory
// named by the file CURRENT. RecoverFromSnapshot builds the new database
// beside it and switches CURRENT with an atomic rename, so a crash leaves
// either the old or the new state, never a mix.
const currentFile = "CURRENT"

// Open implements sm.IOnDiskStateMachine: it opens (or creates) the
// database and returns the Raft index of the last applied entry.
func (s *StateMachine) Open(stopc <-chan struct{}) (idx uint64, err error) {
	release, err := claimDir(s.dir, stopc)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			release()
		}
	}()
	s.release = release
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return 0, err
	}
	name, err := os.ReadFile(filepath.Join(s.dir, currentFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
		name = []byte("db-1")
		if err := s.writeCurrent(string(name)); err != nil {
			return 0, err
		}
	case err != nil:
		return 0, err
	}
	dbName := strings.TrimSpace(string(name))
	if err := s.removeStale(dbName); err != nil {
		return 0, err
	}
	db, err := openDB(filepath.Join(s.dir, dbName), s.storage, s.fatal)
	if err != nil {
		return 0, err
	}
	if err := buildPoolIDs(db); err != nil {
		db.Close()
		return 0, err
	}
	cache, err := newValueCache(db)
	if err != nil {
		db.Close()
		return 0, err
	}
	if err := s.setDB(db, dbName, staggerFlush(s.replicaID), cache); err != nil {
		return 0, err
	}
	return s.applied, nil
}

// AppliedIndexOf is the Raft index of the last entry applied to the
// state in replica directory dir (ReplicaDir) as it is on disk, read
// without starting the replica (and without writing): 0 when dir holds
// no state. The replica must not be running.
func AppliedIndexOf(dir string) (uint64, error) {
	name, err := os.ReadFile(filepath.Join(dir, currentFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	opts := dbOptions()
	opts.ReadOnly = true
	db, err := pebble.Open(filepath.Join(dir, strings.TrimSpace(string(name))), opts)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	return appliedIndex(db)
}

// openDB opens a replica's database. Every Acquire of a new resource
// looks up keys that do not exist, so the tables carry bloom filters (10
// bits a key, as RocksDB and CockroachDB default to); without them, such
// a lookup reads a block of every level. A 32 MiB block cache keeps the
// working set of a busy shard in memory. Memtables grow to 64 MiB
// (CockroachDB's size; Pebble starts each database's at 256 KiB and
// doubles it, so an idle replica does not pay for it): a busy shard
// rewrites its lock records and expiry index at every renewal, and a
// memtable that lives longer than a renewal period flushes each record
// once, not every version of it. At the reference load, 16 MiB memtables
// flushed every 6.5 s and compacted every 13 s, and p99 acquire over 40 s
// runs was 279 and 500 ms against 148 and 167 ms with 64 MiB. Replicas
// apply the same writes, so they would flush at the same moments;
// staggerFlush keeps them apart.
// openDB opens a replica's database; storage, if set, hears how long
// its flushes and compactions take (Hooks.Storage), and fatal its fatal
// errors (Hooks.Fatal).
func openDB(dir string, storage func(string, time.Duration), fatal func(string)) (*pebble.DB, error) {
	cache := pebble.NewCache(32 << 20)
	defer cache.Unref() // the database holds its own reference
	opts := dbOptions()
	opts.Cache = cache
	opts.Logger = quietLogger{fatal}
	if storage != nil {
		opts.EventListener = pebble.EventListener{
			FlushEnd: func(i pebble.FlushInfo) {
				if i.Err == nil {
					storage("flush", i.TotalDuration)
				}
			},
			CompactionEnd: func(i pebble.CompactionInfo) {
				if i.Err == nil {
					storage("compaction", i.TotalDuration)
				}
			},
		}
	}
	return pebble.Open(dir, opts)
}

// dbOptions are the options of every shard database, less its cache.
func dbOptions() *pebble.Options {
	return &pebble.Options{
		// The plain file system: Pebble's default wraps files in disk-health
		// checks that report to an event listener (none here), and its
		// error path for a held lock closes the directory twice, which
		// panics with the wrapper and is an error without it.
		FS:           unreservedLogs{vfs.Default},
		Logger:       quietLogger{},
		Cleaner:      noRecycleCleaner{},
		MemTableSize: memTableSize,
		Levels:       []pebble.LevelOptions{{FilterPolicy: bloom.FilterPolicy(10)}},
	}
}

// noRecycleCleaner deletes obsolete files, as Pebble's default cleaner
// does, and keeps Pebble from holding obsolete write-ahead logs for
// reuse. Pebble keeps up to three for recycling, each the size it grew
// to (a memtable's worth, up to 64 MiB), for as long as the database
// is open, and recycles none when its cleaner needs the contents of the
// files it cleans: ArchiveCleaner's mark, which this type carries
// (nested, so that DeleteCleaner's Clean and String are the ones
// promoted). After 200,000 one-second leases on a dev cluster, each
// replica's directory kept three such logs, 102 MB, for good. Recycling
// saves creating a file once a memtable, and Update does not sync its
// writes.
type noRecycleCleaner struct {
	pebble.DeleteCleaner
	needsContents
}

type needsContents struct{ pebble.ArchiveCleaner }

// unreservedLogs is a file system whose write-ahead log files do not
// show Pebble their descriptors, so Pebble does not reserve disk for
// them. Pebble reserves 110 % of MemTableSize at a time (70 MiB, from a
// log's first write on, whatever the memtable has grown to) ahead of
// each log's writes, and a replica's log is idle for most of its life:
// after 100,000 one-second leases on a dev cluster, with every lease
// ended, each node held 72 MB of which the tables were about 1 MB. The
// reservation only saves block allocation on a sync, and this log is
// synced only by Sync (before Dragonboat compacts its own log), not at
// each write; without a descriptor Pebble syncs it with fsync rather
// than fdatasync. Logs are never recycled (noRecycleCleaner), so Create
// is the only way Pebble opens one for writing.
type unreservedLogs struct{ vfs.FS }

// Create creates name; a write-ahead log (a .log file) is returned
// without its descriptor.
func (fs unreservedLogs) Create(name string) (vfs.File, error) {
	f, err := fs.FS.Create(name)
	if err != nil || filepath.Ext(name) != ".log" {
		return f, err
	}
	return struct{ vfs.File }{f}, nil
}

// memTableSize is the size memtables grow to (openDB).
const memTableSize = 64 << 20

// staggerFlush returns how many bytes of batches a replica writes to its
// database after Open before it flushes its memtable once, early: 0
// (never) for one replica id in three, a third and two thirds of a
// memtable's worth for the others. Replicas apply the same writes, so
// without it every replica of a shard flushes at the same moment, and
// on machines that share cores (or a disk) each flush stalls the whole
// shard: at the reference load a memtable filled every 42 MiB of
// batches (26 s) and its flush took 1.2 to 2.6 s on every node at once,
// the run's slowest seconds. The early flush shifts each replica's
// schedule, so later flushes stay a third of a period apart, and on
// separate machines at most one replica of a quorum is slowed at a time.
// In three pairs of 45 s runs at the reference load without faults, p99
// acquire went from 135, 141 and 140 ms to 121, 82 and 102 ms. Flushes do
// not change state, only when bytes move from memory to tables. Replica
// ids that are equal modulo 3 (possible after moves) share an offset,
// which costs only the staggering. A database loaded from a snapshot
// starts its schedule at its own moment and is not flushed early: at the
// end of a catch-up, the early flush would add to the replay's work.
func staggerFlush(replicaID uint64) uint64 {
	const period = memTableSize * 2 / 3 // batch bytes a memtable holds, measured: 42 MiB of 64
	return replicaID % 3 * period / 3
}

// setDB installs db as the live database, with cache as its value cache,
// and reloads the Update side, which flushes db early after flushAt bytes
// of batches (0: never).
func (s *StateMachine) setDB(db *pebble.DB, name string, flushAt uint64, cache *valueCache) error {
	s.mu.Lock()
	old := s.mu.db
	s.mu.db, s.mu.dbName = db, name
	s.mu.Unlock()
	s.upd = &records{g: db, initial: initialMeta(s.shardID)}
	s.written, s.flushAt = 0, flushAt
	s.cache = cache
	var err error
	s.applied, err = appliedIndex(db)
	if old != nil {
		s.compacting.Lock()
		cerr := old.Close()
		s.compacting.Unlock()
		if err == nil {
			err = cerr
		}
	}
	if err == nil && s.reset != nil {
		s.reset(s.shardID, s.applied)
	}
	return err
}

// removeStale deletes database directories other than the live one, left
// by a crash in the middle of RecoverFromSnapshot.
func (s *StateMachine) removeStale(live string) error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "db-") && e.Name() != live {
			if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *StateMachine) writeCurrent(name string) error {
	return WriteFileDurably(s.dir, currentFile, []byte(name+"\n"))
}

// WriteFileDurably replaces dir/name with data so that a crash leaves
// either the old file or the new one: a temporary file, fsynced, renamed
// into place, and the directory fsynced.
func WriteFileDurably(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir makes the entries of directory dir (files created, renamed or
// removed in it) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Update implements sm.IOnDiskStateMachine. All entries of the call are
// applied in one Pebble batch together with the last entry's index, so
// the applied index never runs ahead of or behind the state. The batch is
// written without fsync; Sync makes it durable, and Dragonboat replays
// from its own log whatever a crash lost.
func (s *StateMachine) Update(entries []sm.Entry) ([]sm.Entry, error) {
	defer s.fatalOnPanic()
	s.mu.RLock()
	db := s.mu.db
	s.mu.RUnlock()
	b := writeBatch{db.NewIndexedBatch(), s.cache}
	defer b.Close()
	view := &records{g: b, meta: s.upd.meta, initial: s.upd.initial}
	var handOffs []*shardv1.Result
	var events []LockEvent
	for i := range entries {
		res, evs, err := s.applyEntry(view, b, entries[i].Cmd)
		if err != nil {
			return nil, fmt.Errorf("shard %d replica %d: entry %d: %w", s.shardID, s.replicaID, entries[i].Index, err)
		}
		for seq := range evs {
			evs[seq].Index, evs[seq].Seq = entries[i].Index, uint32(seq)
		}
		events = append(events, evs...)
		if len(res.GetGranted())+len(res.GetDropped()) > 0 {
			handOffs = append(handOffs, res)
		}
		data, err := proto.Marshal(res)
		if err != nil {
			return nil, err
		}
		entries[i].Result = sm.Result{Value: uint64(res.GetCode()), Data: data}
	}
	if err := view.writeMeta(b); err != nil {
		return nil, err
	}
	last := entries[len(entries)-1].Index
	if err := b.Set(keyApplied, binary.BigEndian.AppendUint64(nil, last), nil); err != nil {
		return nil, err
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return nil, err
	}
	if s.written += uint64(b.Len()); s.flushAt != 0 && s.written >= s.flushAt {
		s.flushAt = 0
		if _, err := db.AsyncFlush(); err != nil {
			return nil, err
		}
	}
	if s.cache.compactDue() {
		s.compactLater()
	}
	if s.compacted.Swap(false) {
		// The compaction flushed the memtable, at about the same index
		// on every replica: stagger their next flushes again.
		s.written, s.flushAt = 0, staggerFlush(s.replicaID)
	}
	s.upd.meta = view.meta
	s.applied = last
	if s.observe != nil {
		for _, res := range handOffs {
			s.observe(s.shardID, res)
		}
	}
	if s.events != nil {
		s.events(s.shardID, last, events)
	}
	return entries, nil
}

// compactAfterDeletes is the fewest Deletes since the last compaction
// that make Update compact the database (valueCache.compactDue).
const compactAfterDeletes = 50_000

// compactDelay is how long after asking for it a compaction starts, so
// that one covers a whole sweep of expiries or forgets.
const compactDelay = 30 * time.Second

// compactLater compacts the whole database compactDelay from now, unless
// a compaction is pending already. Pebble picks compactions by level
// size, not by deletions: after a mass expiry (every dedup record and
// idle lock forgotten ten minutes later) the tombstones sit in the
// memtable and L0 above the records they delete, which nothing compacts
// while the database is small and quiet. After 200,000 one-second leases
// on a dev cluster, all forgotten, each replica kept 9 MB of tables and
// an 11 MB memtable of deleted records for good; compacted, its database
// is under 0.1 MB. A compaction changes only how the state is stored,
// never what a read or a snapshot sees.
func (s *StateMachine) compactLater() {
	if s.compactPending.CompareAndSwap(false, true) {
		s.compactTimer = time.AfterFunc(compactDelay, s.compact)
	}
}

// compact compacts the live database, unless the replica is closed.
// Reads and applies go on meanwhile; Close and RecoverFromSnapshot wait
// for it before they close the database (compacting). A compaction
// flushes the memtable first, and the replicas reach it at about the
// same index, so it asks Update to stagger their flushes again
// (compacted).
func (s *StateMachine) compact() {
	s.compacting.Lock()
	defer s.compacting.Unlock()
	s.mu.RLock()
	db := s.mu.db
	s.mu.RUnlock()
	s.compactPending.Store(false)
	if db != nil {
		// An error leaves the space to Pebble's own compactions; Pebble
		// reports a failed background write itself.
		_ = db.Compact([]byte{0}, []byte{0xff}, false)
		s.compacted.Store(true)
	}
}

func (s *StateMachine) applyEntry(view *records, b writeBatch, cmd []byte) (*shardv1.Result, []LockEvent, error) {
	env, err := DecodeCommand(cmd)
	if err != nil {
		if errors.Is(err, ErrUnsupportedVersion) {
			return nil, nil, err
		}
		return invalid("command", err.Error()), nil, nil
	}
	res, changes, err := Apply(view, env)
	if err != nil {
		return nil, nil, err
	}
	// The lock records each change replaces (putLock and deleteLock read
	// them before they write, through the batch, so after the entry's
	// earlier changes).
	type lockChange struct{ old, next *shardv1.LockRecord }
	var locks []lockChange
	if s.events != nil && !movesRecords(env) {
		view.lockWritten = func(old, next *shardv1.LockRecord) { locks = append(locks, lockChange{old, next}) }
		defer func() { view.lockWritten = nil }()
	}
	for _, c := range changes {
		if err := c.write(view, b); err != nil {
			return nil, nil, err
		}
	}
	var evs []LockEvent
	for _, l := range locks {
		// The shard's time as this entry left it.
		evs = append(evs, lockEvents(l.old, l.next, view.meta.GetLastNowUnixNano(), env.GetRevoke() != nil)...)
	}
	return res, evs, nil
}

// DecodeCommand decodes a proposed command. It never panics; a malformed
// command is an error wrapping nothing, a newer format ErrUnsupportedVersion.
func DecodeCommand(cmd []byte) (*shardv1.Envelope, error) {
	env := &shardv1.Envelope{}
	if err := proto.Unmarshal(cmd, env); err != nil {
		return nil, fmt.Errorf("malformed envelope: %v", err)
	}
	if env.GetVersion() > CommandVersion {
		return nil, fmt.Errorf("%w: %d", ErrUnsupportedVersion, env.GetVersion())
	}
	return env, nil
}

// EncodeCommand encodes an envelope for proposing.
func EncodeCommand(env *shardv1.Envelope) ([]byte, error) {
	return proto.Marshal(env)
}

// Lookup implements sm.IOnDiskStateMachine. The query is a *shardv1.Query,
// answered by a *shardv1.QueryResult, or an ExportQuery, answered by an
// *ExportedSnapshot.
func (s *StateMachine) Lookup(q any) (any, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.db == nil {
		return nil, errors.New("shard: state machine is closed")
	}
	snap := s.mu.db.NewSnapshot()
	defer snap.Close()
	if e, ok := q.(ExportQuery); ok {
		return export(snap, s.shardID, e.Path)
	}
	query, ok := q.(*shardv1.Query)
	if !ok {
		return nil, fmt.Errorf("shard: lookup of %T", q)
	}
	r := &records{g: snap, initial: initialMeta(s.shardID)}
	meta, err := r.Meta()
	if err != nil {
		return nil, err
	}
	now := max(query.GetNowUnixNano(), meta.GetLastNowUnixNano())
	out := &shardv1.QueryResult{TimeUnixNano: now, Meta: meta}
	switch qq := query.GetQuery().(type) {
	case *shardv1.Query_Describe:
		out.Lock, err = r.Lock(qq.Describe.GetResource())
		if err == nil { // the index the answer is current at: a watch's start
			out.AppliedIndex, err = appliedIndex(snap)
		}
	case *shardv1.Query_Dedup:
		out.Dedup, err = r.Dedup(qq.Dedup.GetResource(), qq.Dedup.GetRequestId())
	case *shardv1.Query_Expired:
		out.Expire, err = r.expired(now, int(qq.Expired.GetLimit()))
	case *shardv1.Query_Forgettable:
		out.Forget, err = r.forgettable(now, int(qq.Forgettable.GetLimit()))
	case *shardv1.Query_TimedOut:
		out.Drop, err = r.timedOut(now, int(qq.TimedOut.GetLimit()))
	case *shardv1.Query_Hot:
		out.Hot, err = r.hot(int(qq.Hot.GetLimit()))
	case *shardv1.Query_Export:
		e := qq.Export
		out.Records, out.Next, err = r.Records(e.GetStart(), e.GetEnd(), e.GetAfter(), int(max(e.GetLimit(), 1)))
	case *shardv1.Query_Quota:
		out.Levels, err = r.quotaLevels(qq.Quota.GetKey(), now)
		if err == nil {
			var pool *shardv1.PoolRecord
			pool, err = r.PoolRecord(keyspace.Pool(qq.Quota.GetKey()))
			out.LedgerSeq, out.Restored = pool.GetLastSeq(), pool.GetRestored()
		}
	case *shardv1.Query_Reservations:
		out.Reservations, err = r.openReservations(qq.Reservations, now)
	case *shardv1.Query_Ledger:
		out.Ledger, err = r.ledgerEvents(qq.Ledger)
		if err == nil && qq.Ledger.GetAfterSeq() == 0 {
			out.Checkpoints, err = r.checkpoints(qq.Ledger.GetKey())
		}
	case *shardv1.Query_Compactable:
		out.Compact, err = r.compactable(now, int(qq.Compactable.GetLimit()))
	case *shardv1.Query_Reclaimable:
		out.Reclaim, err = r.reclaimable(now, int(qq.Reclaimable.GetLimit()))
	case *shardv1.Query_Meta:
		out.AppliedIndex, err = appliedIndex(snap)
	case *shardv1.Query_Digest:
		out.AppliedIndex, err = appliedIndex(snap)
		if err == nil {
			out.Digest, err = digest(snap)
		}
	default:
		err = fmt.Errorf("shard: unknown query %T", qq)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// digest hashes every key and value of g in key order, each preceded by
// its length, but the marker keyPoolIDsBuilt: its value is each
// replica's own bookkeeping (when it last found its index complete).
func digest(g getter) ([]byte, error) {
	h := sha256.New()
	it := g.NewIter(nil)
	var n [binary.MaxVarintLen64]byte
	for it.First(); it.Valid(); it.Next() {
		if bytes.Equal(it.Key(), keyPoolIDsBuilt) {
			continue
		}
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(it.Key())))])
		h.Write(it.Key())
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(it.Value())))])
		h.Write(it.Value())
	}
	return h.Sum(nil), it.Close()
}

// Sync implements sm.IOnDiskStateMachine: it makes every applied batch
// durable.
func (s *StateMachine) Sync() error {
	defer s.fatalOnPanic()
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.mu.db.LogData(nil, pebble.Sync)
}

// PrepareSnapshot implements sm.IOnDiskStateMachine: it pins a Pebble
// snapshot of the current state for SaveSnapshot.
func (s *StateMachine) PrepareSnapshot() (any, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.mu.db.NewSnapshot(), nil
}

// SnapshotMagic begins the snapshot stream format: the magic line, then
// each key/value pair as uvarint(len(key)) key uvarint(len(value)) value,
// then uvarint(0) and the pair count as 8 bytes big-endian, so a
// truncated stream is detected.
const SnapshotMagic = "warden-shard-snapshot-v1\n"

// SaveSnapshot implements sm.IOnDiskStateMachine. It writes every key of
// the pinned snapshot (records, indexes, meta and applied index).
func (s *StateMachine) SaveSnapshot(ctx any, w io.Writer, stopc <-chan struct{}) error {
	snap := ctx.(*pebble.Snapshot)
	defer snap.Close()
	_, err := writeStream(snap, w, stopc)
	return err
}

// writeStream writes every key of g to w in the snapshot stream format
// and returns how many pairs it wrote.
func writeStream(g getter, w io.Writer, stopc <-chan struct{}) (uint64, error) {
	bw := bufio.NewWriterSize(w, 256<<10)
	if _, err := bw.WriteString(SnapshotMagic); err != nil {
		return 0, err
	}
	it := g.NewIter(nil)
	var n uint64
	var buf []byte
	for it.First(); it.Valid(); it.Next() {
		if bytes.Equal(it.Key(), keyPoolIDsBuilt) {
			continue // the receiver checks the index itself (buildPoolIDs)
		}
		if n%1024 == 0 {
			select {
			case <-stopc:
				it.Close()
				return n, sm.ErrSnapshotStopped
			default:
			}
		}
		buf = binary.AppendUvarint(buf[:0], uint64(len(it.Key())))
		buf = append(buf, it.Key()...)
		buf = binary.AppendUvarint(buf, uint64(len(it.Value())))
		buf = append(buf, it.Value()...)
		if _, err := bw.Write(buf); err != nil {
			it.Close()
			return n, err
		}
		n++
	}
	if err := it.Close(); err != nil {
		return n, err
	}
	buf = binary.AppendUvarint(buf[:0], 0)
	buf = binary.BigEndian.AppendUint64(buf, n)
	if _, err := bw.Write(buf); err != nil {
		return n, err
	}
	return n, bw.Flush()
}

// RecoverFromSnapshot implements sm.IOnDiskStateMachine: it loads the
// stream into a new database directory and switches to it atomically.
func (s *StateMachine) RecoverFromSnapshot(r io.Reader, stopc <-chan struct{}) error {
	s.mu.RLock()
	cur := s.mu.dbName
	s.mu.RUnlock()
	br := bufio.NewReaderSize(r, 256<<10)
	if magic, err := br.Peek(len(SnapshotMagic)); err != nil || string(magic) != SnapshotMagic {
		return fmt.Errorf("%w: bad header", ErrCorruptSnapshot)
	}
	next := nextDBName(cur)
	dir := filepath.Join(s.dir, next)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	db, err := openDB(dir, s.storage, s.fatal)
	if err != nil {
		return err
	}
	cache, err := loadSnapshot(db, dir, br, stopc)
	if err == nil {
		err = buildPoolIDs(db)
	}
	if err != nil {
		db.Close()
		os.RemoveAll(dir)
		return err
	}
	if err := db.LogData(nil, pebble.Sync); err != nil {
		db.Close()
		return err
	}
	if err := s.writeCurrent(next); err != nil {
		db.Close()
		return err
	}
	if err := s.setDB(db, next, 0, cache); err != nil { // its flushes already fall elsewhere
		return err
	}
	return os.RemoveAll(filepath.Join(s.dir, cur))
}

func nextDBName(cur string) string {
	n, _ := strconv.Atoi(strings.TrimPrefix(cur, "db-"))
	return "db-" + strconv.Itoa(n+1)
}

// loadSnapshot reads a snapshot stream into db, an empty database in
// dir, and returns a value cache for it whose filter counts the keys
// read. SaveSnapshot writes keys in order from a Pebble iterator, so they
// go straight into one sorted table, which db then ingests (as CockroachDB
// applies Raft snapshots): no write-ahead log, no memtable and no flush
// afterwards, and no second pass to count the keys. A stream whose keys
// do not strictly increase is corrupt.
//
// A restarted replica does this work while it catches up, on cores it may
// share with the quorum that serves, so it is done in one pass rather
// than batched, flushed and scanned again for the filter
// (BenchmarkRecoverFromSnapshot; figures in docs/perf/README.md).
func loadSnapshot(db *pebble.DB, dir string, r *bufio.Reader, stopc <-chan struct{}) (*valueCache, error) {
	magic := make([]byte, len(SnapshotMagic))
	if _, err := io.ReadFull(r, magic); err != nil || string(magic) != SnapshotMagic {
		return nil, fmt.Errorf("%w: bad header", ErrCorruptSnapshot)
	}
	path := filepath.Join(dir, "snapshot.sst")
	f, err := vfs.Default.Create(path)
	if err != nil {
		return nil, err
	}
	defer os.Remove(path) // the database links the table it ingests
	opts := dbOptions().EnsureDefaults()
	// The table lands on the last level of the empty database; every level
	// has the same table options (dbOptions), those of level 0.
	w := sstable.NewWriter(f, opts.MakeWriterOptions(0, db.FormatMajorVersion().MaxTableFormat()))
	cache := emptyValueCache(seededFingerprint())
	n, err := writeSnapshotTable(w, cache, r, stopc)
	if cerr := w.Close(); err == nil {
		err = cerr // Close syncs the file
	}
	if err != nil {
		return nil, err
	}
	var count [8]byte
	if _, err := io.ReadFull(r, count[:]); err != nil || binary.BigEndian.Uint64(count[:]) != n {
		return nil, fmt.Errorf("%w: stream ended after %d pairs without a matching count", ErrCorruptSnapshot, n)
	}
	return cache, db.Ingest([]string{path})
}

// writeSnapshotTable copies the stream's key/value pairs into w, noting
// each key in cache, up to the terminating zero length, and returns how
// many pairs it copied.
func writeSnapshotTable(w *sstable.Writer, cache *valueCache, r *bufio.Reader, stopc <-chan struct{}) (uint64, error) {
	var n uint64
	for ; ; n++ {
		if n%1024 == 0 {
			select {
			case <-stopc:
				return n, sm.ErrSnapshotStopped
			default:
			}
		}
		klen, err := binary.ReadUvarint(r)
		if err != nil {
			return n, fmt.Errorf("%w: %v", ErrCorruptSnapshot, err)
		}
		if klen == 0 {
			return n, nil
		}
		key, err := readN(r, klen)
		if err != nil {
			return n, err
		}
		vlen, err := binary.ReadUvarint(r)
		if err != nil {
			return n, fmt.Errorf("%w: %v", ErrCorruptSnapshot, err)
		}
		val, err := readN(r, vlen)
		if err != nil {
			return n, err
		}
		if err := w.Set(key, val); err != nil {
			return n, fmt.Errorf("%w: pair %d: %v", ErrCorruptSnapshot, n, err)
		}
		cache.noteStored(key)
	}
}

// maxSnapshotField bounds one key or value read from a snapshot stream,
// so a corrupt length cannot make the reader allocate without limit.
const maxSnapshotField = 64 << 20

func readN(r io.Reader, n uint64) ([]byte, error) {
	if n > maxSnapshotField {
		return nil, fmt.Errorf("%w: field of %d bytes", ErrCorruptSnapshot, n)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptSnapshot, err)
	}
	return buf, nil
}

// Close implements sm.IOnDiskStateMachine.
func (s *StateMachine) Close() error {
	if s.compactTimer != nil {
		s.compactTimer.Stop()
	}
	s.compacting.Lock()
	defer s.compacting.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.db == nil {
		return nil
	}
	err := markPoolIDs(s.mu.db)
	if cerr := s.mu.db.Close(); err == nil {
		err = cerr
	}
	s.mu.db = nil
	s.release()
	if s.closed != nil {
		s.closed(s.shardID)
	}
	return err
}

// fatalOnPanic, deferred, tells Hooks.Fatal of a panic before it goes
// on: Pebble panics, rather than return an error, when a commit's write
// to its write-ahead log fails (a full disk), and its database is
// unusable after.
func (s *StateMachine) fatalOnPanic() {
	if r := recover(); r != nil {
		if s.fatal != nil {
			s.fatal(fmt.Sprint(r))
		}
		panic(r)
	}
}

// quietLogger drops Pebble's informational logging; fatal errors still
// stop the process, told to fatal first (if set).
type quietLogger struct{ fatal func(string) }

func (quietLogger) Infof(string, ...any) {}
func (l quietLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if l.fatal != nil {
		l.fatal(msg)
	}
	panic(msg)
}
