package shard

import "testing"

// AppliedIndexOf reads a closed replica's applied index from its
// directory, the writes still in the write-ahead log included; a
// directory with no state is at 0.
func TestAppliedIndexOf(t *testing.T) {
	dir := t.TempDir()
	if idx, err := AppliedIndexOf(ReplicaDir(dir, FirstShard, 1)); err != nil || idx != 0 {
		t.Fatalf("no state: %d, %v", idx, err)
	}
	r := openReplica(t, dir, FirstShard)
	for range 3 {
		r.propose(1, acquireCmd("r", "q", 1e9, "h", nil))
	}
	want := r.sm.applied
	if err := r.sm.Close(); err != nil {
		t.Fatal(err)
	}
	if idx, err := AppliedIndexOf(ReplicaDir(dir, FirstShard, 1)); err != nil || idx != want || want == 0 {
		t.Fatalf("AppliedIndexOf: %d, %v; want %d", idx, err, want)
	}
}
