//go:build linux

// Package nemesis is the fault suite (issue 41): three wardend processes,
// each in its own network namespace, reaching each other only through a
// proxy that cuts, delays and drops their connections, while clients on
// every side run a lock workload; then checkers hold the recorded history
// to DESIGN.md §1 and the run prints, per fault, what the clients saw.
// The short run is part of go test (as root); WARDEN_NEMESIS=long runs
// every fault several times (make nemesis). DESIGN.md §5 describes it.
package nemesis

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/deploy/deploytest"
	"github.com/warden-dev/warden/internal/proctest"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

const (
	maxClockSkew = 500 * time.Millisecond // the shards' default
	// clockOffset is what the clock-offset fault gives a node: within half
	// the skew bound, so the node may still lead.
	clockOffset = 200 * time.Millisecond
	// slack absorbs the difference between this process's clock reads and
	// a node's (same host, different reads, a loaded machine).
	slack = 50 * time.Millisecond
	// diskReserve is every node's --disk-reserve (diskReserveFlag):
	// small, so that the disk-full fault's tmpfs stays small.
	diskReserve     = 32 << 20
	diskReserveFlag = "32MiB"
	// diskTmpfsSize is the size of the tmpfs the disk-full fault's node
	// keeps its data directory on: the reserve, and room for what a run
	// leaves there (logDiskUsed; 10 MiB after a long run, 2026-12-07)
	// several times over, so that only the fault's fill reaches the
	// reserve.
	diskTmpfsSize = "96m"
)

// suite is one run: the cluster, its workload and what happened.
type suite struct {
	t    *testing.T
	c    *cluster
	w    *workload
	rng  *rand.Rand
	long bool
	// phases are the faults run, in order.
	phases []phase
}

// phase is one fault's run: injected at from, healed at healed, over at
// to (when the next one began).
type phase struct {
	fault            string
	what             string // which nodes, as printed
	from, healed, to time.Time
	minority         []int // nodes cut off from the majority, if any
	// serving are nodes whose probes must be granted between the fault
	// and the heal (the others of a disk-full node), if any.
	serving []int
}

// fault is one kind of fault: inject starts it and returns what it did,
// the nodes it cut off from the majority (if any) and how to heal it.
type fault struct {
	name   string
	inject func(s *suite) (what string, minority []int, heal func())
}

// others is every node index but i.
func others(i int) []int {
	var out []int
	for j := range 3 {
		if j != i {
			out = append(out, j)
		}
	}
	return out
}

// isolate cuts node i off from the other two.
func (s *suite) isolate(i int) {
	s.c.proxy.setCuts(pair(i, others(i)[0]), pair(i, others(i)[1]))
}

func (s *suite) heal() { s.c.proxy.setCuts() }

var faults = []fault{
	{"isolate-leader", func(s *suite) (string, []int, func()) {
		l := s.c.waitDataLeader()
		s.isolate(l)
		return fmt.Sprintf("node %d (data leader) cut off; its clients still reach it", l+1), []int{l}, s.heal
	}},
	{"isolate-follower", func(s *suite) (string, []int, func()) {
		f := others(s.c.waitDataLeader())[s.rng.IntN(2)]
		s.isolate(f)
		return fmt.Sprintf("node %d (follower) cut off", f+1), []int{f}, s.heal
	}},
	{"split-1|2", func(s *suite) (string, []int, func()) {
		x := s.rng.IntN(3)
		s.isolate(x)
		return fmt.Sprintf("node %d | nodes %v, clients on both sides", x+1, plus1(others(x))), []int{x}, s.heal
	}},
	{"bridge", func(s *suite) (string, []int, func()) {
		a := s.rng.IntN(3)
		b, c := others(a)[0], others(a)[1]
		s.c.proxy.setCuts(pair(b, c))
		return fmt.Sprintf("node %d sees %d and %d, which do not see each other", a+1, b+1, c+1), nil, s.heal
	}},
	{"flapping", func(s *suite) (string, []int, func()) {
		stop, done := make(chan struct{}), make(chan struct{})
		rng := rand.New(rand.NewPCG(s.rng.Uint64(), 1))
		go func() {
			defer close(done)
			for {
				switch k := rng.IntN(5); {
				case k < 3:
					s.isolate(k)
				case k == 3:
					a := rng.IntN(3)
					s.c.proxy.setCuts(pair(a, (a+1+rng.IntN(2))%3))
				default:
					s.heal()
				}
				select {
				case <-stop:
					return
				case <-time.After(time.Duration(300+rng.IntN(700)) * time.Millisecond):
				}
			}
		}()
		return "a random partition (isolate one node, cut one pair, or none) every 0.3-1 s", nil, func() { close(stop); <-done; s.heal() }
	}},
	{"raft-delay", func(s *suite) (string, []int, func()) {
		s.c.proxy.setFaults("raft", linkFaults{delay: 30 * time.Millisecond, jitter: 70 * time.Millisecond})
		return "every Raft chunk held 30-100 ms", nil, func() { s.c.proxy.setFaults("raft", linkFaults{}) }
	}},
	{"raft-drop", func(s *suite) (string, []int, func()) {
		s.c.proxy.setFaults("raft", linkFaults{drop: 0.02})
		return "2% of Raft chunks lost with their connection", nil, func() { s.c.proxy.setFaults("raft", linkFaults{}) }
	}},
	{"kill-all", func(s *suite) (string, []int, func()) {
		for i := range s.c.nodes {
			s.c.kill(i)
		}
		for i := range s.c.nodes {
			s.c.start(i, false)
		}
		return "SIGKILL all three nodes mid-load, then restart them", nil, func() {}
	}},
	{"disk-full", func(s *suite) (string, []int, func()) {
		// The tmpfs node leads the data shard or follows it, at random.
		i, role := s.c.diskNode, "data leader"
		other := others(i)[s.rng.IntN(2)]
		if s.rng.IntN(2) == 0 {
			s.c.leadData(i)
		} else {
			s.c.leadData(other)
			role = "follower"
		}
		// Half the reserve left: below it the node refuses to propose;
		// with a quarter left it would exit (code 28), which fails the
		// run at the heal.
		filler := filepath.Join(s.c.nodes[i].dir, "filler")
		proctest.FillTo(s.t, filler, diskReserve/2)
		s.c.waitDiskLow(i) // the fault begins when the node refuses
		return fmt.Sprintf("node %d (%s): its data directory filled to %d MiB free, half its reserve", i+1, role, diskReserve/2>>20), nil, func() {
			if err := os.Remove(filler); err != nil {
				s.t.Fatal(err)
			}
			n := s.c.nodes[i]
			select {
			case err := <-n.exited:
				n.exited <- err // for the cleanup's kill
				s.t.Fatalf("node %d exited with its disk filled to half its reserve (%v):\n%s", i+1, err, n.log.Tail(10))
			default:
			}
		}
	}},
	{"stop-leader", func(s *suite) (string, []int, func()) {
		l := s.c.waitDataLeader()
		s.c.signal(l, syscall.SIGSTOP)
		return fmt.Sprintf("SIGSTOP node %d (data leader) past a lease TTL + skew, then SIGCONT", l+1), []int{l}, func() { s.c.signal(l, syscall.SIGCONT) }
	}},
	// Real partitions are silent: connections are not closed, packets
	// vanish. A connection that went silent recovers only when TCP
	// retransmits again, after a backoff that grew through the cut.
	{"silent-isolate-leader", func(s *suite) (string, []int, func()) {
		l := s.c.waitDataLeader()
		s.c.silence(pair(l, others(l)[0]), pair(l, others(l)[1]))
		return fmt.Sprintf("node %d (data leader) cut off silently (packets dropped); its clients still reach it", l+1), []int{l}, func() { s.c.silence() }
	}},
	{"silent-bridge", func(s *suite) (string, []int, func()) {
		a := s.rng.IntN(3)
		b, c := others(a)[0], others(a)[1]
		s.c.silence(pair(b, c))
		return fmt.Sprintf("node %d sees %d and %d, which do not see each other (packets dropped)", a+1, b+1, c+1), nil, func() { s.c.silence() }
	}},
	{"clock-offset", func(s *suite) (string, []int, func()) {
		i := s.rng.IntN(3)
		s.restartWithOffset(i, clockOffset)
		return fmt.Sprintf("node %d restarted with --debug-clock-offset %v", i+1, clockOffset), nil, func() { s.restartWithOffset(i, 0) }
	}},
}

func plus1(is []int) []int {
	out := make([]int, len(is))
	for k, i := range is {
		out[k] = i + 1
	}
	return out
}

// restartWithOffset SIGKILLs node i and starts it again with its clock
// off by offset.
func (s *suite) restartWithOffset(i int, offset time.Duration) {
	s.c.kill(i)
	s.c.nodes[i].offset = offset
	s.c.start(i, false)
}

// shortFaults are the faults of the short run (go test): the partitions
// DESIGN.md §5 names first, and a silent one.
var shortFaults = []string{"isolate-leader", "isolate-follower", "split-1|2", "kill-all", "stop-leader", "silent-bridge"}

// healBound bounds, for the partitions (healBounded), the time from the
// heal until every node's probe is granted again (DESIGN.md §5). A silent
// partition is held silentHold at least: long enough for TCP's
// retransmission backoff on a silent connection to reach far past the
// bound (retransmissions 0.2, 0.6, 1.4, 3.0, 6.2, 12.6 and 25.4 s after
// the first loss: the next after a 14 s cut comes 11.4 s after the
// heal), which a node that reused such a connection waited for.
const (
	healBound  = 4 * time.Second
	silentHold = 8 * time.Second
)

// healBounded are the faults whose heal is the network's alone (no
// process restarts) and which healBound applies to.
var healBounded = []string{"isolate-leader", "isolate-follower", "split-1|2", "bridge", "silent-isolate-leader", "silent-bridge"}

// TestNemesis runs the fault schedule against three wardend processes
// under load and checks the history. WARDEN_NEMESIS=long runs every
// fault three times with longer faults; WARDEN_NEMESIS_SEED replays a
// run's schedule and choices; WARDEN_NEMESIS_FAULTS (names, comma
// separated) runs only those faults.
func TestNemesis(t *testing.T) {
	_, err := exec.LookPath("ip")
	deploytest.Need(t, err == nil, "ip (iproute2) is not installed: the nemesis puts each node in a network namespace")
	_, err = exec.LookPath("nft")
	deploytest.Need(t, err == nil, "nft (nftables) is not installed: the nemesis cuts links silently with it")
	deploytest.Need(t, os.Geteuid() == 0, "the nemesis creates network namespaces, which needs root")
	long := os.Getenv("WARDEN_NEMESIS") == "long"
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("WARDEN_NEMESIS_SEED"); v != "" {
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("WARDEN_NEMESIS_SEED %q: %v", v, err)
		}
	}
	s := &suite{t: t, rng: rand.New(rand.NewPCG(seed, 0)), long: long}
	names, reps, faultFor, healFor := shortFaults, 1, 3*time.Second, 3*time.Second
	if long {
		names, reps, faultFor, healFor = nil, 3, 8*time.Second, 5*time.Second
		for _, f := range faults {
			names = append(names, f.name)
		}
	}
	if v := os.Getenv("WARDEN_NEMESIS_FAULTS"); v != "" {
		names = strings.Split(v, ",")
		for _, n := range names {
			if !slices.ContainsFunc(faults, func(f fault) bool { return f.name == n }) {
				t.Fatalf("WARDEN_NEMESIS_FAULTS: no fault %q", n)
			}
		}
	}
	var schedule []fault
	for range reps {
		for _, n := range names {
			schedule = append(schedule, faults[slices.IndexFunc(faults, func(f fault) bool { return f.name == n })])
		}
	}
	s.rng.Shuffle(len(schedule), func(a, b int) { schedule[a], schedule[b] = schedule[b], schedule[a] })
	var order []string
	for _, f := range schedule {
		order = append(order, f.name)
	}
	t.Logf("nemesis seed %d (replay: WARDEN_NEMESIS_SEED=%d); schedule: %s", seed, seed, strings.Join(order, ", "))

	diskNode := -1
	if slices.Contains(order, "disk-full") {
		diskNode = 2
	}
	s.c = startCluster(t, seed, diskNode)
	s.checkNoBypass()
	s.w = newWorkload(s.c)
	s.newPool()
	s.w.start(seed, 2)
	defer s.w.halt()
	time.Sleep(2 * time.Second) // load before the first fault
	for _, f := range schedule {
		s.newPool()
		p := phase{fault: f.name}
		var heal func()
		p.what, p.minority, heal = f.inject(s)
		p.from = time.Now()
		if f.name == "disk-full" {
			p.serving = others(s.c.diskNode)
		}
		t.Logf("%s %s: %s", stamp(p.from), f.name, p.what)
		hold := faultFor
		switch {
		case f.name == "stop-leader":
			hold = max(hold, leaseTTL+maxClockSkew+time.Second)
		case strings.HasPrefix(f.name, "silent-"):
			hold = max(hold, silentHold)
		}
		time.Sleep(hold)
		heal()
		p.healed = time.Now()
		t.Logf("%s %s healed", stamp(p.healed), f.name)
		time.Sleep(max(healFor, healBound+time.Second))
		p.to = time.Now()
		s.phases = append(s.phases, p)
	}
	s.w.halt()
	if diskNode >= 0 {
		s.logDiskUsed()
	}
	s.report()
}

// logDiskUsed logs how much of the disk-full fault's tmpfs the node's
// data occupies (what diskTmpfsSize must hold).
func (s *suite) logDiskUsed() {
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.c.nodes[s.c.diskNode].dir, &st); err != nil {
		s.t.Fatal(err)
	}
	size, free := st.Blocks*uint64(st.Bsize), st.Bfree*uint64(st.Bsize)
	s.t.Logf("node %d's data directory uses %d MiB of its %d MiB tmpfs at the end of the run", s.c.diskNode+1, (size-free)>>20, size>>20)
}

// checkNoBypass asserts that the nodes reach each other only through the
// proxy: with every pair cut, no node gets a grant committed.
func (s *suite) checkNoBypass() {
	t := s.t
	s.c.proxy.setCuts(pair(0, 1), pair(0, 2), pair(1, 2))
	for i, n := range s.c.nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err := n.locks.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: fmt.Sprintf("bypass/%d", i), RequestId: "b", LeaseTtl: durationpb.New(time.Second)}))
		cancel()
		if err == nil {
			t.Fatalf("node %d granted a lock with every pair of nodes cut at the proxy: something bypasses it", i+1)
		}
	}
	s.heal()
	for i := range s.c.nodes {
		s.c.waitServing(i)
	}
}

// report runs the checkers over the history and prints the table; any
// violation fails the test.
func (s *suite) report() {
	t := s.t
	ops := s.w.hist.snapshot()
	margin := slack
	if slices.ContainsFunc(s.phases, func(p phase) bool { return p.fault == "clock-offset" }) {
		margin += clockOffset
	}
	vs := checkLeases(ops, checkConfig{skew: maxClockSkew, margin: margin})
	var ws []window
	for _, p := range s.phases {
		if len(p.minority) > 0 {
			m := map[int]bool{}
			for _, i := range p.minority {
				m[i] = true
			}
			ws = append(ws, window{from: p.from, to: p.healed, minority: m})
		}
	}
	vs = append(vs, checkMinority(ops, ws)...)
	lin, lvs := checkLinearizable(ops, s.w.resources, checkConfig{skew: maxClockSkew, margin: margin}, 60*time.Second)
	vs = append(vs, lvs...)
	qops := s.w.hist.quotaSnapshot()
	for _, pool := range s.w.pools.all {
		vs = append(vs, checkPool(qops, pool, poolLimit, margin)...)
	}
	vs = append(vs, s.checkLedger(0)...)

	type row struct {
		calls, grants, reserves, unavail, minUnavail, minUnknown int
		recover, heal, minLatency                                []time.Duration
		violations                                               []violation
	}
	rows := map[string]*row{}
	var names []string
	for _, p := range s.phases {
		r := rows[p.fault]
		if r == nil {
			r = &row{}
			rows[p.fault] = r
			names = append(names, p.fault)
		}
		firstGrant := map[int]time.Time{} // node → the first probe grant after the heal
		var recovered time.Time
		for _, o := range ops {
			if o.invoke.Before(p.from) || !o.invoke.Before(p.to) {
				continue
			}
			r.calls++
			probe := o.client < 0
			switch {
			case o.kind == "acquire" && o.outcome == okOutcome:
				r.grants++
				if probe && (recovered.IsZero() || o.done.Before(recovered)) {
					recovered = o.done
				}
				if probe && !o.invoke.Before(p.healed) {
					if f, ok := firstGrant[o.node]; !ok || o.done.Before(f) {
						firstGrant[o.node] = o.done
					}
				}
			case o.outcome == unavailable:
				r.unavail++
			}
			if slices.Contains(p.minority, o.node) && o.invoke.Before(p.healed) && o.kind != "describe" {
				switch o.outcome {
				case unavailable:
					r.minUnavail++
				case unknown:
					r.minUnknown++
				}
				r.minLatency = append(r.minLatency, o.done.Sub(o.invoke))
			}
		}
		for _, o := range qops {
			if o.invoke.Before(p.from) || !o.invoke.Before(p.to) {
				continue
			}
			r.calls++
			switch {
			case o.kind == "reserve" && o.outcome == okOutcome:
				r.reserves++
			case o.outcome == unavailable:
				r.unavail++
			}
		}
		if !recovered.IsZero() {
			r.recover = append(r.recover, recovered.Sub(p.from))
		}
		if len(firstGrant) == len(s.c.nodes) {
			var last time.Time
			for _, f := range firstGrant {
				if f.After(last) {
					last = f
				}
			}
			r.heal = append(r.heal, last.Sub(p.healed))
			if took := last.Sub(p.healed); took > healBound && slices.Contains(healBounded, p.fault) {
				vs = append(vs, violation{"heal", p.healed, fmt.Sprintf("every node served again %v after the heal, past the bound %v", took.Round(time.Millisecond), healBound)})
			}
		} else if slices.Contains(healBounded, p.fault) {
			vs = append(vs, violation{"heal", p.healed, fmt.Sprintf("only nodes %v of %d served again within %v of the heal", plus1(slices.Sorted(maps.Keys(firstGrant))), len(s.c.nodes), p.to.Sub(p.healed).Round(time.Millisecond))})
		}
		for _, v := range vs {
			if !v.at.Before(p.from) && v.at.Before(p.to) {
				r.violations = append(r.violations, v)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-17s %6s %6s %8s %7s %16s %16s %18s  %s\n", "fault", "calls", "grants", "reserves", "unavail", "recover p50/p99", "heal p50/p99", "minority", "verdict")
	for _, n := range names {
		r := rows[n]
		verdict := "ok"
		if len(r.violations) > 0 {
			verdict = fmt.Sprintf("%d VIOLATIONS", len(r.violations))
		}
		minority := "-"
		if r.minUnavail+r.minUnknown > 0 {
			minority = fmt.Sprintf("%d/%d, %s", r.minUnavail, r.minUnknown, ms(quantile(r.minLatency, 0.5)))
		}
		fmt.Fprintf(&b, "%-17s %6d %6d %8d %7d %16s %16s %18s  %s\n", n, r.calls, r.grants, r.reserves, r.unavail,
			ms(quantile(r.recover, 0.5))+"/"+ms(quantile(r.recover, 0.99)), ms(quantile(r.heal, 0.5))+"/"+ms(quantile(r.heal, 0.99)), minority, verdict)
	}
	b.WriteString("recover: from the fault to the first probe grant; heal: from the heal until every node's probe is granted;\n" +
		"minority: calls to cut-off nodes (invoked before the heal) answered unavailable / unknown (deadline), and their p50 latency\n")
	for _, p := range s.phases {
		if p.fault != "disk-full" {
			continue
		}
		// The full node refuses to propose: its clients' writes are
		// granted once it has handed its leads away (it forwards them).
		outcomes := map[string]int{}
		for _, o := range ops {
			if o.node == s.c.diskNode && o.kind != "describe" && !o.invoke.Before(p.from) && o.invoke.Before(p.healed) {
				outcomes[o.outcome]++
			}
		}
		fmt.Fprintf(&b, "disk-full %s (%s): lock calls through node %d before the heal: %d ok, %d refused, %d unavailable, %d unknown\n",
			stamp(p.from), p.what, s.c.diskNode+1, outcomes[okOutcome], outcomes[refused], outcomes[unavailable], outcomes[unknown])
	}
	fmt.Fprintf(&b, "porcupine over the lock history: %s\n", lin)
	t.Log(b.String())
	for _, v := range vs {
		t.Errorf("%s %s", stamp(v.at), v)
	}
	for _, p := range s.phases {
		if r := rows[p.fault]; len(r.recover) == 0 {
			t.Errorf("%s: no grant after the fault began", p.fault)
		}
		for _, i := range p.serving {
			if !slices.ContainsFunc(ops, func(o op) bool {
				return o.client < 0 && o.node == i && o.kind == "acquire" && o.outcome == okOutcome && !o.invoke.Before(p.from) && o.done.Before(p.healed)
			}) {
				t.Errorf("%s at %s: node %d granted no probe between the fault and the heal (%s): %s", p.fault, stamp(p.from), i+1, stamp(p.healed), p.what)
			}
		}
	}
}

// quantile is the q-quantile of ds (nearest rank), -1 when ds is empty.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return -1
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// ms prints d in milliseconds, "-" for none.
func ms(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%dms", d.Milliseconds())
}
