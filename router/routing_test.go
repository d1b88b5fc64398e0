package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/datadriven"
	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// Data-driven tests of the router's routing over a scripted Raft host
// (fakeHost, behind the raftHost seam): leader lookup, its wait for
// leader reports, and the retries of proposals a shard refused because
// the key's range moved. Each file under testdata/routing runs in a
// synctest bubble, so time is virtual: a wait of LeaderWait or MoveWait
// takes no real time, and the durations printed are exact. Run with
// -rewrite to regenerate the expected outputs; review the diff.
//
// The cluster: nodes 1 and 2 run in this process, node 3 elsewhere;
// shard 10 owns every key and has replicas 1, 2, 3 on nodes 1, 2, 3.
//
//	report node=N leader=L term=T      a leader report of node N's replica (LeaderUpdated)
//	host node=N leader=L term=T [valid] [stopped]  what node N's Raft host answers for the leader
//	clock node=N term=T                node N's term T has its clock confirmed
//	lookup [name=X]                    Router.leader for shard 10; with name, runs in the background
//	wait name=X                        waits for a background lookup (or propose) and prints its result
//	results node=N codes=(C[*K],...)   the shard results node N's host gives its next proposals (K of each)
//	dropped node=N count=K             node N's host drops its next K proposals before proposing them
//	propose key=K [name=X]             Router.propose of a Release for key K
//	advance d=D                        lets D of virtual time pass
func TestRouting(t *testing.T) {
	datadriven.Walk(t, "testdata/routing", func(t *testing.T, path string) {
		synctest.Test(t, func(t *testing.T) {
			f := newRoutingFixture()
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				return f.run(t, d)
			})
			f.close()
		})
	})
}

// routingFixture is the router of TestRouting's cluster with its fakes.
type routingFixture struct {
	r     *Router
	hosts map[uint64]*fakeHost
	meta  *fakeMeta
	bg    map[string]chan string
	ctx   context.Context
	stop  context.CancelFunc
}

func newRoutingFixture() *routingFixture {
	st := &placementv1.State{
		Generation: 1,
		Ranges:     []*shardv1.RangeDescriptor{{ShardId: 10, Start: 0, End: 0, Generation: 1}},
		Shards: []*placementv1.Shard{{Id: 10, Epoch: 1, Replicas: []*placementv1.Replica{
			{ReplicaId: 1, NodeId: 1}, {ReplicaId: 2, NodeId: 2}, {ReplicaId: 3, NodeId: 3}}}},
	}
	for id := uint64(1); id <= 3; id++ {
		st.Nodes = append(st.Nodes, &placementv1.Node{Id: id, ListenAddr: fmt.Sprintf("node-%d.invalid:1", id), CommandVersion: shard.CommandVersion})
	}
	f := &routingFixture{hosts: map[uint64]*fakeHost{}, meta: &fakeMeta{st: st}, bg: map[string]chan string{}}
	var nodes []LocalNode
	for id := uint64(1); id <= 2; id++ {
		h := &fakeHost{replica: id}
		f.hosts[id] = h
		nodes = append(nodes, LocalNode{Leadership: NewLeadership(0), id: id, raft: h})
	}
	f.r = New(nodes, f.meta, placement.NewMap(st), NewWaitRegistry(), Config{Logger: slog.New(slog.DiscardHandler)}, NewPeers(""))
	f.ctx, f.stop = context.WithCancel(context.Background())
	return f
}

func (f *routingFixture) close() { f.stop() }

func (f *routingFixture) node(t *testing.T, d *datadriven.TestData) (*LocalNode, *fakeHost) {
	var id uint64
	d.ScanArgs(t, "node", &id)
	for i := range f.r.nodes {
		if f.r.nodes[i].id == id {
			return &f.r.nodes[i], f.hosts[id]
		}
	}
	t.Fatalf("%s: node %d does not run here", d.Pos, id)
	return nil, nil
}

func (f *routingFixture) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "report":
		n, h := f.node(t, d)
		var lead, term uint64
		d.ScanArgs(t, "leader", &lead)
		d.ScanArgs(t, "term", &term)
		n.Leadership.leaderUpdated(10, h.replica, lead, term)
		return "ok\n"
	case "host":
		_, h := f.node(t, d)
		h.mu.Lock()
		d.MaybeScanArgs(t, "leader", &h.leader)
		d.MaybeScanArgs(t, "term", &h.term)
		h.valid, h.stopped = d.HasArg("valid"), d.HasArg("stopped")
		h.mu.Unlock()
		return "ok\n"
	case "clock":
		n, _ := f.node(t, d)
		var term uint64
		d.ScanArgs(t, "term", &term)
		n.Leadership.clockConfirmed(10, term)
		return "ok\n"
	case "results":
		_, h := f.node(t, d)
		var codes []string
		d.ScanArgs(t, "codes", &codes)
		h.mu.Lock()
		for _, c := range codes {
			c, times, _ := strings.Cut(c, "*") // code*N: N of them
			v, ok := shardv1.Code_value["CODE_"+strings.ToUpper(c)]
			if !ok {
				t.Fatalf("%s: no result code %q", d.Pos, c)
			}
			k := 1
			if times != "" {
				var err error
				if k, err = strconv.Atoi(times); err != nil {
					t.Fatalf("%s: codes: %v", d.Pos, err)
				}
			}
			for range k {
				h.results = append(h.results, shardv1.Code(v))
			}
		}
		h.mu.Unlock()
		return "ok\n"
	case "dropped":
		_, h := f.node(t, d)
		h.mu.Lock()
		d.ScanArgs(t, "count", &h.drop)
		h.mu.Unlock()
		return "ok\n"
	case "lookup", "propose":
		var key string
		if d.Cmd == "propose" {
			d.ScanArgs(t, "key", &key)
		}
		call := func() string {
			start := time.Now()
			var out string
			if d.Cmd == "lookup" {
				out = f.lookup()
			} else {
				out = f.propose(key)
			}
			return fmt.Sprintf("%s after %v\n", out, time.Since(start))
		}
		if !d.HasArg("name") {
			return call()
		}
		var name string
		d.ScanArgs(t, "name", &name)
		ch := make(chan string, 1)
		f.bg[name] = ch
		go func() { ch <- call() }()
		synctest.Wait()
		select {
		case out := <-ch:
			f.bg[name] = nil
			return "done at once: " + out
		default:
			ch2 := make(chan string, 1)
			f.bg[name] = ch2
			go func() { ch2 <- <-ch }()
			return "waiting\n"
		}
	case "wait":
		var name string
		d.ScanArgs(t, "name", &name)
		ch := f.bg[name]
		if ch == nil {
			t.Fatalf("%s: no background call %q", d.Pos, name)
		}
		delete(f.bg, name)
		return <-ch
	case "advance":
		var dur string
		d.ScanArgs(t, "d", &dur)
		dd, err := time.ParseDuration(dur)
		if err != nil {
			t.Fatalf("%s: d: %v", d.Pos, err)
		}
		time.Sleep(dd)
		synctest.Wait()
		return "ok\n"
	}
	t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	return ""
}

func (f *routingFixture) lookup() string {
	n, term, err := f.r.leader(f.ctx, 10)
	var rl *remoteLeader
	switch {
	case err == nil:
		return fmt.Sprintf("local: node %d leads in term %d", n.id, term.term)
	case errors.As(err, &rl):
		return fmt.Sprintf("remote: node %d", rl.node.GetId())
	case errors.Is(err, ErrNoLeader):
		return "no leader"
	}
	return "error: " + err.Error()
}

func (f *routingFixture) propose(key string) string {
	reads := f.meta.reads.Load()
	var tries int
	for _, h := range f.hosts {
		tries -= h.proposals()
	}
	res, err := f.r.propose(f.ctx, key, &shardv1.Envelope{Command: &shardv1.Envelope_Release{Release: &shardv1.ReleaseCmd{Resource: key}}})
	for _, h := range f.hosts {
		tries += h.proposals()
	}
	out := fmt.Sprintf("%d proposals, %d map reads: ", tries, f.meta.reads.Load()-reads)
	var rl *remoteLeader
	switch {
	case errors.As(err, &rl):
		return out + fmt.Sprintf("forward to node %d", rl.node.GetId())
	case err != nil && res != nil:
		return out + fmt.Sprintf("refused %v", res.GetCode())
	case err != nil:
		return out + "error: " + err.Error()
	}
	return out + res.GetCode().String()
}

// fakeHost is a scripted raftHost: its leader view is what the script
// set, and its proposals answer the scripted result codes in turn (OK
// once they run out).
type fakeHost struct {
	replica uint64
	mu      sync.Mutex
	leader  uint64
	term    uint64
	valid   bool
	stopped bool
	results []shardv1.Code
	drop    int
	n       int
}

func (h *fakeHost) proposals() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

func (h *fakeHost) propose(ctx context.Context, shardID uint64, cmd []byte) ([]byte, error) {
	if _, err := shard.DecodeCommand(cmd); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n++
	if h.drop > 0 {
		h.drop--
		return nil, fmt.Errorf("%w (%w): system busy", ErrNoLeader, errDropped)
	}
	code := shardv1.Code_CODE_OK
	if len(h.results) > 0 {
		code, h.results = h.results[0], h.results[1:]
	}
	return proto.Marshal(&shardv1.Result{Code: code})
}

func (h *fakeHost) read(ctx context.Context, shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	return &shardv1.QueryResult{Meta: &shardv1.ShardMeta{Range: &shardv1.RangeDescriptor{ShardId: shardID}}}, nil
}

func (h *fakeHost) staleRead(shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	return h.read(context.Background(), shardID, q)
}

func (h *fakeHost) leaderOf(uint64) (uint64, uint64, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return 0, 0, false, errors.New("shard not found")
	}
	return h.leader, h.term, h.valid, nil
}

func (h *fakeHost) transferLeader(uint64, uint64) error { return nil }

func (h *fakeHost) snapshot(context.Context, uint64) (uint64, error) { return 0, errNothingToSnapshot }

func (h *fakeHost) changeMembership(context.Context, *placementv1.MembershipRequest) (*placementv1.MembershipResponse, error) {
	return nil, errors.New("fakeHost: no membership")
}

// fakeMeta serves a fixed placement state and counts its reads.
type fakeMeta struct {
	st    *placementv1.State
	reads atomic.Int64
}

func (m *fakeMeta) Propose(context.Context, *placementv1.Command) (*placementv1.Result, error) {
	return nil, errors.New("fakeMeta: read only")
}

func (m *fakeMeta) Read(context.Context) (*placementv1.State, error) {
	m.reads.Add(1)
	return m.st, nil
}
