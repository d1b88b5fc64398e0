package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"
	"github.com/cockroachdb/datadriven"
	"github.com/lni/dragonboat/v4"
	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// Data-driven tests of the router's routing over a scripted Raft host
// (fakeHost, behind the RaftHost seam): leader lookup, its wait for
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
//	host node=N leader=L term=T [valid] [stopped] [hang]  what node N's Raft host answers for the leader;
//	                                   hang: its proposals and reads get no answer until their context ends
//	clock node=N term=T                node N's term T has its clock confirmed
//	lookup [name=X]                    Router.leader for shard 10; with name, runs in the background
//	wait name=X                        waits for a background lookup, propose or read and prints its result
//	results node=N codes=(C[*K],...)   the shard results node N's host gives its next proposals (K of each)
//	dropped node=N count=K             node N's host drops its next K proposals before proposing them
//	propose key=K [name=X]             Router.propose of a Release for key K
//	read key=K [name=X]                Router.read (linearizable) of key K's shard
//	advance d=D                        lets D of virtual time pass
//	snapshots node=N busy=K [index=I]  node N's host meets another snapshot in its next K
//	                                   snapshot calls, then takes one at index I (0: nothing to snapshot)
//	snapshot node=N [name=X]           an admin snapshot of node N's replica (snapshotLocal)
//	exports node=N unanswered=K        node N's host gets no answer to the read index of its
//	                                   next K exports until their context ends
//	export node=N [deadline=D]         ExportLocal of node N's replica, within D (1m)
//
// Forwarding to node 3, whose answers are scripted (no HTTP):
//
//	peer answers=(A[*K],...)           node 3's next answers: ok (released
//	                                   false), released, already (released
//	                                   by an earlier Release of the lease
//	                                   id), broken (the
//	                                   connection broke: no wire error), garbled
//	                                   (an answer not Connect's), or a Connect
//	                                   code node 3 sent (unavailable, ...), or
//	                                   lead-here (broken, and node 1 is elected)
//	forward key=K [hops=H]             forward of a Release for key K, as a
//	                                   request that came with H hops (forwardRelease)
//
// A waiting Acquire's wait for its grant (awaitGrant), with the hand-offs
// the local replicas apply scripted:
//
//	await name=X resource=R request=Q seq=S wait=D [attempt=A]
//	                                   waits, in the background, for queue entry S
//	applied granted=R/Q/S[/A],... dropped=R/Q/S,...  what a local replica applied
//	cancel name=X                      the caller of await X gives up
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

	answers []string                      // node 3's next answers to forwarded calls
	cancels map[string]context.CancelFunc // of the awaits by name
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
	f := &routingFixture{hosts: map[uint64]*fakeHost{}, meta: &fakeMeta{st: st}, bg: map[string]chan string{}, cancels: map[string]context.CancelFunc{}}
	var nodes []LocalNode
	for id := uint64(1); id <= 2; id++ {
		h := &fakeHost{replica: id}
		f.hosts[id] = h
		nodes = append(nodes, LocalNode{Leadership: NewLeadership(0), ID: id, Raft: h})
	}
	f.r = New(nodes, f.meta, placement.NewMap(st), NewWaitRegistry(), Config{Logger: slog.New(slog.DiscardHandler)}, NewPeers("", nil))
	f.ctx, f.stop = context.WithCancel(context.Background())
	return f
}

func (f *routingFixture) close() { f.stop() }

func (f *routingFixture) node(t *testing.T, d *datadriven.TestData) (*LocalNode, *fakeHost) {
	var id uint64
	d.ScanArgs(t, "node", &id)
	for i := range f.r.nodes {
		if f.r.nodes[i].ID == id {
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
		h.valid, h.stopped, h.hang = d.HasArg("valid"), d.HasArg("stopped"), d.HasArg("hang")
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
		for _, c := range expand(t, d, codes) {
			v, ok := shardv1.Code_value["CODE_"+strings.ToUpper(c)]
			if !ok {
				t.Fatalf("%s: no result code %q", d.Pos, c)
			}
			h.results = append(h.results, shardv1.Code(v))
		}
		h.mu.Unlock()
		return "ok\n"
	case "snapshots":
		_, h := f.node(t, d)
		h.mu.Lock()
		d.ScanArgs(t, "busy", &h.snapshotBusy)
		d.MaybeScanArgs(t, "index", &h.snapshotIndex)
		h.mu.Unlock()
		return "ok\n"
	case "snapshot":
		n, h := f.node(t, d)
		return f.call(t, d, func() string {
			h.mu.Lock()
			before := h.snapshots
			h.mu.Unlock()
			idx, err := f.r.SnapshotLocal(f.ctx, 10, n.ID)
			h.mu.Lock()
			defer h.mu.Unlock()
			if err != nil {
				return fmt.Sprintf("%d calls: error: %s", h.snapshots-before, err)
			}
			return fmt.Sprintf("%d calls: index %d", h.snapshots-before, idx)
		})
	case "exports":
		_, h := f.node(t, d)
		h.mu.Lock()
		d.ScanArgs(t, "unanswered", &h.exportsUnanswered)
		h.mu.Unlock()
		return "ok\n"
	case "export":
		n, h := f.node(t, d)
		deadline := time.Minute
		d.MaybeScanArgs(t, "deadline", &deadline)
		return f.call(t, d, func() string {
			h.mu.Lock()
			before := h.exports
			h.mu.Unlock()
			ctx, cancel := context.WithTimeout(f.ctx, deadline)
			defer cancel()
			var data, ends int
			err := ExportLocal(ctx, n, 10, func(m *placementv1.ExportShardResponse) error {
				data += len(m.GetData())
				if m.GetEnd() != nil {
					ends++
				}
				return nil
			})
			h.mu.Lock()
			defer h.mu.Unlock()
			if err != nil {
				return fmt.Sprintf("%d tries: error: %s", h.exports-before, err)
			}
			return fmt.Sprintf("%d tries: %d bytes, %d end", h.exports-before, data, ends)
		})
	case "dropped":
		_, h := f.node(t, d)
		h.mu.Lock()
		d.ScanArgs(t, "count", &h.drop)
		h.mu.Unlock()
		return "ok\n"
	case "lookup", "propose", "read":
		var key string
		if d.Cmd != "lookup" {
			d.ScanArgs(t, "key", &key)
		}
		return f.call(t, d, func() string {
			switch d.Cmd {
			case "lookup":
				return f.lookup()
			case "read":
				return f.read(key)
			}
			return f.propose(key)
		})
	case "peer":
		d.ScanArgs(t, "answers", &f.answers)
		f.answers = expand(t, d, f.answers)
		return "ok\n"
	case "forward":
		var key string
		var hops int
		d.ScanArgs(t, "key", &key)
		d.MaybeScanArgs(t, "hops", &hops)
		return f.call(t, d, func() string { return f.forward(t, key, hops) })
	case "await":
		var name, resource, request, attempt, wait string
		var seq uint64
		d.ScanArgs(t, "name", &name)
		d.ScanArgs(t, "resource", &resource)
		d.ScanArgs(t, "request", &request)
		d.ScanArgs(t, "seq", &seq)
		d.ScanArgs(t, "wait", &wait)
		d.MaybeScanArgs(t, "attempt", &attempt)
		dd, err := time.ParseDuration(wait)
		if err != nil {
			t.Fatalf("%s: wait: %v", d.Pos, err)
		}
		place := dd // the waiter's deadline on the shard: a retry's is later
		if d.HasArg("place") {
			var p string
			d.ScanArgs(t, "place", &p)
			if place, err = time.ParseDuration(p); err != nil {
				t.Fatalf("%s: place: %v", d.Pos, err)
			}
		}
		ctx, cancel := context.WithCancel(f.ctx)
		f.cancels[name] = cancel
		sub := f.r.waits.Subscribe(resource, request)
		deadline, placeDeadline := time.Now().Add(dd).UnixNano(), time.Now().Add(place).UnixNano()
		return f.call(t, d, func() string {
			defer f.r.waits.Unsubscribe(sub)
			cancels, drops := f.cancelWaits()
			lease, err := f.r.AwaitGrant(ctx, sub, resource, request, []byte(attempt), seq, deadline, placeDeadline)
			c, dr := f.cancelWaits()
			out := fmt.Sprintf("%d cancels, %d drops: ", c-cancels, dr-drops)
			if err != nil {
				return out + "error: " + err.Error()
			}
			return out + "granted " + string(lease.GetLeaseId())
		})
	case "applied":
		f.r.waits.Observe(1, appliedResult(t, d))
		synctest.Wait()
		return "ok\n"
	case "cancel":
		var name string
		d.ScanArgs(t, "name", &name)
		f.cancels[name]()
		synctest.Wait()
		return "ok\n"
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

// call runs fn, timed in virtual time; with a name argument, in the
// background, for a later wait to print its result.
func (f *routingFixture) call(t *testing.T, d *datadriven.TestData, fn func() string) string {
	timed := func() string {
		start := time.Now()
		out := fn()
		return fmt.Sprintf("%s after %v\n", out, time.Since(start))
	}
	if !d.HasArg("name") {
		return timed()
	}
	var name string
	d.ScanArgs(t, "name", &name)
	ch := make(chan string, 1)
	go func() { ch <- timed() }()
	synctest.Wait()
	select {
	case out := <-ch:
		return "done at once: " + out
	default:
		f.bg[name] = ch
		return "waiting\n"
	}
}

// expand reads a script's list of values, where V*K stands for K of V.
func expand(t *testing.T, d *datadriven.TestData, vals []string) []string {
	var out []string
	for _, v := range vals {
		v, times, _ := strings.Cut(v, "*")
		k := 1
		if times != "" {
			var err error
			if k, err = strconv.Atoi(times); err != nil {
				t.Fatalf("%s: %q: %v", d.Pos, v, err)
			}
		}
		for range k {
			out = append(out, v)
		}
	}
	return out
}

// forward runs the router's Forward of a call about key, as a request
// that came with hops hops, node 3 answering the script's answers in turn
// (ok once they run out). The API layer's part (the request's hop header,
// what a client is told when no node answered) is rpc's to test.
func (f *routingFixture) forward(t *testing.T, key string, hops int) string {
	calls := 0
	last := ""
	_, ok, err := f.r.Forward(f.ctx, key, hops, func(ctx context.Context, node *placementv1.Node) error {
		calls++
		if node.GetId() != 3 {
			t.Errorf("forwarded to node %d, want node 3", node.GetId())
		}
		a := "ok"
		if len(f.answers) > 0 {
			a, f.answers = f.answers[0], f.answers[1:]
		}
		last = a
		switch a {
		case "ok", "released", "already":
			return nil
		case "lead-here": // the connection breaks, and meanwhile node 1 is elected (term 5) and confirms its clock
			f.leadHere(5)
			return connect.NewError(connect.CodeUnavailable, errors.New("connection reset by peer"))
		case "broken":
			return connect.NewError(connect.CodeUnavailable, errors.New("connection reset by peer"))
		case "slow": // answers ok after 3 s (a waiting Acquire, say), longer than LeaderWait
			select {
			case <-time.After(3 * time.Second):
				return nil
			case <-ctx.Done():
				return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
			}
		case "garbled": // not Connect's answer: an HTTP 400 from something else on the address
			return connect.NewError(connect.CodeInternal, errors.New("protocol error: HTTP status 400 Bad Request"))
		}
		var code connect.Code
		if err := code.UnmarshalText([]byte(a)); err != nil {
			t.Fatalf("answer %q: %v", a, err)
		}
		return connect.NewWireError(code, errors.New("node 3 says "+a))
	})
	if !ok {
		return fmt.Sprintf("served here (%d calls)", calls)
	}
	out := fmt.Sprintf("%d calls to node 3: ", calls)
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return out + "answered " + last
	}
	return out + fmt.Sprintf("%v (wire %v): %s", ce.Code(), connect.IsWireError(ce), ce.Message())
}

// leadHere makes node 1 lead shard 10 in term: its replica and its
// Leadership report it, and its leader clock is confirmed.
func (f *routingFixture) leadHere(term uint64) {
	n, h := &f.r.nodes[0], f.hosts[1]
	h.mu.Lock()
	h.leader, h.term, h.valid = 1, term, true
	h.mu.Unlock()
	n.Leadership.leaderUpdated(10, h.replica, 1, term)
	n.Leadership.clockConfirmed(10, term)
}

// cancelWaits counts the CancelWait and DropWaiters commands the local
// hosts proposed.
func (f *routingFixture) cancelWaits() (cancels, drops int) {
	for _, h := range f.hosts {
		h.mu.Lock()
		cancels += h.cancels
		drops += h.drops
		h.mu.Unlock()
	}
	return cancels, drops
}

func (f *routingFixture) lookup() string {
	n, term, err := f.r.leader(f.ctx, 10)
	var rl *RemoteLeader
	switch {
	case err == nil:
		return fmt.Sprintf("local: node %d leads in term %d", n.ID, term.term)
	case errors.As(err, &rl):
		return fmt.Sprintf("remote: node %d", rl.Node.GetId())
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
	res, err := f.r.Propose(f.ctx, key, &shardv1.Envelope{Command: &shardv1.Envelope_Release{Release: &shardv1.ReleaseCmd{Resource: key}}})
	for _, h := range f.hosts {
		tries += h.proposals()
	}
	out := fmt.Sprintf("%d proposals, %d map reads: ", tries, f.meta.reads.Load()-reads)
	var rl *RemoteLeader
	switch {
	case errors.As(err, &rl):
		return out + fmt.Sprintf("forward to node %d", rl.Node.GetId())
	case err != nil && res != nil:
		return out + fmt.Sprintf("refused %v", res.GetCode())
	case err != nil:
		return out + "error: " + err.Error()
	}
	return out + res.GetCode().String()
}

// read runs the router's linearizable read of key's shard.
func (f *routingFixture) read(key string) string {
	_, err := f.r.Read(f.ctx, key, &shardv1.Query{})
	var rl *RemoteLeader
	switch {
	case errors.As(err, &rl):
		return fmt.Sprintf("forward to node %d", rl.Node.GetId())
	case err != nil:
		return "error: " + err.Error()
	}
	return "read"
}

// fakeHost is a scripted RaftHost: its leader view is what the script
// set, and its proposals answer the scripted result codes in turn (OK
// once they run out).
type fakeHost struct {
	replica uint64
	mu      sync.Mutex
	leader  uint64
	term    uint64
	valid   bool
	stopped bool
	// hang: a proposal or read gets no answer, as on a leader deposed
	// with it in flight, until its context ends (Dragonboat's errors).
	hang    bool
	results []shardv1.Code
	drop    int
	n       int
	cancels int // CancelWait commands proposed
	drops   int // DropWaiters commands proposed
	// snapshotBusy: the next snapshot calls that meet another snapshot
	// of the replica (errSnapshotBusy); snapshotIndex: the index a
	// snapshot then takes (0: nothing to snapshot); snapshots: the calls.
	snapshotBusy, snapshots int
	snapshotIndex           uint64
	// exportsUnanswered: the next exports whose read index gets no
	// answer until their context ends (a leader dropped it without
	// telling this follower); exports: the calls.
	exportsUnanswered, exports int
}

func (h *fakeHost) proposals() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

func (h *fakeHost) Propose(ctx context.Context, shardID uint64, cmd []byte) ([]byte, error) {
	env, err := shard.DecodeCommand(cmd)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n++
	if env.GetCancelWait() != nil {
		h.cancels++
	}
	if env.GetDropWaiters() != nil {
		h.drops++
	}
	if h.hang {
		h.mu.Unlock()
		defer h.mu.Lock()
		return nil, h.unanswered(ctx)
	}
	if h.drop > 0 {
		h.drop--
		return nil, fmt.Errorf("%w (%w): system busy", ErrNoLeader, ErrDropped)
	}
	code := shardv1.Code_CODE_OK
	if len(h.results) > 0 {
		code, h.results = h.results[0], h.results[1:]
	}
	return proto.Marshal(&shardv1.Result{Code: code})
}

// unanswered waits for ctx to end and returns what Dragonboat's
// SyncPropose and SyncRead return then.
func (h *fakeHost) unanswered(ctx context.Context) error {
	<-ctx.Done()
	if ctx.Err() == context.DeadlineExceeded {
		return proposeError(dragonboat.ErrTimeout)
	}
	return proposeError(dragonboat.ErrCanceled)
}

func (h *fakeHost) Read(ctx context.Context, shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	h.mu.Lock()
	hang := h.hang
	h.mu.Unlock()
	if hang {
		return nil, h.unanswered(ctx)
	}
	return &shardv1.QueryResult{Meta: &shardv1.ShardMeta{Range: &shardv1.RangeDescriptor{ShardId: shardID}}}, nil
}

func (h *fakeHost) StaleRead(shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error) {
	return h.Read(context.Background(), shardID, q)
}

func (h *fakeHost) LeaderOf(uint64) (uint64, uint64, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return 0, 0, false, errors.New("shard not found")
	}
	return h.leader, h.term, h.valid, nil
}

func (h *fakeHost) TransferLeader(uint64, uint64) error { return nil }

func (h *fakeHost) Snapshot(context.Context, uint64) (uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.snapshots++
	switch {
	case h.snapshotBusy > 0:
		h.snapshotBusy--
		return 0, ErrSnapshotBusy
	case h.snapshotIndex == 0:
		return 0, ErrNothingToSnapshot
	}
	return h.snapshotIndex, nil
}

// Export writes a five-byte file in place of the replica's state.
func (h *fakeHost) Export(ctx context.Context, _ uint64) (*shard.ExportedSnapshot, string, error) {
	h.mu.Lock()
	h.exports++
	unanswered := h.exportsUnanswered > 0
	if unanswered {
		h.exportsUnanswered--
	}
	h.mu.Unlock()
	if unanswered {
		return nil, "", h.unanswered(ctx)
	}
	f, err := os.CreateTemp("", "fakehost-export-*")
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	if _, err := f.WriteString("state"); err != nil {
		return nil, "", err
	}
	return &shard.ExportedSnapshot{Size: 5}, f.Name(), nil
}

func (h *fakeHost) ChangeMembership(context.Context, *placementv1.MembershipRequest) (*placementv1.MembershipResponse, error) {
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
