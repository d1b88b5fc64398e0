package placement

import "testing"

// The bound reaches Dragonboat's raft package: its own default (64 MiB)
// is replaced at init, and a variable that were not Dragonboat's would
// read 0.
func TestReplicateBound(t *testing.T) {
	if replicateBytes != maxReplicateBytes {
		t.Fatalf("Dragonboat's Replicate bound is %d bytes, want %d", replicateBytes, maxReplicateBytes)
	}
}
