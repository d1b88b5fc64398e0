package placement

import (
	"testing"
	"time"
)

// A kind of Raft message passes once, then at most once per interval,
// saying how many were dropped; other kinds are not held back by it.
func TestLogLimiter(t *testing.T) {
	now := time.Unix(0, 0)
	l := newLogLimiter(30*time.Second, func() time.Time { return now })
	if ok, _ := l.allow("dial"); !ok {
		t.Fatal("the first record of a kind was dropped")
	}
	for range 100 {
		now = now.Add(100 * time.Millisecond)
		if ok, _ := l.allow("dial"); ok {
			t.Fatalf("a second record within the interval passed at %v", now)
		}
	}
	if ok, _ := l.allow("batch"); !ok {
		t.Fatal("another kind was held back")
	}
	now = now.Add(20 * time.Second) // 30 s after the first
	ok, dropped := l.allow("dial")
	if !ok || dropped != 100 {
		t.Fatalf("after the interval: passed %v, dropped %d; want true, 100", ok, dropped)
	}
	if ok, _ := l.allow("dial"); ok {
		t.Fatal("the interval did not restart")
	}
}
