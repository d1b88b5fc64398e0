package rpc_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/anishathalye/porcupine"
	"github.com/lni/dragonboat/v4"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/internal/lockmodel"
	"github.com/warden-dev/warden/placement"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/server"
)

// A lock model with lease expiry for porcupine. Leases are short, clients
// renew some and abandon others, so locks change hands by expiry too.
// Real time is part of each operation (call time in the input, return
// time in the output, nanoseconds since the test began), and the server's
// clock is this process's, so the model knows when a lease may have ended:
// a lease granted or renewed by a call at time c, answered at r, expires
// at some moment in [c+ttl, r+ttl] (DESIGN.md rule 6), and the lock can go
// to someone else only max_clock_skew after that.
const (
	leaseTTL  = 1500 * time.Millisecond
	leaseSkew = 500 * time.Millisecond // the shards' default max_clock_skew
	// clockSlack absorbs the difference between this test's clock
	// readings and the leader's (same host, different reads).
	clockSlack = 20 * time.Millisecond
	// sweepLag bounds how long after expiry + skew Describe may still
	// show a lease held: it decides by the shard's time, which an idle
	// shard's leader advances with the expiry sweep, one scan interval
	// (250 ms) plus a commit on a loaded machine (DESIGN.md §3).
	sweepLag = time.Second
)

type leaseState struct {
	holder          string // lease id, "" when free
	token           uint64
	expLow, expHigh int64 // the holder's lease ends in [expLow, expHigh]
}

type leaseIn struct {
	op       string // acquire, renew, release, describe
	resource string
	leaseID  string // renew, release
	call     int64
}

type leaseOut struct {
	ok      bool   // acquire granted, renew succeeded, release released
	known   bool   // release: the answer was learned on the first try
	leaseID string // acquire
	token   uint64 // acquire (grant or holder's), describe
	held    bool   // describe
	ret     int64
}

// mayHaveEnded reports whether the holder's lease may have ended by t.
func (s leaseState) mayHaveEnded(t int64) bool { return t >= s.expLow-int64(clockSlack) }

// mayHold reports whether the holder's lease may still keep others out at
// t (until its expiry plus the skew bound).
func (s leaseState) mayHold(t int64) bool {
	return s.holder != "" && t <= s.expHigh+int64(leaseSkew+clockSlack)
}

var leaseModel = porcupine.NondeterministicModel{
	Partition: lockmodel.ByResource(func(in any) string { return in.(leaseIn).resource }),
	Init:      func() []any { return []any{leaseState{}} },
	Step: func(s, in, out any) []any {
		st, i, o := s.(leaseState), in.(leaseIn), out.(leaseOut)
		ttl := int64(leaseTTL)
		switch i.op {
		case "acquire":
			if o.ok {
				// Rules 1, 2, 6: free, or the holder's lease ended and the
				// skew bound passed, and a strictly higher token.
				free := st.holder == "" || o.ret >= st.expLow+int64(leaseSkew-clockSlack)
				if !free || o.token <= st.token {
					return nil
				}
				return []any{leaseState{holder: o.leaseID, token: o.token, expLow: i.call + ttl, expHigh: o.ret + ttl}}
			}
			if o.token == st.token && st.mayHold(i.call) {
				return []any{st}
			}
			return nil
		case "renew":
			if o.ok {
				if st.holder != i.leaseID || i.call > st.expHigh+int64(clockSlack) {
					return nil // a renewal of a lease that was over or not current
				}
				st.expLow, st.expHigh = max(st.expLow, i.call+ttl), o.ret+ttl
				return []any{st}
			}
			if st.holder == i.leaseID && !st.mayHaveEnded(o.ret) {
				return nil // refused while certainly current
			}
			return []any{st}
		case "release":
			isHolder := st.holder == i.leaseID && i.call <= st.expHigh+int64(clockSlack)
			freed := leaseState{token: st.token}
			switch {
			case o.known && o.ok:
				if !isHolder {
					return nil
				}
				return []any{freed}
			case o.known:
				if st.holder == i.leaseID && !st.mayHaveEnded(o.ret) {
					return nil
				}
				return []any{st}
			}
			// Learned only through retries: released, or found over.
			if isHolder {
				return []any{freed, st}
			}
			return []any{st}
		case "describe":
			if o.token != st.token {
				return nil
			}
			if o.held && st.holder != "" && i.call <= st.expHigh+int64(leaseSkew+clockSlack+sweepLag) || !o.held && (st.holder == "" || o.ret >= st.expLow+int64(leaseSkew-clockSlack)) {
				return []any{st}
			}
			return nil
		}
		return nil
	},
	DescribeOperation: func(in, out any) string { return fmt.Sprintf("%+v -> %+v", in, out) },
}

// TestLinearizableLeasesThroughSplitAndLeaderKill records concurrent
// Acquire, Renew, Release and Describe with short leases (some renewed,
// some abandoned to expire) on a few resources, while the data shard is
// split and then a shard leader's replica is stopped and restarted, and
// checks the history against the lease model, per resource.
func TestLinearizableLeasesThroughSplitAndLeaderKill(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	admin := wardenv1connect.NewAdminServiceClient(c.srv.Client(), c.srv.URL)
	resources := []string{"lease/a", "lease/b", "lease/c", "lease/d", "lease/e", "lease/f"}
	var (
		mu      sync.Mutex
		history []porcupine.Operation
	)
	start := time.Now()
	since := func() int64 { return int64(time.Since(start)) }
	record := func(client int, in leaseIn, out leaseOut) {
		out.ret = since()
		mu.Lock()
		history = append(history, porcupine.Operation{ClientId: client, Input: in, Call: in.call, Output: out, Return: out.ret})
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer halt() // also when the test fails early: the clients must end before the cluster closes
	const clients = 6
	for cl := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(cl), 11))
			mine := map[string]string{}
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				r := resources[rng.IntN(len(resources))]
				for held := range mine { // work on held leases half the time
					if rng.IntN(2) == 0 {
						r = held
					}
					break
				}
				in := leaseIn{resource: r, call: since()}
				switch k := rng.IntN(10); {
				case k < 3 && mine[r] == "":
					in.op = "acquire"
					o, ok := linAcquire(c, r, fmt.Sprintf("c%d-%d", cl, n), leaseTTL, rng.IntN(2) == 0, 0)
					if !ok {
						t.Errorf("acquire %s: outcome never learned", r)
						return
					}
					if o.Granted {
						mine[r] = o.LeaseID
					}
					record(cl, in, leaseOut{ok: o.Granted, leaseID: o.LeaseID, token: o.Token})
				case k < 6 && mine[r] != "":
					in.op, in.leaseID = "renew", mine[r]
					ok, known := renewUntilKnown(c, r, mine[r])
					if !known {
						continue // never answered: it may or may not have extended; stop using it
					}
					if !ok {
						delete(mine, r)
					}
					record(cl, in, leaseOut{ok: ok})
				case k < 7 && mine[r] != "":
					// Release r and acquire r2 (r itself, at times) in one
					// Batch: for r and r2 in one shard, one BatchCmd whose
					// items are applied in order.
					r2 := resources[rng.IntN(len(resources))]
					if r2 != r && mine[r2] != "" {
						r2 = r
					}
					id := fmt.Sprintf("c%d-%d", cl, n)
					rel, acq, ok := releaseAndAcquire(c, r, mine[r], r2, id)
					if !ok {
						t.Errorf("release %s and acquire %s: outcome never learned", r, r2)
						return
					}
					delete(mine, r)
					if acq.Granted {
						mine[r2] = acq.LeaseID
					}
					record(cl, leaseIn{op: "release", resource: r, leaseID: rel.LeaseID, call: in.call},
						leaseOut{ok: rel.Released != nil && *rel.Released, known: rel.Released != nil})
					record(cl, leaseIn{op: "acquire", resource: r2, call: in.call},
						leaseOut{ok: acq.Granted, leaseID: acq.LeaseID, token: acq.Token})
				case k < 8 && mine[r] != "":
					in.op, in.leaseID = "release", mine[r]
					o, ok := linRelease(c, r, mine[r], rng.IntN(2) == 0)
					if !ok {
						t.Errorf("release %s: outcome never learned", r)
						return
					}
					delete(mine, r)
					record(cl, in, leaseOut{ok: o.Released != nil && *o.Released, known: o.Released != nil})
				case k == 8 && mine[r] != "":
					delete(mine, r) // abandon it: the lease expires
				default:
					resp, err := c.locks.Describe(ctx(t), connect.NewRequest(&wardenv1.DescribeRequest{Resource: r}))
					if err != nil {
						continue
					}
					in.op = "describe"
					record(cl, in, leaseOut{held: resp.Msg.GetHeld(), token: resp.Msg.GetFencingToken()})
				}
			}
		})
	}
	time.Sleep(1500 * time.Millisecond)
	split, err := admin.SplitShard(ctx(t), connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: placement.FirstDataShard}))
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	time.Sleep(1500 * time.Millisecond)
	// Kill the leader of the new shard (stop its replica), then bring it back.
	newShard := split.Msg.GetNewShardId()
	lead := leaderOf(c, newShard)
	n := c.dev.Nodes[lead].Node
	if err := n.NodeHost().StopReplica(newShard, replicaOn(c, newShard, n.ID())); err != nil {
		t.Fatalf("stop the leader's replica: %v", err)
	}
	time.Sleep(2 * time.Second)
	for err := n.StartDataShard(c.dev.Router.Map().Shard(newShard), nil); err != nil; err = n.StartDataShard(c.dev.Router.Map().Shard(newShard), nil) {
		if !errors.Is(err, dragonboat.ErrShardAlreadyExist) { // the stop completes in the background
			t.Fatalf("restart it: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond)
	halt()

	res, info := porcupine.CheckOperationsVerbose(leaseModel.ToModel(), history, time.Minute)
	if res != porcupine.Ok {
		f, _ := os.CreateTemp("", "warden-lease-history-*.html")
		_ = porcupine.Visualize(leaseModel.ToModel(), info, f)
		f.Close()
		t.Fatalf("history of %d operations is not linearizable (%v); see %s", len(history), res, f.Name())
	}
	counts := map[string]int{}
	for _, op := range history {
		counts[op.Input.(leaseIn).op]++
	}
	t.Logf("%d operations linearizable: %v", len(history), counts)
}

// renewUntilKnown renews, retrying while the outcome is unknown; known is
// false if it never became known.
func renewUntilKnown(c *cluster, resource, leaseID string) (ok, known bool) {
	for range 100 {
		_, err := c.renew(resource, leaseID)
		switch connect.CodeOf(err) {
		case connect.CodeFailedPrecondition:
			return false, true
		case connect.CodeUnavailable, connect.CodeDeadlineExceeded:
			time.Sleep(10 * time.Millisecond)
			continue
		}
		return err == nil, err == nil
	}
	return false, false
}

// leaderOf returns the index in dev.Nodes of shardID's leader.
func leaderOf(c *cluster, shardID uint64) int {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for i, n := range c.dev.Nodes {
			id, _, valid, err := n.Node.NodeHost().GetLeaderID(shardID)
			if err == nil && valid && id == replicaOn(c, shardID, n.Node.ID()) {
				return i
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("shard %d has no leader", shardID)
	return -1
}

// replicaOn returns the id of shardID's replica on node.
func replicaOn(c *cluster, shardID, node uint64) uint64 {
	for _, r := range c.dev.Router.Map().Shard(shardID).GetReplicas() {
		if r.GetNodeId() == node {
			return r.GetReplicaId()
		}
	}
	return 0
}

// releaseAndAcquire releases leaseID's lock on r and acquires r2 with
// request id id in one Batch (release first), each retried alone while
// its outcome is unknown. rel.leaseID is the released lease; rel.released
// is set only when the batch answered it.
func releaseAndAcquire(c *cluster, r, leaseID, r2, id string) (rel, acq lockmodel.Output, ok bool) {
	rel.LeaseID = leaseID
	outcomes, err := c.batch(releaseOp(r, leaseID), &wardenv1.BatchOp{Op: &wardenv1.BatchOp_Acquire{Acquire: &wardenv1.AcquireRequest{
		Resource: r2, RequestId: id, LeaseTtl: durationpb.New(leaseTTL)}}})
	relKnown, acqKnown := false, false
	if err == nil {
		if o := outcomes[0]; o.GetCode() == "" {
			released := o.GetRelease().GetReleased()
			rel.Released, relKnown = &released, true
		}
		acq, acqKnown = acquireOutcome(c.t.(*testing.T), outcomes[1])
	}
	if !relKnown {
		if _, ok := linRelease(c, r, leaseID, false); !ok {
			return rel, acq, false
		}
	}
	if !acqKnown {
		if acq, ok = linAcquire(c, r2, id, leaseTTL, false, 0); !ok {
			return rel, acq, false
		}
	}
	return rel, acq, true
}
