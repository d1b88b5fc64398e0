// Package routertest runs routers over a modelled Raft group in one
// process, for deterministic tests of the routing core and of what sits
// on it: a Group models one shard's consensus (terms, leaders, one
// committed log) over real shard state machines, with faults drawn from
// a seed, and a Cluster is one router per node over it, each calling the
// others' node API in memory. Run it in a testing/synctest bubble and
// time is virtual: elections, late leader reports and waits take no real
// time, and a seed replays the same faults at the same virtual times.
//
// It plays the part hashicorp/raft's in-memory transport and
// MakeCluster play there; the router's own scripted fake (routing_test)
// stays beside the router for step-by-step scripts.
package routertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4/raftio"
	sm "github.com/lni/dragonboat/v4/statemachine"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/shard"
)

// Faults are the chances, each in [0, 1), that the group mistreats one
// request to its leader.
type Faults struct {
	// Drop: a proposal is dropped before it is proposed (ErrDropped).
	Drop float64
	// LoseAnswer: a proposal commits and its answer is lost
	// (ErrOutcomeUnknown).
	LoseAnswer float64
	// Hang: a proposal gets no answer until its caller gives up; the
	// next leader commits it, or not, as Raft may an entry of an ended
	// term, and the same leader's next proposal commits it first.
	Hang float64
	// DropRead: a linearizable read is dropped (ErrDropped).
	DropRead float64
}

// Group models one shard's Raft group: a term and its leader (none
// between an election's start and its end), one committed log that every
// replica's real state machine (shard.StateMachine) applies in order,
// and proposals of an ended term not yet known to commit. The leader
// applies each entry as it commits; each follower now or later, and a
// new leader everything before it leads. Every replica's result of each
// entry is checked against the first one's: replicas never diverge.
//
// Replica i runs on node i. Each node hears of a leader change up to
// 200 ms late (Listen), the deposed leader 0.2-1 s late: it goes on
// believing it leads while a new leader commits, and its host's own view
// of the leader (LeaderOf) lags with it. Its host refuses a proposal at
// once (dropped, not proposed), where a partitioned Dragonboat leader
// would take it and leave it hanging until its term's end; proposals
// that hung before a leader change are modelled (Faults.Hang). All
// applies and reads run under one lock, so the model shows no race
// between a replica's reads and its applies.
type Group struct {
	t        testing.TB
	shardID  uint64
	replicas int
	faults   Faults

	mu          sync.Mutex
	rng         *rand.Rand
	leaderships map[uint64]*router.Leadership
	observers   map[uint64]shard.ApplyObserver
	term        uint64
	leader      uint64
	deposed     uint64   // the leader of the term before
	log         [][]byte // committed commands; entry i+1 is log[i]
	results     [][]byte // the first replica's result of each entry
	applied     map[uint64]uint64
	sms         map[uint64]sm.IOnDiskStateMachine
	pending     [][]byte // proposed, not known to commit
	counts      map[string]int
	// views are what each node's host believes of the leader: its term
	// and replica (0: none), as reported to it last.
	views map[uint64][2]uint64
	// afterApply, if set, checks each entry's state on the first replica
	// to apply it.
	afterApply func(index uint64, lookup func(*shardv1.Query) (*shardv1.QueryResult, error))
}

// NewGroup returns a group of replicas replicas of shardID, each a
// state machine under a temporary directory of t, with no leader yet
// (Elect makes one) and faults drawn from seed.
func NewGroup(t testing.TB, shardID uint64, replicas int, seed uint64, faults Faults) *Group {
	g := &Group{t: t, shardID: shardID, replicas: replicas, faults: faults, rng: rand.New(rand.NewPCG(seed, 0)),
		leaderships: map[uint64]*router.Leadership{}, observers: map[uint64]shard.ApplyObserver{}, applied: map[uint64]uint64{}, sms: map[uint64]sm.IOnDiskStateMachine{},
		counts: map[string]int{}, views: map[uint64][2]uint64{}}
	dir := t.TempDir()
	for id := uint64(1); id <= uint64(replicas); id++ {
		// Each replica reports what it applies to its node's observer
		// (Listen), as a node's replicas report to its wait registry.
		hooks := shard.Hooks{Applied: func(shardID uint64, res *shardv1.Result) {
			if o := g.observers[id]; o != nil { // g.mu is held: Update runs in catchUp
				o(shardID, res)
			}
		}}
		s := shard.NewStateMachine(dir, hooks)(shardID, id)
		if _, err := s.Open(make(chan struct{})); err != nil {
			t.Fatal(err)
		}
		g.sms[id] = s
	}
	t.Cleanup(func() {
		for _, s := range g.sms {
			_ = s.Close()
		}
	})
	return g
}

// AfterApply sets f to run after each entry, with a read of the state
// of the first replica to apply it, under the group's lock: a check of
// an invariant at every log position (f reports through t).
func (g *Group) AfterApply(f func(index uint64, lookup func(*shardv1.Query) (*shardv1.QueryResult, error))) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.afterApply = f
}

// Listen makes l, node replica's Leadership, hear the group's leader
// changes, and observe (its wait registry's Observe) what the replica
// applies.
func (g *Group) Listen(replica uint64, l *router.Leadership, observe shard.ApplyObserver) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.leaderships[replica] = l
	g.observers[replica] = observe
}

// Host returns the Raft host of node replica: the router's seam to the
// group.
func (g *Group) Host(replica uint64) router.RaftHost { return host{g, replica} }

// Counts returns how often each fault and event happened: "leader
// change", "dropped", "answer lost", "hung", "hung and committed", "read
// dropped".
func (g *Group) Counts() map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]int, len(g.counts))
	for k, v := range g.counts {
		out[k] = v
	}
	return out
}

// Between draws a duration in [lo, hi) from the group's seed.
func (g *Group) Between(lo, hi time.Duration) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return lo + time.Duration(g.rng.Int64N(int64(hi-lo)))
}

// Depose ends the term: no replica leads until the next Elect.
func (g *Group) Depose() {
	g.mu.Lock()
	g.term++
	g.deposed, g.leader = g.leader, 0
	term := g.term
	g.counts["leader change"]++
	g.mu.Unlock()
	g.report(0, term)
}

// Elect settles the ended term's pending proposals (the new leader
// commits a prefix of them, as Raft may), makes a replica drawn from the
// seed leader in a new term, and tells every node.
func (g *Group) Elect() {
	g.mu.Lock()
	g.term++
	g.leader = 1 + g.rng.Uint64N(uint64(g.replicas))
	if k := g.rng.IntN(len(g.pending) + 1); k > 0 {
		for _, cmd := range g.pending[:k] {
			g.apply(cmd)
			g.counts["hung and committed"]++
		}
	}
	g.pending = nil
	g.catchUp(g.leader)
	term, lead := g.term, g.leader
	g.mu.Unlock()
	g.report(lead, term)
}

// report tells each node of the term's leader, each up to 200 ms late,
// the deposed leader 0.2-1 s late.
func (g *Group) report(lead, term uint64) {
	g.mu.Lock()
	ls := make(map[uint64]*router.Leadership, len(g.leaderships))
	for id, l := range g.leaderships {
		ls[id] = l
	}
	g.mu.Unlock()
	for id, l := range ls {
		late := g.Between(0, 200*time.Millisecond)
		if g.isDeposed(id) {
			late = g.Between(200*time.Millisecond, time.Second)
		}
		time.AfterFunc(late, func() {
			g.mu.Lock()
			if g.views[id][0] < term {
				g.views[id] = [2]uint64{term, lead}
			}
			g.mu.Unlock()
			l.LeaderUpdated(raftio.LeaderInfo{ShardID: g.shardID, ReplicaID: id, LeaderID: lead, Term: term})
		})
	}
}

// isDeposed reports whether id led the term before the current one.
func (g *Group) isDeposed(id uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.deposed == id
}

// apply commits cmd as the next entry, which the leader applies at once
// and each follower now or later, and returns the leader's result. g.mu
// is held.
func (g *Group) apply(cmd []byte) []byte {
	g.log = append(g.log, cmd)
	g.catchUp(g.leader)
	for id := uint64(1); id <= uint64(g.replicas); id++ {
		if g.rng.IntN(4) == 0 {
			g.catchUp(id)
		}
	}
	return g.results[len(g.log)-1]
}

// catchUp makes replica id apply the entries it has not, and checks its
// results against the first replica's to apply them. g.mu is held.
func (g *Group) catchUp(id uint64) {
	for i := g.applied[id]; i < uint64(len(g.log)); i++ {
		res, err := g.sms[id].Update([]sm.Entry{{Index: i + 1, Cmd: g.log[i]}})
		if err != nil {
			g.t.Errorf("replica %d: entry %d: %v", id, i+1, err)
			return
		}
		switch out := res[0].Result.Data; {
		case i == uint64(len(g.results)):
			g.results = append(g.results, out)
			if g.afterApply != nil {
				g.afterApply(i+1, g.lookup(id))
			}
		case !bytes.Equal(g.results[i], out):
			g.t.Errorf("entry %d: replica %d's result differs from the first replica's", i+1, id)
		}
		g.applied[id] = i + 1
	}
}

// lookup reads replica id's state machine. g.mu is held.
func (g *Group) lookup(id uint64) func(*shardv1.Query) (*shardv1.QueryResult, error) {
	return func(q *shardv1.Query) (*shardv1.QueryResult, error) {
		out, err := g.sms[id].Lookup(q)
		if err != nil {
			return nil, err
		}
		return out.(*shardv1.QueryResult), nil
	}
}

// commitPending commits the term's hung proposals before a later one of
// the same leader: its log holds them first. g.mu is held.
func (g *Group) commitPending() {
	for _, cmd := range g.pending {
		g.apply(cmd)
		g.counts["hung and committed"]++
	}
	g.pending = nil
}

// host is one node's Raft host over the group.
type host struct {
	g       *Group
	replica uint64
}

var _ router.RaftHost = host{}

func (h host) Propose(ctx context.Context, _ uint64, cmd []byte) ([]byte, error) {
	g := h.g
	g.mu.Lock()
	if g.leader != h.replica {
		g.mu.Unlock()
		return nil, fmt.Errorf("%w (%w): replica %d does not lead", router.ErrNoLeader, router.ErrDropped, h.replica)
	}
	f := g.faults
	switch p := g.rng.Float64(); {
	case p < f.Drop:
		g.counts["dropped"]++
		g.mu.Unlock()
		return nil, fmt.Errorf("%w (%w): the model dropped it", router.ErrNoLeader, router.ErrDropped)
	case p < f.Drop+f.LoseAnswer:
		g.counts["answer lost"]++
		g.commitPending()
		g.apply(cmd)
		g.mu.Unlock()
		return nil, fmt.Errorf("%w: the model lost the answer", router.ErrOutcomeUnknown)
	case p < f.Drop+f.LoseAnswer+f.Hang:
		g.counts["hung"]++
		g.pending = append(g.pending, cmd)
		g.mu.Unlock()
		<-ctx.Done()
		return nil, fmt.Errorf("%w: %v", router.ErrOutcomeUnknown, ctx.Err())
	}
	g.commitPending()
	out := g.apply(cmd)
	g.mu.Unlock()
	return out, nil
}

func (h host) Read(_ context.Context, _ uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	g := h.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.leader != h.replica {
		return nil, fmt.Errorf("%w (%w): replica %d does not lead", router.ErrNoLeader, router.ErrDropped, h.replica)
	}
	if g.rng.Float64() < g.faults.DropRead {
		g.counts["read dropped"]++
		return nil, fmt.Errorf("%w (%w): the model dropped the read", router.ErrNoLeader, router.ErrDropped)
	}
	return g.lookup(h.replica)(q)
}

func (h host) StaleRead(_ uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	return h.g.lookup(h.replica)(q)
}

func (h host) LeaderOf(uint64) (uint64, uint64, bool, error) {
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	v := h.g.views[h.replica]
	return v[1], v[0], v[1] != 0, nil
}

// ErrNotModelled: the group does not model leader transfers, exports,
// snapshots or membership changes.
var ErrNotModelled = errors.New("routertest: not modelled")

func (host) TransferLeader(uint64, uint64) error { return ErrNotModelled }

func (host) Export(context.Context, uint64) (*shard.ExportedSnapshot, string, error) {
	return nil, "", ErrNotModelled
}

func (host) Snapshot(context.Context, uint64) (uint64, error) { return 0, ErrNotModelled }

func (host) ChangeMembership(context.Context, *placementv1.MembershipRequest) (*placementv1.MembershipResponse, error) {
	return nil, ErrNotModelled
}

// ChangeLeaders changes the group's leader again and again for d (of
// virtual time, in a synctest bubble): each term lasts 200-900 ms, each
// election 20-300 ms, drawn from the seed. It returns with a leader.
func (g *Group) ChangeLeaders(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		time.Sleep(g.Between(200*time.Millisecond, 900*time.Millisecond))
		g.Depose()
		time.Sleep(g.Between(20*time.Millisecond, 300*time.Millisecond))
		g.Elect()
	}
}

// Seeds returns the seeds a simulation runs: seed alone if it is set
// (a replay), else n drawn at random.
func Seeds(seed uint64, n int) []uint64 {
	if seed != 0 {
		return []uint64{seed}
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = rand.Uint64()
	}
	return out
}
