package router_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/anishathalye/porcupine"
	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/internal/lockmodel"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/router/routertest"
	"github.com/warden-dev/warden/shard"
)

// A seeded simulation of one shard's Raft group under the routing core,
// in a synctest bubble (virtual time), checked by porcupine with the same
// lock model as the API's histories of real clusters (lockmodel). The
// three replicas are real state machines (shard.StateMachine on Pebble,
// each applying the one committed log); the consensus between them is
// modelled (simGroup), with faults drawn from the seed:
//
//   - the leader changes again and again, with an election of 20-300 ms
//     in between when no replica leads, and the clock confirmed only then;
//     each node hears of a change up to 200 ms late, the deposed leader
//     0.2-1 s late (its leader reports and its host's answer alike: it
//     believes it leads until then, while the new leader commits);
//   - a follower applies the log late (the leader applies each entry as
//     it commits, a new leader everything before it leads);
//   - a proposal is dropped before it is proposed (ErrDropped);
//   - a proposal commits and its answer is lost (router.ErrOutcomeUnknown);
//   - a proposal hangs until its caller gives up, and the next leader
//     commits it, or not, as Raft may an entry of an ended term;
//   - a read on the leader is dropped.
//
// Each node has a router of its own, as each process does. Lock clients
// Acquire, Release (some with a lease that is not theirs) and Describe
// through a node drawn for each call, which serves it or forwards it to
// the node it believes leads (Router.Forward, then Propose or Read there,
// as the API layer does), each retrying with the same ids until the
// answer is known, as the API's clients do. Quota clients Reserve 1-4
// units of a pool's key, and Commit or Release each reservation, while
// the pool's admin raises its limit now and then; after every entry the
// pool must not be oversold, and at the end its committed total must be
// what the commits answered and nothing be left reserved. Each
// run prints its seed; -sim.seed replays one. The interleaving of
// goroutines is the Go scheduler's, so a seed replays the same faults at
// the same virtual times, not always the same history.
var (
	simSeed  = flag.Uint64("sim.seed", 0, "TestSimulatedShard: run this seed only (0: -sim.seeds seeds drawn at random)")
	simSeeds = flag.Int("sim.seeds", 8, "TestSimulatedShard: how many random seeds to run")
)

func TestSimulatedShard(t *testing.T) {
	seeds := routertest.Seeds(*simSeed, *simSeeds)
	total := routertest.Run(t, seeds, runSimulation, func(t *testing.T, seed uint64, ops []porcupine.Operation) {
		t.Logf("%d operations", len(ops))
		res, info := porcupine.CheckOperationsVerbose(lockmodel.Model, ops, time.Minute)
		if res != porcupine.Ok {
			path := filepath.Join(os.TempDir(), fmt.Sprintf("warden-sim-%d.html", seed))
			_ = porcupine.VisualizePath(lockmodel.Model, info, path)
			lockmodel.Explain(ops, info, int64(200*time.Millisecond), t.Logf)
			t.Fatalf("seed %d: the history is %v (porcupine's view: %s); replay with -sim.seed=%d", seed, res, path, seed)
		}
	})
	// The premises: every fault happened in the runs.
	routertest.Happened(t, total, len(seeds), 4, "leader change", "dropped", "answer lost", "hung", "hung and committed", "read dropped", "granted", "reserved", "pool full", "committed")
}

const (
	simShard    = shard.FirstShard
	simReplicas = 3
	// simFaultsFor is how long leaders change and faults happen; clients
	// start no new call after it, and the calls under way then finish.
	simFaultsFor = 6 * time.Second
)

// runSimulation runs one seed's simulation and returns its history and
// how often each fault happened.
func runSimulation(t *testing.T, seed uint64) ([]porcupine.Operation, map[string]int) {
	g := routertest.NewGroup(t, simShard, simReplicas, seed, routertest.Faults{Drop: 0.04, LoseAnswer: 0.04, Hang: 0.03, DropRead: 0.04})
	g.AfterApply(func(index uint64, lookup func(*shardv1.Query) (*shardv1.QueryResult, error)) {
		checkPool(t, index, lookup)
	})
	c := routertest.NewCluster(g)
	g.Elect()
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.ChangeLeaders(simFaultsFor)
	}()
	h := &simHistory{start: time.Now()}
	var wg sync.WaitGroup
	for client := range 4 {
		rng := rand.New(rand.NewPCG(seed, uint64(client)))
		wg.Go(func() { simClient(t, c, h, client, rng, h.start.Add(simFaultsFor)) })
	}
	acct := &simQuota{limit: simLimit, counts: map[string]int{}}
	rng := rand.New(rand.NewPCG(seed, 100))
	simQuotaCall(t, via(c, rng), "set_limit", &shardv1.Envelope{Command: &shardv1.Envelope_SetLimit{SetLimit: &shardv1.SetLimitCmd{Key: simPool, Limit: simLimit}}})
	for client := range 3 {
		rng := rand.New(rand.NewPCG(seed, uint64(200+client)))
		wg.Go(func() { simQuotaClient(t, c, acct, client, rng, h.start.Add(simFaultsFor)) })
	}
	wg.Wait()
	<-done
	// Nothing acknowledged is lost or counted twice: every reservation
	// ended, and the pool's committed total is what the commits answered.
	q := simQuotaLevel(t, via(c, rng))
	if q.GetReserved() != 0 || q.GetCommitted() != acct.committed {
		t.Errorf("pool %s at the end: reserved %d, committed %d; the clients were told of %d committed and hold nothing", simPool, q.GetReserved(), q.GetCommitted(), acct.committed)
	}
	faults := g.Counts()
	for k, v := range acct.counts {
		faults[k] = v
	}
	for _, op := range h.ops {
		if op.Output.(lockmodel.Output).Granted {
			faults["granted"]++
		}
	}
	return h.ops, faults
}

// via returns a node of c drawn from rng to call through.
func via(c *routertest.Cluster, rng *rand.Rand) simNode {
	return simNode{c, c.Routers[1+rng.Uint64N(simReplicas)]}
}

// simNode is a call's way into the cluster: a node's router, which
// forwards to the router of the node it believes leads, as the API layer
// does, or serves the call itself.
type simNode struct {
	c *routertest.Cluster
	r *router.Router
}

// propose proposes env through n and returns the shard's result, a
// refusal's too (with its *router.ResultError); *unknown is set when an attempt
// that Forward retried may have committed (the API layer's
// forwardRelease keeps the same account).
func (n simNode) propose(ctx context.Context, key string, env *shardv1.Envelope, unknown *bool) (*shardv1.Result, error) {
	var res *shardv1.Result
	_, ok, err := n.r.Forward(ctx, key, 0, func(ctx context.Context, to *placementv1.Node) error {
		var err error
		res, err = n.c.Routers[to.GetId()].Propose(ctx, key, proto.CloneOf(env))
		if err != nil && !errors.As(err, new(*router.ResultError)) {
			*unknown = true
		}
		return err
	})
	if !ok {
		res, err = n.r.Propose(ctx, key, env)
	}
	if re := (*router.ResultError)(nil); errors.As(err, &re) {
		res = re.Res
	}
	return res, err
}

func (n simNode) read(ctx context.Context, key string, q *shardv1.Query) (*shardv1.QueryResult, error) {
	var out *shardv1.QueryResult
	_, ok, err := n.r.Forward(ctx, key, 0, func(ctx context.Context, to *placementv1.Node) error {
		var err error
		out, err = n.c.Routers[to.GetId()].Read(ctx, key, proto.CloneOf(q))
		return err
	})
	if ok {
		return out, err
	}
	return n.r.Read(ctx, key, q)
}

// The quota clients' pool: its limit is far below what they ask for.
const (
	simPool  = "simq"
	simKey   = "simq/a"
	simLimit = 10
)

// simQuota is what the quota clients were told.
type simQuota struct {
	mu        sync.Mutex
	limit     int64          // the pool's, as last set
	committed int64          // the amounts of the commits answered OK
	counts    map[string]int // answers by kind
}

func (a *simQuota) count(kind string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.counts[kind]++
}

// simQuotaClient reserves 1-4 units of simKey until end, and commits or
// releases each reservation it got, all of them before it returns.
func simQuotaClient(t *testing.T, c *routertest.Cluster, acct *simQuota, client int, rng *rand.Rand, end time.Time) {
	type open struct {
		id     string
		amount int64
	}
	var held []open
	for n := 0; time.Now().Before(end) || len(held) > 0; n++ {
		r := via(c, rng)
		if len(held) > 0 && (rng.IntN(2) == 0 || !time.Now().Before(end)) {
			o := held[0]
			held = held[1:]
			if rng.IntN(6) == 0 {
				res := simQuotaCall(t, r, "commit "+o.id, &shardv1.Envelope{Command: &shardv1.Envelope_Commit{Commit: &shardv1.CommitCmd{Key: simKey, ReservationId: o.id, Amount: o.amount}}})
				if res.GetCode() == shardv1.Code_CODE_OK {
					acct.mu.Lock()
					acct.committed += o.amount
					acct.counts["committed"]++
					acct.mu.Unlock()
				}
			} else {
				simQuotaCall(t, r, "release "+o.id, &shardv1.Envelope{Command: &shardv1.Envelope_ReleaseReservation{ReleaseReservation: &shardv1.ReleaseReservationCmd{Key: simKey, ReservationId: o.id}}})
			}
		} else if client == 0 && n%20 == 19 {
			// Commits fill the pool for good: its admin raises the limit.
			acct.mu.Lock()
			acct.limit += simLimit
			limit := acct.limit
			acct.mu.Unlock()
			simQuotaCall(t, r, "set_limit", &shardv1.Envelope{Command: &shardv1.Envelope_SetLimit{SetLimit: &shardv1.SetLimitCmd{Key: simPool, Limit: limit}}})
		} else {
			o := open{fmt.Sprintf("q%d-%d", client, n), 1 + rng.Int64N(4)}
			res := simQuotaCall(t, r, "reserve "+o.id, &shardv1.Envelope{Command: &shardv1.Envelope_Reserve{Reserve: &shardv1.ReserveCmd{
				Key: simKey, Amount: o.amount, ReservationId: o.id, TtlNanos: int64(10 * time.Minute)}}})
			if res.GetCode() == shardv1.Code_CODE_OK {
				held = append(held, o)
				acct.count("reserved")
			} else {
				acct.count("pool full")
			}
		}
		time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
	}
}

// simQuotaCall proposes env through r until its answer is known, and
// returns it: OK, or a pool too full for a reservation.
func simQuotaCall(t *testing.T, r simNode, what string, env *shardv1.Envelope) *shardv1.Result {
	var res *shardv1.Result
	simRetry(t, what, func(ctx context.Context) error {
		var retried bool // each command is idempotent under its ids
		var err error
		res, err = r.propose(ctx, simKey, proto.CloneOf(env), &retried)
		return err
	})
	if c := res.GetCode(); c != shardv1.Code_CODE_OK && (c != shardv1.Code_CODE_RESOURCE_EXHAUSTED || env.GetReserve() == nil) {
		t.Errorf("%s: %v %s", what, c, res.GetReason())
	}
	return res
}

// simQuotaLevel reads the pool's quota record (linearizable).
func simQuotaLevel(t *testing.T, r simNode) *shardv1.QuotaRecord {
	var q *shardv1.QueryResult
	simRetry(t, "query "+simPool, func(ctx context.Context) error {
		var err error
		q, err = r.read(ctx, simPool, &shardv1.Query{Query: &shardv1.Query_Quota{Quota: &shardv1.QuotaQuery{Key: simPool}}})
		return err
	})
	return q.GetLevels()[0].GetRecord()
}

// simHistory is the porcupine history the clients record.
type simHistory struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
}

func (h *simHistory) record(client int, in lockmodel.Input, out lockmodel.Output, call time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Output: out,
		Call: int64(call.Sub(h.start)), Return: int64(time.Since(h.start))})
}

// simClient calls until end: Acquire while it holds nothing, else
// Release, a Describe now and then, and a Release of another's or an old
// lease now and then.
func simClient(t *testing.T, c *routertest.Cluster, h *simHistory, client int, rng *rand.Rand, end time.Time) {
	resources := []string{"sim/a", "sim/b"}
	held := map[string]string{} // resource → lease id
	var old []string            // lease ids released or never held here
	for n := 0; time.Now().Before(end); n++ {
		res := resources[rng.IntN(len(resources))]
		r := via(c, rng)
		call := time.Now()
		switch p := rng.Float64(); {
		case p < 0.25:
			token, isHeld := simDescribe(t, r, res)
			h.record(client, lockmodel.Input{Op: "describe", Resource: res}, lockmodel.Output{Held: isHeld, Token: token}, call)
		case p < 0.35 && len(old) > 0:
			lease := old[rng.IntN(len(old))]
			released := simRelease(t, r, res, lease)
			h.record(client, lockmodel.Input{Op: "release", Resource: res, LeaseID: lease}, lockmodel.Output{Released: released}, call)
		case held[res] != "":
			lease := held[res]
			released := simRelease(t, r, res, lease)
			h.record(client, lockmodel.Input{Op: "release", Resource: res, LeaseID: lease}, lockmodel.Output{Released: released}, call)
			delete(held, res)
			old = append(old, lease)
		default:
			// A lease id the client draws from its seeded source: the
			// API layer draws it from the OS, which a seed cannot replay.
			lease := fmt.Sprintf("%016x", rng.Uint64())
			out := simAcquire(t, r, res, fmt.Sprintf("c%d-%d", client, n), lease)
			h.record(client, lockmodel.Input{Op: "acquire", Resource: res}, out, call)
			if out.Granted {
				held[res] = lease
			}
		}
		time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
	}
}

// simRetry runs f until its answer is known: not an error of the kind a
// client retries with the same ids (no leader, outcome unknown, a
// deadline). It reports whether any try's outcome was unknown.
func simRetry(t *testing.T, what string, f func(ctx context.Context) error) (unknown bool) {
	giveUp := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err := f(ctx)
		cancel()
		var re *router.ResultError
		var rl *router.RemoteLeader
		switch {
		case err == nil || errors.As(err, &re):
			return unknown
		case errors.Is(err, router.ErrNoLeader) && !errors.Is(err, router.ErrOutcomeUnknown), errors.Is(err, router.ErrClockUnconfirmed), errors.As(err, &rl):
		case errors.Is(err, router.ErrOutcomeUnknown), errors.Is(err, context.DeadlineExceeded), connect.CodeOf(err) == connect.CodeUnavailable:
			unknown = true
		default:
			t.Errorf("%s: %v, which a client cannot retry", what, err)
			return unknown
		}
		if time.Now().After(giveUp) {
			t.Errorf("%s: still no answer after a minute with no faults for most of it: %v", what, err)
			return unknown
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func simAcquire(t *testing.T, r simNode, resource, requestID, lease string) lockmodel.Output {
	var res *shardv1.Result
	simRetry(t, "acquire "+requestID, func(ctx context.Context) error {
		var err error
		var retried bool // the request id's dedup answers a retry the same
		res, err = r.propose(ctx, resource, &shardv1.Envelope{Command: &shardv1.Envelope_Acquire{Acquire: &shardv1.AcquireCmd{
			Resource: resource, RequestId: requestID, Holder: requestID, LeaseTtlNanos: int64(10 * time.Minute), LeaseId: []byte(lease)}}}, &retried)
		return err
	})
	l := res.GetLease()
	if res.GetCode() == shardv1.Code_CODE_OK {
		if !bytes.Equal(l.GetLeaseId(), []byte(lease)) {
			t.Errorf("acquire %s: granted lease %q, not the request's own %q", requestID, l.GetLeaseId(), lease)
		}
		return lockmodel.Output{Granted: true, LeaseID: lease, Token: l.GetFencingToken()}
	}
	if res.GetCode() != shardv1.Code_CODE_CONFLICT {
		t.Errorf("acquire %s: %v %s", requestID, res.GetCode(), res.GetReason())
	}
	return lockmodel.Output{Token: l.GetFencingToken()}
}

// simRelease returns whether the Release ended the lease, or nil when a
// try's outcome was unknown (then a later try finds it released already,
// and the model accepts either).
func simRelease(t *testing.T, r simNode, resource, lease string) *bool {
	var res *shardv1.Result
	var forwarded bool // an attempt Forward retried may have committed
	unknown := simRetry(t, "release "+lease, func(ctx context.Context) error {
		var err error
		res, err = r.propose(ctx, resource, &shardv1.Envelope{Command: &shardv1.Envelope_Release{Release: &shardv1.ReleaseCmd{Resource: resource, LeaseId: []byte(lease)}}}, &forwarded)
		return err
	})
	if unknown || forwarded {
		return nil
	}
	released := res.GetReleased()
	return &released
}

func simDescribe(t *testing.T, r simNode, resource string) (token uint64, held bool) {
	var q *shardv1.QueryResult
	simRetry(t, "describe "+resource, func(ctx context.Context) error {
		var err error
		q, err = r.read(ctx, resource, &shardv1.Query{Query: &shardv1.Query_Describe{Describe: &shardv1.DescribeQuery{Resource: resource}}})
		return err
	})
	return q.GetLock().GetFencingToken(), shard.DescribeHolds(q)
}

// checkPool checks the pool on the replica that has just applied entry
// index first: never oversold, at every log position (rule 7).
func checkPool(t *testing.T, index uint64, lookup func(*shardv1.Query) (*shardv1.QueryResult, error)) {
	out, err := lookup(&shardv1.Query{NowUnixNano: time.Now().UnixNano(), Query: &shardv1.Query_Quota{Quota: &shardv1.QuotaQuery{Key: simPool}}})
	if err != nil {
		t.Errorf("entry %d: query %s: %v", index, simPool, err)
		return
	}
	if q := out.GetLevels()[0].GetRecord(); q.GetHasLimit() && q.GetCommitted()+q.GetReserved() > q.GetLimit() {
		t.Errorf("entry %d: pool %s oversold: committed %d + reserved %d > limit %d", index, simPool, q.GetCommitted(), q.GetReserved(), q.GetLimit())
	}
}
