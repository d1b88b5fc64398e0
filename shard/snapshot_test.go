package shard

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// dump lists every key and value of a replica's database but the
// replica's own marker keyPoolIDsBuilt (as digest).
func dump(t testing.TB, r *replica) string {
	t.Helper()
	var b bytes.Buffer
	r.sm.mu.RLock()
	defer r.sm.mu.RUnlock()
	it := r.sm.mu.db.NewIter(&pebble.IterOptions{})
	for it.First(); it.Valid(); it.Next() {
		if bytes.Equal(it.Key(), keyPoolIDsBuilt) {
			continue
		}
		fmt.Fprintf(&b, "%q=%x\n", it.Key(), it.Value())
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func fill(r *replica) {
	now := int64(1_700_000_000) * second
	for i := range 50 {
		res := fmt.Sprintf("r%d", i%7)
		out := r.propose(now, acquireCmd(res, fmt.Sprintf("q%d", i), 0, "h", bytes.Repeat([]byte{byte(i)}, 16)))
		if i%3 == 0 && out.GetCode() == shardv1.Code_CODE_OK {
			r.propose(now, releaseCmd(res, out.GetLease().GetLeaseId()))
		}
		now += second
	}
	// Reservations of two keys of a pool, one of them released: their
	// records and indexes (the pool index of ids among them) travel too.
	r.propose(now, &shardv1.Envelope{Command: &shardv1.Envelope_SetLimit{SetLimit: &shardv1.SetLimitCmd{Key: "pool", Limit: 100}}})
	for i, key := range []string{"pool/a", "pool/b"} {
		id := fmt.Sprintf("v%d", i)
		r.propose(now, reserveCmd(key, id, 5))
		if i == 0 {
			r.propose(now, &shardv1.Envelope{Command: &shardv1.Envelope_ReleaseReservation{ReleaseReservation: &shardv1.ReleaseReservationCmd{Key: key, ReservationId: id}}})
		}
	}
}

func reserveCmd(key, id string, amount int64) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_Reserve{Reserve: &shardv1.ReserveCmd{Key: key, ReservationId: id, Amount: amount}}}
}

func snapshotOf(t testing.TB, r *replica) []byte {
	t.Helper()
	ctx, err := r.sm.PrepareSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := r.sm.SaveSnapshot(ctx, &buf, nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestSnapshotRoundTrip(t *testing.T) {
	src := newReplica(t)
	fill(src)
	snap := snapshotOf(t, src)

	dst := newReplica(t)
	dst.propose(1, acquireCmd("stale", "x", 0, "", make([]byte, 16))) // state to be replaced
	if err := dst.sm.RecoverFromSnapshot(bytes.NewReader(snap), nil); err != nil {
		t.Fatal(err)
	}
	if a, b := dump(t, src), dump(t, dst); a != b {
		t.Fatalf("recovered state differs:\n%s\nvs\n%s", a, b)
	}
	// The swap survives a reopen, and Open reports the snapshot's index.
	dst.sm.Close()
	dst.open()
	if dst.index != src.index {
		t.Fatalf("applied index %d after reopen, want %d", dst.index, src.index)
	}
	if a, b := dump(t, src), dump(t, dst); a != b {
		t.Fatal("state differs after reopen")
	}
}

// A database that a binary older than the pool index of reservation ids
// wrote to has the index built when it is opened, so envelope version 10
// refuses an id that a reservation made by that binary holds on another
// key of the pool: one that never had the index (no marker), and one the
// old binary applied entries to after this binary closed it (the marker
// holds an older applied index). A snapshot stream never carries the
// marker, so a recovered replica builds its own.
func TestPoolIDIndexBuiltOnOpen(t *testing.T) {
	r := newReplica(t)
	fill(r)
	want := dump(t, r)
	for _, c := range []struct {
		name   string
		marker bool // the marker stays; the old binary applies one entry
	}{{"no marker", false}, {"stale marker", true}} {
		r.sm.Close()
		dir, err := os.ReadFile(filepath.Join(r.sm.dir, currentFile))
		if err != nil {
			t.Fatal(err)
		}
		db, err := openDB(filepath.Join(r.sm.dir, strings.TrimSpace(string(dir))), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		b := db.NewBatch()
		it := db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixPoolID}, UpperBound: []byte{prefixPoolID + 1}})
		n := 0
		for it.First(); it.Valid(); it.Next() {
			_ = b.Delete(it.Key(), nil)
			n++
		}
		_ = it.Close()
		if c.marker {
			_ = b.Set(keyApplied, binary.BigEndian.AppendUint64(nil, r.index+1), nil)
		} else {
			_ = b.Delete(keyPoolIDsBuilt, nil)
		}
		if err := b.Commit(pebble.Sync); err != nil || n != 2 {
			t.Fatalf("%s: removing the index (%d entries, want 2): %v", c.name, n, err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		r.open()
		if c.marker {
			want = strings.Replace(want, fmt.Sprintf("%q=%016x", keyApplied, r.index-1), fmt.Sprintf("%q=%016x", keyApplied, r.index), 1)
		}
		if got := dump(t, r); got != want {
			t.Fatalf("%s: reopened without the index, the state is\n%s\nwant\n%s", c.name, got, want)
		}
	}
	if res := r.propose(t0+int64(time.Hour), reserveCmd("pool/c", "v1", 1)); res.GetCode() != shardv1.Code_CODE_INVALID_ARGUMENT || res.GetField() != "reservation_id" {
		t.Fatalf("Reserve(pool/c, v1), v1 held by pool/b since before the index: %v, want invalid_argument naming reservation_id", res)
	}
	stream := bufio.NewReader(bytes.NewReader(snapshotOf(t, r)[len(SnapshotMagic):]))
	for {
		k, err := readPair(stream)
		if err != nil {
			t.Fatal(err)
		}
		if k == nil {
			break
		}
		if bytes.Equal(k, keyPoolIDsBuilt) {
			t.Fatal("the snapshot stream carries the index marker")
		}
	}
}

// readPair reads one key/value pair of a snapshot stream and returns its
// key, or nil at the stream's end.
func readPair(r *bufio.Reader) ([]byte, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil || n == 0 {
		return nil, err
	}
	k, err := readN(r, n)
	if err != nil {
		return nil, err
	}
	if n, err = binary.ReadUvarint(r); err == nil {
		_, err = readN(r, n)
	}
	return k, err
}

func TestCorruptSnapshotKeepsState(t *testing.T) {
	src := newReplica(t)
	fill(src)
	snap := snapshotOf(t, src)
	// Keys out of order (the loader writes them straight into a sorted
	// table), and a key twice.
	stream := func(keys ...string) []byte {
		b := []byte(SnapshotMagic)
		for _, k := range keys {
			b = binary.AppendUvarint(b, uint64(len(k)))
			b = append(b, k...)
			b = binary.AppendUvarint(b, 1)
			b = append(b, 'v')
		}
		b = binary.AppendUvarint(b, 0)
		return binary.BigEndian.AppendUint64(b, uint64(len(keys)))
	}
	if err := newReplica(t).sm.RecoverFromSnapshot(bytes.NewReader(stream("b", "c")), nil); err != nil {
		t.Fatalf("a well-formed stream: %v", err) // the helper itself is right
	}
	dst := newReplica(t)
	dst.propose(1, acquireCmd("mine", "x", 0, "", make([]byte, 16)))
	before := dump(t, dst)
	for _, bad := range [][]byte{nil, snap[:len(snap)/2], snap[:len(snap)-3], append([]byte("nope"), snap...),
		stream("c", "b"), stream("b", "b")} {
		err := dst.sm.RecoverFromSnapshot(bytes.NewReader(bad), nil)
		if !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("recover from %d bytes: %v, want ErrCorruptSnapshot", len(bad), err)
		}
		if dump(t, dst) != before {
			t.Fatal("a failed recovery changed the state")
		}
	}
}

func TestCheckName(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"orders/42", true},
		{"é/ü", true},
		{string(bytes.Repeat([]byte("x"), 256)), true},
		{string(bytes.Repeat([]byte("x"), 257)), false},
		{"", false},
		{"a\x00b", false},
		{"a\nb", false},
		{"a\u0085b", false}, // C1 control
		{"a\u202eb", false}, // right-to-left override
		{"a\u200bb", false}, // zero-width space
		{"a\u2028b", false}, // line separator
		{"a\uffffb", false}, // noncharacter
		{"日本/ü-ß_1 x", true},
		{"a\xffb", false},
	} {
		err := CheckName("resource", tc.in, MaxResourceBytes)
		if (err == nil) != tc.ok {
			t.Errorf("CheckName(%q) = %v", tc.in, err)
		}
		var fe *FieldError
		if err != nil && (!errors.As(err, &fe) || fe.Field != "resource") {
			t.Errorf("CheckName(%q) error %v does not name the field", tc.in, err)
		}
	}
}

func TestTokenLayout(t *testing.T) {
	tok := Token(MaxEpoch, MaxRevision)
	if tok >= 1<<63 {
		t.Fatalf("largest token %d does not fit a signed BIGINT", tok)
	}
	if e, r := SplitToken(tok); e != MaxEpoch || r != MaxRevision {
		t.Fatalf("SplitToken = %d, %d", e, r)
	}
	if Token(2, 0) <= Token(1, MaxRevision) {
		t.Fatal("a new epoch does not dominate the old epoch's revisions")
	}
}

// When the revision space is used up the shard refuses grants rather
// than wrap around; a new epoch (NewEpochCmd, version 6) lets them go on,
// with tokens above every earlier one. An older or equal epoch never
// resets the revision, and an envelope older than version 6 does not know
// the command.
func TestRevisionExhaustedTakesNewEpoch(t *testing.T) {
	r := newReplica(t)
	meta := initialMeta(1)()
	meta.Revision = MaxRevision
	cache, err := newValueCache(r.sm.mu.db)
	if err != nil {
		t.Fatal(err)
	}
	b := writeBatch{r.sm.mu.db.NewBatch(), cache}
	if err := set(b, keyMeta, meta); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	r.sm.Close()
	r.open()
	res := r.propose(1, acquireCmd("x", "q", 0, "", make([]byte, 16)))
	if res.GetCode() != shardv1.Code_CODE_UNAVAILABLE {
		t.Fatalf("grant at the last revision: %v", res)
	}
	newEpoch := func(epoch uint64) *shardv1.Envelope {
		return &shardv1.Envelope{Command: &shardv1.Envelope_NewEpoch{NewEpoch: &shardv1.NewEpochCmd{Epoch: epoch}}}
	}
	r.version = VersionNewEpoch - 1
	if res := r.propose(1, newEpoch(meta.GetEpoch()+1)); res.GetCode() != shardv1.Code_CODE_INVALID_ARGUMENT {
		t.Fatalf("new_epoch in a version %d envelope: %v, want invalid_argument", r.version, res)
	}
	r.version = 0
	if res := r.propose(1, newEpoch(meta.GetEpoch())); res.GetCode() != shardv1.Code_CODE_OK || !res.GetReplayed() {
		t.Fatalf("the current epoch again: %v, want a replay", res)
	}
	if res := r.propose(1, newEpoch(meta.GetEpoch()-1)); res.GetCode() != shardv1.Code_CODE_INVALID_ARGUMENT || res.GetField() != "epoch" {
		t.Fatalf("an older epoch: %v, want invalid_argument naming epoch", res)
	}
	if res := r.propose(1, acquireCmd("x", "q", 0, "", make([]byte, 16))); res.GetCode() != shardv1.Code_CODE_UNAVAILABLE {
		t.Fatalf("after refused epochs the revision is still spent: %v", res)
	}
	if res := r.propose(1, newEpoch(meta.GetEpoch()+5)); res.GetCode() != shardv1.Code_CODE_OK || res.GetReplayed() {
		t.Fatalf("a new epoch: %v", res)
	}
	res = r.propose(1, acquireCmd("x", "q", 0, "", make([]byte, 16)))
	if res.GetCode() != shardv1.Code_CODE_OK || res.GetLease().GetFencingToken() != Token(meta.GetEpoch()+5, 1) {
		t.Fatalf("grant in the new epoch: %v, want token %#x", res, Token(meta.GetEpoch()+5, 1))
	}
	if res.GetLease().GetFencingToken() <= Token(meta.GetEpoch(), MaxRevision) {
		t.Fatal("the new epoch's first token is not above the old epoch's last")
	}
}

// BenchmarkRecoverFromSnapshot loads a snapshot the size of the reference
// load's after a minute (100,000 lock records, 80,000 of them released,
// each with its acquire's dedup record: 46 MB) into a replica, and
// counts the process's CPU time until the data sits in tables (so work a
// memtable would defer to its flush counts too): cpu-ms/op. This is the
// work a restarted replica does while it catches up, on cores it shares
// with the quorum that serves.
func BenchmarkRecoverFromSnapshot(b *testing.B) {
	src := newReplica(b)
	now := int64(1_700_000_000) * second
	for i := range 100_000 {
		res := fmt.Sprintf("loadtest/resource-%06d", i)
		id := leaseID(fmt.Sprintf("l%d", i))
		src.propose(now, acquireCmd(res, fmt.Sprintf("acquire-%d-%032d", i, i), 30*second, "worker-0001", id))
		if i%5 != 0 {
			src.propose(now, releaseCmd(res, id))
		}
		now += 10 * time.Microsecond.Nanoseconds()
	}
	snap := snapshotOf(b, src)
	dst := newReplica(b)
	b.SetBytes(int64(len(snap)))
	start := processCPU(b)
	b.ResetTimer()
	for b.Loop() {
		if err := dst.sm.RecoverFromSnapshot(bytes.NewReader(snap), nil); err != nil {
			b.Fatal(err)
		}
		dst.sm.mu.RLock()
		err := dst.sm.mu.db.Flush()
		dst.sm.mu.RUnlock()
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(processCPU(b)-start)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
}

// processCPU is the CPU time the test process has used, on all its
// threads (Pebble's flushes and log writer included).
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
