package keyspace

import "testing"

// The rule is part of the log format: a change to it would move keys
// between shards of a running cluster. These are XXH64 test vectors
// (seed 0).
func TestPlacementIsPinned(t *testing.T) {
	for key, want := range map[string]uint64{"": 0xef46db3751d8e999, "abc": 0x44bc2cf5ad770999} {
		if got := Hash(key); got != want {
			t.Errorf("Hash(%q) = %#x, want %#x", key, got, want)
		}
	}
	for key, want := range map[string]string{"team-a/batch/gpu": "team-a", "solo": "solo", "/x": ""} {
		if got := Pool(key); got != want {
			t.Errorf("Pool(%q) = %q, want %q", key, got, want)
		}
	}
	for _, c := range []struct {
		start, end, h uint64
		want          bool
	}{{0, 0, 0, true}, {0, 0, ^uint64(0), true}, {10, 20, 9, false}, {10, 20, 10, true}, {10, 20, 20, false}, {1 << 63, 0, ^uint64(0), true}} {
		if got := Contains(c.start, c.end, c.h); got != c.want {
			t.Errorf("Contains(%d, %d, %d) = %v, want %v", c.start, c.end, c.h, got, c.want)
		}
	}
}
