package router

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/lni/dragonboat/v4/raftio"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// Data-driven interaction tests of the router's distributed bookkeeping,
// in the style of etcd-io/raft's interaction_test.go: each file under
// testdata/interaction is a script of events and the state they leave,
// replayed deterministically (no Raft, no clock, no sleep). Run with
// -rewrite to regenerate the expected outputs after a deliberate change;
// review the diff.
//
// leadership.txt: a node's leader terms (Leadership) through Dragonboat's
// LeaderUpdated events, confirmations and drops, and what a leader timer
// makes of GetLeaderID's answers (leaderView).
//
//	event shard=S replica=R leader=L term=T     LeaderUpdated
//	confirm|clock|drop shard=S term=T
//	view shard=S id=I term=T [valid] [err]      leaderView of the current term; drops it as leaderTick does
//
// waiters.txt: waiting Acquires' subscriptions (WaitRegistry) and the
// hand-offs replicas report.
//
//	subscribe name=N resource=R request=Q
//	unsubscribe name=N
//	apply granted=R/Q/SEQ,... dropped=R/Q/SEQ,...  Observe of one applied result
//	find name=N seq=SEQ                          the first event of queue entry SEQ (and drops the rest)
//	take name=N
func TestInteractions(t *testing.T) {
	datadriven.Walk(t, "testdata/interaction", func(t *testing.T, path string) {
		l := NewLeadership(0)
		w := NewWaitRegistry()
		subs := map[string]*Subscription{}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "event":
				var s, r, lead, term uint64
				d.ScanArgs(t, "shard", &s)
				d.ScanArgs(t, "replica", &r)
				d.ScanArgs(t, "leader", &lead)
				d.ScanArgs(t, "term", &term)
				l.LeaderUpdated(raftio.LeaderInfo{ShardID: s, ReplicaID: r, LeaderID: lead, Term: term})
				return terms(l)
			case "confirm", "clock", "drop":
				var s, term uint64
				d.ScanArgs(t, "shard", &s)
				d.ScanArgs(t, "term", &term)
				map[string]func(uint64, uint64){"confirm": l.confirm, "clock": l.clockConfirmed, "drop": l.drop}[d.Cmd](s, term)
				return terms(l)
			case "view":
				var s, id, term uint64
				d.ScanArgs(t, "shard", &s)
				d.ScanArgs(t, "id", &id)
				d.ScanArgs(t, "term", &term)
				var err error
				if d.HasArg("err") {
					err = errors.New("replica stopped")
				}
				cur, ok := l.term(s)
				if !ok {
					return "not leading\n"
				}
				leads, drop := leaderView(cur, id, term, d.HasArg("valid"), err)
				if drop {
					l.drop(s, cur.term)
				}
				return fmt.Sprintf("leads %v, drop %v\n%s", leads, drop, terms(l))
			case "subscribe":
				var name, resource, request string
				d.ScanArgs(t, "name", &name)
				d.ScanArgs(t, "resource", &resource)
				d.ScanArgs(t, "request", &request)
				subs[name] = w.Subscribe(resource, request)
				return fmt.Sprintf("%d subscribed\n", subscribed(w))
			case "unsubscribe":
				var name string
				d.ScanArgs(t, "name", &name)
				w.Unsubscribe(subs[name])
				return fmt.Sprintf("%d subscribed\n", subscribed(w))
			case "apply":
				w.Observe(1, appliedResult(t, d))
				var out []string
				for _, name := range sortedNames(subs) {
					select {
					case <-subs[name].notify:
						out = append(out, name+" woken")
					default:
					}
				}
				return strings.Join(append(out, ""), "\n")
			case "find":
				var name string
				var seq uint64
				d.ScanArgs(t, "name", &name)
				d.ScanArgs(t, "seq", &seq)
				return eventString(subs[name].find(seq)) + "\n"
			case "take":
				var name string
				d.ScanArgs(t, "name", &name)
				var out []string
				for _, ev := range subs[name].take() {
					out = append(out, eventString(ev))
				}
				return strings.Join(append(out, ""), "\n")
			}
			t.Fatalf("unknown command %q", d.Cmd)
			return ""
		})
	})
}

// terms lists l's terms by shard: term, replica, and what is confirmed.
func terms(l *Leadership) string {
	led := l.led()
	if len(led) == 0 {
		return "no terms\n"
	}
	slices.SortFunc(led, func(a, b leaderTerm) int { return int(a.shardID) - int(b.shardID) })
	var b strings.Builder
	for _, t := range led {
		fmt.Fprintf(&b, "shard %d: term %d replica %d confirmed %v clock %v\n", t.shardID, t.term, t.replicaID, t.confirmed, t.clockOK)
	}
	return b.String()
}

func subscribed(w *WaitRegistry) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.mu.subs {
		n += len(s)
	}
	return n
}

func sortedNames(subs map[string]*Subscription) []string {
	var names []string
	for n := range subs {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// appliedResult is the applied result an apply command states: its
// granted and dropped waiter events (granted=R/Q/SEQ[/A],...
// dropped=R/Q/SEQ,...). A grant's lease id is lease-Q-SEQ.
func appliedResult(t *testing.T, d *datadriven.TestData) *shardv1.Result {
	res := &shardv1.Result{}
	for _, a := range d.CmdArgs {
		for _, v := range a.Vals {
			ev := waiterEvent(t, v)
			if a.Key == "granted" {
				ev.Lease = &shardv1.LeaseInfo{LeaseId: []byte(fmt.Sprintf("lease-%s-%d", ev.GetRequestId(), ev.GetSeq()))}
				res.Granted = append(res.Granted, ev)
			} else {
				res.Dropped = append(res.Dropped, ev)
			}
		}
	}
	return res
}

// waiterEvent parses RESOURCE/REQUEST/SEQ[/ATTEMPT].
func waiterEvent(t *testing.T, v string) *shardv1.WaiterEvent {
	parts := strings.Split(v, "/")
	var seq uint64
	if len(parts) != 3 && len(parts) != 4 {
		t.Fatalf("event %q: want resource/request/seq[/attempt]", v)
	}
	if _, err := fmt.Sscan(parts[2], &seq); err != nil {
		t.Fatalf("event %q: %v", v, err)
	}
	ev := &shardv1.WaiterEvent{Resource: parts[0], RequestId: parts[1], Seq: seq}
	if len(parts) == 4 {
		ev.AttemptId = []byte(parts[3])
	}
	return ev
}

func eventString(ev *shardv1.WaiterEvent) string {
	if ev == nil {
		return "none"
	}
	return fmt.Sprintf("%s/%s/%d", ev.GetResource(), ev.GetRequestId(), ev.GetSeq())
}
