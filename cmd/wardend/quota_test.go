package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/shard"
)

func (n *node) quota() wardenv1connect.QuotaServiceClient {
	if n.quotaAPI != nil {
		return n.quotaAPI
	}
	return wardenv1connect.NewQuotaServiceClient(http.DefaultClient, "http://"+n.listen)
}

// Case Q1: two routers, one last unit. limit(ns)=5 with 4 committed;
// R(ns,1,a) through node 1 and R(ns,1,b) through node 2 at once: exactly
// one succeeds with remaining 0, the other is resource_exhausted naming
// ns, and Query shows committed 4, reserved 1. Then, with two nodes
// down, reserves fail closed: unavailable, not exhausted.
func TestClusterQuotaLastUnit(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q1, q2 := c.nodes[0].quota(), c.nodes[1].quota()
	if _, err := q1.SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: "ns", Limit: 5})); err != nil {
		t.Fatal(err)
	}
	if _, err := q2.Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: "ns", Amount: 4, ReservationId: "base"})); err != nil {
		t.Fatal(err)
	}
	if _, err := q1.Commit(ctx, connect.NewRequest(&wardenv1.CommitRequest{Key: "ns", ReservationId: "base"})); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([]error, 2)
	remaining := make([]int64, 2)
	for i, q := range []wardenv1connect.QuotaServiceClient{q1, q2} {
		wg.Go(func() {
			resp, err := q.Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: "ns", Amount: 1, ReservationId: []string{"a", "b"}[i]}))
			results[i] = err
			if err == nil {
				remaining[i] = resp.Msg.GetRemaining()
			}
		})
	}
	wg.Wait()
	ok := 0
	for i, err := range results {
		var ce *connect.Error
		switch {
		case err == nil:
			ok++
			if remaining[i] != 0 {
				t.Fatalf("the winner has remaining %d, want 0", remaining[i])
			}
		case connect.CodeOf(err) != connect.CodeResourceExhausted || !errors.As(err, &ce):
			t.Fatalf("the loser: %v, want resource_exhausted", err)
		default:
			for _, d := range ce.Details() {
				if v, derr := d.Value(); derr == nil {
					if qe, isQE := v.(*wardenv1.QuotaExhausted); isQE && qe.GetLevel() != "ns" {
						t.Fatalf("the refusal names %q, want ns", qe.GetLevel())
					}
				}
			}
		}
	}
	if ok != 1 {
		t.Fatalf("%d of the two reserves for the last unit succeeded: %v", ok, results)
	}
	resp, err := c.nodes[2].quota().Query(ctx, connect.NewRequest(&wardenv1.QueryRequest{Key: "ns"}))
	if err != nil || resp.Msg.GetLevels()[0].GetCommitted() != 4 || resp.Msg.GetLevels()[0].GetReserved() != 1 {
		t.Fatalf("query: %v %v", resp, err)
	}

	c.kill(1)
	c.kill(2)
	rctx, rcancel := context.WithTimeout(ctx, 8*time.Second)
	defer rcancel()
	_, err = q1.Reserve(rctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: "ns", Amount: 1, ReservationId: "minority"}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("reserve without quorum: %v, want unavailable (fail closed)", err)
	}
}

// Case Q13 on three processes: a correction applies exactly once. It is
// sent as the shard's leader is SIGKILLed (its answer lost), retried
// three times on the new leader, then, after a follower left behind a
// log compaction and every node is restarted (the follower catches up by
// a snapshot install), retried again; usage rose by 7 once, the ledger
// has one CORRECTION event of the report, and a different observed value
// under the same report_id is invalid_argument and changes nothing.
func TestClusterCaseQ13CorrectionExactlyOnce(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	const key = "q13"
	if err := call(func(ctx context.Context) error {
		_, err := c.any().quota().SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: key, Limit: 100}))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var seq uint64
	if err := call(func(ctx context.Context) error {
		q, err := c.any().quota().Query(ctx, connect.NewRequest(&wardenv1.QueryRequest{Key: key}))
		if err == nil {
			seq = q.Msg.GetLedgerSeq()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	report := func(n *node, observed int64) (*wardenv1.ReportUsageResponse, error) {
		var out *wardenv1.ReportUsageResponse
		err := call(func(ctx context.Context) error {
			resp, err := n.quota().ReportUsage(ctx, connect.NewRequest(&wardenv1.ReportUsageRequest{Key: key, Observed: observed, ReportId: "c7", Correct: true, ObservedSeq: &seq}))
			if err == nil {
				out = resp.Msg
			}
			return err
		})
		return out, err
	}
	check := func(when string) {
		t.Helper()
		var q *wardenv1.QueryResponse
		if err := call(func(ctx context.Context) error {
			resp, err := c.any().quota().Query(ctx, connect.NewRequest(&wardenv1.QueryRequest{Key: key}))
			if err == nil {
				q = resp.Msg
			}
			return err
		}); err != nil {
			t.Fatalf("%s: query: %v", when, err)
		}
		if got := q.GetLevels()[0].GetCommitted(); got != 7 {
			t.Fatalf("%s: committed %d, want 7 (the correction once)", when, got)
		}
		events, _ := c.ledgerOf(key)
		corrections := 0
		for _, e := range events {
			if e.GetKind() == "CORRECTION" && e.GetReportId() == "c7" {
				corrections++
			}
		}
		if corrections != 1 {
			t.Fatalf("%s: %d CORRECTION events of c7 in the ledger, want 1: %v", when, corrections, events)
		}
	}

	// 1. Sent through a follower while the leader is SIGKILLed: whatever
	// that first try was told is lost.
	leader := c.leaderIndex(key)
	via := c.notLeader(key)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		ctx, cancel := rpcCtx()
		defer cancel()
		_, _ = c.nodes[via].quota().ReportUsage(ctx, connect.NewRequest(&wardenv1.ReportUsageRequest{Key: key, Observed: 7, ReportId: "c7", Correct: true, ObservedSeq: &seq}))
	}()
	time.Sleep(2 * time.Millisecond)
	c.kill(leader)
	<-sent
	c.waitLeaderNot(leader)
	// 2. Three retries on the new leader.
	for i := range 3 {
		got, err := report(c.nodes[via], 7)
		if err != nil || got.GetDrift() != 7 {
			t.Fatalf("retry %d: %v %v, want drift 7", i+1, got, err)
		}
	}
	check("after the lost answer and the leader's death")
	c.start(leader)
	c.waitServing(leader)

	// A follower stopped, left behind while the others write and compact
	// their logs, then a full restart: it catches up by a snapshot.
	behind := c.notLeader(key)
	c.kill(behind)
	for i := range 20 {
		if err := call(func(ctx context.Context) error {
			_, err := c.any().quota().Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: key + "/other", Amount: 1, ReservationId: fmt.Sprintf("fill-%d", i)}))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := call(func(ctx context.Context) error {
		_, err := c.any().admin.Snapshot(ctx, connect.NewRequest(&wardenv1.SnapshotRequest{ShardId: c.shardOf(key).GetId()}))
		return err
	}); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	for i := range c.nodes {
		if c.nodes[i].cmd != nil {
			c.kill(i)
		}
	}
	for i := range c.nodes {
		c.start(i)
	}
	for i := range c.nodes {
		c.waitServing(i)
	}
	n := c.nodes[behind]
	c.waitSnapshotInstalled(behind)
	got, err := report(n, 7)
	if err != nil || got.GetDrift() != 7 {
		t.Fatalf("retry after the restart: %v %v, want drift 7", got, err)
	}
	check("after the snapshot install and the full restart")
	// 3. The same report_id with another observed value.
	if _, err := report(n, 8); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("c7 with observed 8: %v, want invalid_argument", err)
	}
	check("after the refused variant")
}

// q11Outcome is what one repetition of case Q11 A was told.
type q11Outcome struct {
	key             string
	commitErr, rErr error
}

// Case Q11 A on three processes: a commit racing its reservation's
// expiry has exactly one outcome. On each of 40 keys (limit 10) a
// reservation of 10 for 2 s, then, at its expiry ± 30 ms, Commit(r1, 10)
// and Reserve(10, r2) at once; in the second of two rounds the shard's
// leader is SIGKILLed at the deadline (the calls retry with the same ids).
// Never both succeed; what each was told matches the totals (committed
// 10 after a commit, reserved 10 after r2, nothing after neither: r2
// came before the expiry and the commit after); never more than 10 in
// use; the ledger has r1's RESERVE and exactly one COMMIT or EXPIRE of
// it, as the commit's answer says.
func TestClusterCaseQ11CommitRacingExpiry(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t)
	for round := range 2 {
		var keys []string
		for i := range 40 {
			keys = append(keys, fmt.Sprintf("q11-%d-%d", round, i))
		}
		deadlines := map[string]time.Time{}
		for _, k := range keys {
			if err := retryUnavailable(func() error {
				ctx, cancel := rpcCtx()
				defer cancel()
				_, err := c.any().quota().SetLimit(ctx, connect.NewRequest(&wardenv1.SetLimitRequest{Key: k, Limit: 10}))
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range keys {
			ctx, cancel := rpcCtx()
			resp, err := c.any().quota().Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: k, Amount: 10, ReservationId: "r1", Ttl: durationpb.New(2 * time.Second)}))
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			deadlines[k] = resp.Msg.GetExpiresAt().AsTime()
		}
		if round == 1 {
			leader := c.leaderIndex(keys[0])
			killed := make(chan struct{})
			go func() {
				defer close(killed)
				time.Sleep(time.Until(deadlines[keys[len(keys)/2]]))
				c.kill(leader)
			}()
			defer func() {
				<-killed
				if c.nodes[leader].cmd == nil {
					c.start(leader)
					c.waitServing(leader)
				}
			}()
		}
		outcomes := make(chan q11Outcome, len(keys))
		for _, k := range keys {
			go func() {
				time.Sleep(time.Until(deadlines[k].Add(time.Duration(rand.IntN(61)-30) * time.Millisecond)))
				o := q11Outcome{key: k}
				var wg sync.WaitGroup
				wg.Go(func() {
					o.commitErr = retryUnavailable(func() error {
						ctx, cancel := rpcCtx()
						defer cancel()
						_, err := c.any().quota().Commit(ctx, connect.NewRequest(&wardenv1.CommitRequest{Key: k, ReservationId: "r1", Amount: 10}))
						return err
					})
				})
				wg.Go(func() {
					o.rErr = retryUnavailable(func() error {
						ctx, cancel := rpcCtx()
						defer cancel()
						_, err := c.any().quota().Reserve(ctx, connect.NewRequest(&wardenv1.ReserveRequest{Key: k, Amount: 10, ReservationId: "r2"}))
						return err
					})
				})
				wg.Wait()
				outcomes <- o
			}()
		}
		kinds := map[string]int{}
		for range keys {
			o := <-outcomes
			commitOK, rOK := o.commitErr == nil, o.rErr == nil
			switch {
			case commitOK && rOK:
				t.Fatalf("%s: both the commit and r2 succeeded: 20 in use", o.key)
			case !commitOK && connect.CodeOf(o.commitErr) != connect.CodeFailedPrecondition:
				t.Fatalf("%s: commit: %v, want ok or failed_precondition", o.key, o.commitErr)
			case !rOK && connect.CodeOf(o.rErr) != connect.CodeResourceExhausted:
				t.Fatalf("%s: r2: %v, want ok or resource_exhausted", o.key, o.rErr)
			}
			var q *wardenv1.QueryResponse
			if err := retryUnavailable(func() error {
				ctx, cancel := rpcCtx()
				defer cancel()
				resp, err := c.any().quota().Query(ctx, connect.NewRequest(&wardenv1.QueryRequest{Key: o.key}))
				if err == nil {
					q = resp.Msg
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			l := q.GetLevels()[0]
			want := [2]int64{} // committed, reserved
			switch {
			case commitOK:
				want, kinds["commit"] = [2]int64{10, 0}, kinds["commit"]+1
			case rOK:
				want, kinds["r2"] = [2]int64{0, 10}, kinds["r2"]+1
			default:
				kinds["neither"]++
			}
			if got := [2]int64{l.GetCommitted(), l.GetReserved()}; got != want {
				t.Fatalf("%s: committed, reserved = %v; the answers (commit %v, r2 %v) say %v", o.key, got, o.commitErr, o.rErr, want)
			}
			c.checkQ11Ledger(o.key, commitOK)
		}
		t.Logf("round %d (leader killed: %v): %v", round+1, round == 1, kinds)
	}
}

// checkQ11Ledger waits until key's ledger shows how r1 ended, and checks
// that it has r1's RESERVE and exactly one COMMIT (committed) or EXPIRE.
func (c *procCluster) checkQ11Ledger(key string, committed bool) {
	c.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		events, _ := c.ledgerOf(key)
		count := map[string]int{}
		for _, e := range events {
			if e.GetReservationId() == "r1" {
				count[e.GetKind()]++
			}
		}
		end := count["COMMIT"] + count["EXPIRE"]
		switch {
		case count["RESERVE"] != 1 || end > 1 || count["COMMIT"] == 1 && !committed || count["EXPIRE"] == 1 && committed:
			c.t.Fatalf("%s: r1's ledger events %v (committed: %v)", key, count, committed)
		case end == 1:
			return
		case time.Now().After(deadline):
			c.t.Fatalf("%s: r1's ledger never recorded how it ended: %v", key, count)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitSnapshotInstalled waits until a replica on node i shows that it
// recovered from a snapshot streamed to it: its state directory's CURRENT
// names a database after the first (shard.StateMachine swaps in a new
// one for each snapshot it loads).
func (c *procCluster) waitSnapshotInstalled(i int) {
	c.t.Helper()
	n := c.nodes[i]
	deadline := time.Now().Add(30 * time.Second)
	for {
		var seen []string
		for _, s := range c.checkShards() {
			for _, r := range s.GetReplicas() {
				if r.GetNodeId() != n.id {
					continue
				}
				cur, err := os.ReadFile(filepath.Join(shard.ReplicaDir(filepath.Join(n.dir, "sm"), s.GetId(), r.GetReplicaId()), "CURRENT"))
				if err == nil && strings.TrimSpace(string(cur)) != "db-1" {
					return
				}
				seen = append(seen, fmt.Sprintf("shard %d: %q %v", s.GetId(), cur, err))
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("premise: node %d caught up without a snapshot install (CURRENT of its replicas: %v)", n.id, seen)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
