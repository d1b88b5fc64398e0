package rpc_test

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/internal/realtime"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/server"
)

// heldLocks reads the shards' held-lock counts.
func (c *cluster) heldLocks() uint64 {
	c.t.Helper()
	admin := wardenv1connect.NewAdminServiceClient(c.srv.Client(), c.srv.URL)
	resp, err := admin.ListShards(ctx(c.t), connect.NewRequest(&wardenv1.ListShardsRequest{}))
	if err != nil {
		c.t.Fatal(err)
	}
	var n uint64
	for _, s := range resp.Msg.GetShards() {
		n += s.GetHeldLocks()
	}
	return n
}

// Case L21 and the expiry backlog: a fleet's leases, cut off at once,
// expire together while other clients renew and a waiter queues behind
// the last of them. The sweep expires batch after batch while they come
// full, and the locks that waiters queue for come first, so the waiter
// is granted within rule 6's bound (expiry + max_clock_skew + one scan
// interval) plus 1 s, however many expired leases nobody waits for are
// pending, and the whole backlog is gone within 5 s of its expiry. The
// renewers never fail. Before: one batch of 256 per 250 ms tick, about
// 1,000 leases a second; the waiter waited its turn behind the backlog.
// make test runs 5,000 leases; make soak (WARDEN_SOAK=1) the case's
// 20,000.
func TestMassExpiry(t *testing.T) {
	fleet := 5_000
	if os.Getenv("WARDEN_SOAK") != "" {
		fleet = 20_000
	}
	const scan, skew, ttl = 250 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second
	c := startCluster(t, server.DevConfig{Router: router.Config{ScanInterval: scan}})

	// 200 other clients (20 at the reduced scale) hold and renew.
	others := fleet / 100
	leases := map[string]string{}
	for i := range others {
		r := fmt.Sprintf("other-%d", i)
		leases[r] = c.mustAcquire(r, "o", 5*time.Second).GetLeaseId()
	}
	// They renew from now on, every 500 ms of their 5 s TTL: through the
	// fleet's acquisition too, which on a loaded machine (the race
	// detector, other packages' tests) can take longer than their TTL.
	var mu sync.Mutex
	var renewals []time.Duration
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r, id := range leases {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(500 * time.Millisecond):
				}
				start := time.Now()
				if _, err := c.renew(r, id); err != nil {
					t.Errorf("renew %s during the mass expiry: %v", r, err)
					return
				}
				mu.Lock()
				renewals = append(renewals, time.Since(start))
				mu.Unlock()
			}
		})
	}
	var last time.Time
	for start := 0; start < fleet; start += 1000 {
		var ops []*wardenv1.BatchOp
		for i := start; i < min(start+1000, fleet); i++ {
			op := acquireOp(fmt.Sprintf("fleet-%05d", i), "f")
			op.GetAcquire().LeaseTtl = durationpb.New(ttl)
			ops = append(ops, op)
		}
		out, err := c.batch(ops...)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range out {
			if o.GetCode() != "" {
				t.Fatalf("fleet acquire: %v", o)
			}
			last = o.GetAcquire().GetExpiresAt().AsTime()
		}
	}
	// The waited lock expires last of all.
	held := c.mustAcquire("waited", "a", ttl)
	type grant struct {
		resp *wardenv1.AcquireResponse
		err  error
		at   time.Time
	}
	granted := make(chan grant, 1)
	go func() {
		resp, err := c.acquireWait(ctx(t), "waited", "w", 10*time.Second, 10*time.Second)
		granted <- grant{resp, err, time.Now()}
	}()
	waitFor(t, func() bool { return c.describe("waited").GetWaiters() == 1 })

	g := <-granted
	if g.err != nil {
		t.Fatalf("waiter: %v", g.err)
	}
	due := held.GetExpiresAt().AsTime()
	// Safety, however slow the machine: not before expiry plus the skew
	// bound. Liveness, on a machine that gives the test its CPUs: within
	// rule 6's bound plus 1 s, however many expired leases are pending.
	if g.at.Before(due.Add(skew)) {
		t.Fatalf("the waiter was granted at %v, before its lock's lease expired (%v) plus the skew bound", g.at, due)
	}
	realtime.Within(t, fmt.Sprintf("the waiter's grant after its lock's lease expired, %d expired leases pending", fleet), g.at.Sub(due), skew+scan+time.Second)
	// The backlog drains (waited on for up to a minute; the bound is
	// the machine's).
	waitUntil(t, time.Minute, func() bool { return c.heldLocks() <= uint64(others+1) })
	drained := time.Since(last)
	realtime.Within(t, "the fleet's backlog gone after its leases expired", drained, skew+5*time.Second)
	close(stop)
	wg.Wait()
	slices.Sort(renewals)
	if len(renewals) == 0 {
		t.Fatal("no renewal ran during the expiry")
	}
	t.Logf("%d leases expired within %v of their expiry (skew %v included); %d renewals by the others, p99 %v, max %v",
		fleet, drained.Round(time.Millisecond), skew, len(renewals), renewals[len(renewals)*99/100], renewals[len(renewals)-1])
}
