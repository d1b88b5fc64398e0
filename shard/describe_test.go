package shard

import (
	"fmt"
	"testing"
	"time"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// Issue 41, fault 1: Describe must show a lease held for as long as an
// Acquire by someone else would be refused as held (DESIGN.md §3). The
// black-box reproduction: a 3 s lease granted by a leader with a good
// clock; 1.2 s before its expiry the shard's leadership goes to a node
// whose clock runs 2 s ahead, which cannot stamp commands (its clock is
// not confirmed, DESIGN.md "Time") but serves linearizable reads, while
// Acquires are stamped by leaders with good clocks. Here every 20 ms of
// real time a Describe is read at the skewed leader's clock and an
// Acquire by another holder is stamped with the good clock. Before the
// fix Describe decided by the reading clock and showed the lock free
// for the 2 s before its expiry plus max_clock_skew while every Acquire
// was refused as held.
func TestDescribeHoldsUntilGrantable(t *testing.T) {
	r := newReplica(t)
	const ttl, offset, step = 3 * time.Second, 2 * time.Second, 20 * time.Millisecond
	start := int64(1_000_000_000_000)
	if res := r.propose(start, acquireCmd("r", "a", int64(ttl), "a", leaseID("a"))); res.GetCode() != shardv1.Code_CODE_OK {
		t.Fatalf("acquire: %v", res)
	}
	describe := func(readClock int64) *shardv1.QueryResult {
		return r.query(readClock, &shardv1.Query{Query: &shardv1.Query_Describe{Describe: &shardv1.DescribeQuery{Resource: "r"}}})
	}
	first := describe(start)
	expires, skew := first.GetLock().GetExpiresAtUnixNano(), first.GetMeta().GetConfig().GetMaxClockSkewNanos()
	if skew <= 0 || skew >= int64(offset) {
		t.Fatalf("max_clock_skew %v: the test needs one in (0, %v)", time.Duration(skew), offset)
	}
	ahead := 0 // refusals while the reading clock was past expiry + skew
	granted := false
	for i, now := 0, start; !granted; i, now = i+1, now+int64(step) {
		d := describe(now + int64(offset))
		held := DescribeHolds(d)
		res := r.propose(now, acquireCmd("r", fmt.Sprintf("b-%d", i), int64(ttl), "b", leaseID(fmt.Sprintf("b-%d", i))))
		switch res.GetCode() {
		case shardv1.Code_CODE_CONFLICT:
			if !held {
				t.Fatalf("%v after the grant, %v before expiry + skew: Describe shows the lock free, and an Acquire by another holder is refused: %v",
					time.Duration(now-start), time.Duration(expires+skew-now), res.GetReason())
			}
			if now+int64(offset) >= expires+skew {
				ahead++
			}
		case shardv1.Code_CODE_OK:
			granted = true
			if now < expires+skew {
				t.Fatalf("granted %v before expiry + skew", time.Duration(expires+skew-now))
			}
		default:
			t.Fatalf("acquire by b: %v", res)
		}
	}
	if ahead == 0 {
		t.Fatal("no Acquire was refused while the reading clock was past expiry + skew: the test did not exercise a clock ahead")
	}

	// With no command after the grant, the shard's time stands still:
	// Describe shows the lease held, however far ahead the reading clock,
	// until the expiry sweep's command applies a time past expiry + skew.
	if res := r.propose(start+int64(time.Minute), acquireCmd("idle", "c", int64(ttl), "c", leaseID("c"))); res.GetCode() != shardv1.Code_CODE_OK {
		t.Fatalf("acquire idle: %v", res)
	}
	idle := func(readClock int64) bool {
		return DescribeHolds(r.query(readClock, &shardv1.Query{Query: &shardv1.Query_Describe{Describe: &shardv1.DescribeQuery{Resource: "idle"}}}))
	}
	due := start + int64(time.Minute) + int64(ttl) + skew
	if !idle(due + int64(time.Hour)) {
		t.Fatal("an idle shard's lease shows free by the reading clock before any command applied its expiry")
	}
	exp := r.query(due, &shardv1.Query{Query: &shardv1.Query_Expired{Expired: &shardv1.ScanQuery{Limit: 16}}})
	if res := r.propose(due, &shardv1.Envelope{Command: &shardv1.Envelope_Expire{Expire: exp.GetExpire()}}); res.GetCount() == 0 {
		t.Fatalf("expire: %v", res)
	}
	if idle(due) {
		t.Fatal("the lease shows held after the sweep expired it")
	}
}
