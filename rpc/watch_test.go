package rpc

import (
	"errors"
	"testing"

	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/shard"
)

// FuzzDecodeCursor: a watch cursor from a client never panics the
// decoder; what it accepts encodes back to the same string, and what it
// refuses is an invalid_argument naming the field.
func FuzzDecodeCursor(f *testing.F) {
	f.Add(encodeCursor(1, router.Cursor{Index: 42, Next: 2}))
	f.Add(encodeCursor(1<<63, router.Cursor{Index: 1<<64 - 1, Next: 1<<32 - 1}))
	f.Add("w1.")
	f.Add("w1.AAAA")
	f.Add("w2.AQIDBA")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		c, shardID, err := decodeCursor(s)
		if err != nil {
			var fe *shard.FieldError
			if !errors.As(err, &fe) || fe.Field != "cursor" {
				t.Fatalf("%q: %v, want a field error naming cursor", s, err)
			}
			return
		}
		if shardID == 0 {
			t.Fatalf("%q: accepted shard 0", s)
		}
		if back := encodeCursor(shardID, c); back != s {
			t.Fatalf("%q decodes to shard %d %+v, which encodes to %q", s, shardID, c, back)
		}
	})
}
