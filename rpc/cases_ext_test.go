package rpc_test

import (
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/server"
	"github.com/warden-dev/warden/shard"
)

// Case L15 (etcd #22082): a stale Release retry never ends a newer lease
// of the same holder. H releases L1 (the reply is lost), acquires again
// under a new request id, and the lost Release is delivered again: it
// answers released: false (and already_released) and changes nothing; the lease ids differ, the
// token rose, B cannot take the lock, and a RenewBatch of both leases
// renews only the current one.
func TestCaseL15StaleReleaseRetry(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	acquire := func(reqID, holder string) *wardenv1.AcquireResponse {
		resp, err := c.locks.Acquire(ctx(t), connect.NewRequest(&wardenv1.AcquireRequest{
			Resource: "r", RequestId: reqID, Holder: holder, LeaseTtl: durationpb.New(10 * time.Second)}))
		if err != nil {
			t.Fatalf("acquire %s: %v", reqID, err)
		}
		return resp.Msg
	}
	l1 := acquire("a1", "H")
	if ok, err := c.release("r", l1.GetLeaseId()); err != nil || !ok {
		t.Fatalf("release L1: %v %v", ok, err)
	}
	l2 := acquire("a2", "H")
	if l2.GetLeaseId() == l1.GetLeaseId() || l2.GetFencingToken() <= l1.GetFencingToken() {
		t.Fatalf("second lease %v after %v: the lease id must differ and the token rise", l2, l1)
	}
	// It says the lease was released, by a Release of L1 (the first).
	again, err := c.locks.Release(ctx(t), connect.NewRequest(&wardenv1.ReleaseRequest{Resource: "r", LeaseId: l1.GetLeaseId()}))
	if err != nil || again.Msg.GetReleased() || !again.Msg.GetAlreadyReleased() {
		t.Fatalf("the lost Release of L1 delivered again: %v (%v), want released false, already_released", again, err)
	}
	if d := c.describe("r"); !d.GetHeld() || d.GetFencingToken() != l2.GetFencingToken() || d.GetHolder() != "H" {
		t.Fatalf("after the stale release: %v, want held by H with token %d", d, l2.GetFencingToken())
	}
	_, err = c.acquireWait(ctx(t), "r", "b1", 10*time.Second, time.Second)
	wantCode(t, err, connect.CodeDeadlineExceeded)
	out, err := c.renewBatch("r", l1.GetLeaseId(), "r", l2.GetLeaseId())
	if err != nil {
		t.Fatal(err)
	}
	if out[0].GetCode() != "failed_precondition" || out[1].GetCode() != "" || !out[1].GetExpiresAt().AsTime().After(l2.GetExpiresAt().AsTime()) {
		t.Fatalf("RenewBatch{L1, L2}: %v, want L1 refused and L2 renewed", out)
	}
}

// Case Q13, in one process: a correction is applied exactly once. Its
// answer is lost (the client retries the same report_id), a leader
// changes, the whole cluster restarts, and a retry still replays the
// first drift and moves committed usage once; a different observed
// value under the same report_id is invalid_argument. (The multi-process
// half, with SIGKILL and a snapshot install, is cmd/wardend's
// TestClusterCaseQ13CorrectionExactlyOnce.)
func TestCaseQ13CorrectionExactlyOnce(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	quota := func() wardenv1connect.QuotaServiceClient {
		return wardenv1connect.NewQuotaServiceClient(c.srv.Client(), c.srv.URL)
	}
	if _, err := quota().SetLimit(ctx(t), connect.NewRequest(&wardenv1.SetLimitRequest{Key: "q13", Limit: 100})); err != nil {
		t.Fatal(err)
	}
	q, err := quota().Query(ctx(t), connect.NewRequest(&wardenv1.QueryRequest{Key: "q13"}))
	if err != nil {
		t.Fatal(err)
	}
	seq := q.Msg.GetLedgerSeq()
	report := func(observed int64) (*wardenv1.ReportUsageResponse, error) {
		resp, err := quota().ReportUsage(ctx(t), connect.NewRequest(&wardenv1.ReportUsageRequest{Key: "q13", Observed: observed, ReportId: "rec-1", Correct: true, ObservedSeq: &seq}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	committed := func() int64 {
		q, err := quota().Query(ctx(t), connect.NewRequest(&wardenv1.QueryRequest{Key: "q13"}))
		if err != nil {
			t.Fatal(err)
		}
		return q.Msg.GetLevels()[0].GetCommitted()
	}
	first, err := report(7) // its answer "lost": the client retries below
	if err != nil || first.GetDrift() != 7 {
		t.Fatalf("first report: %v %v", first, err)
	}
	check := func(when string) {
		t.Helper()
		again, err := report(7)
		if err != nil || again.GetDrift() != 7 || committed() != 7 {
			t.Fatalf("%s: retry answered %v (%v), committed %d; want drift 7 and committed 7", when, again, err, committed())
		}
		_, err = report(8)
		wantCode(t, err, connect.CodeInvalidArgument)
	}
	check("after a lost answer")
	if !c.moveLeader() {
		t.Fatal("the leader did not change")
	}
	check("after a leader change")
	c.restart()
	check("after a full restart")
}

// Case S1's last clause: a shard whose revision nears 2^40 takes a new
// epoch instead of refusing grants. With the headroom lowered so that
// the leader renews the epoch past revision 20, a run of grants sees the
// epoch change again and again, every token above the one before, and
// none refused.
func TestShardTakesNewEpochBeforeRevisionsRunOut(t *testing.T) {
	c := startCluster(t, server.DevConfig{Router: router.Config{Knobs: router.TestingKnobs{RevisionHeadroom: shard.MaxRevision - 20}}})
	epochs := map[uint64]bool{}
	var last uint64
	for i := range 150 {
		a, err := c.acquire("epoch", fmt.Sprintf("q%d", i), 5*time.Second)
		if err != nil {
			t.Fatalf("grant %d: %v", i, err)
		}
		if a.GetFencingToken() <= last {
			t.Fatalf("grant %d: token %#x after %#x", i, a.GetFencingToken(), last)
		}
		last = a.GetFencingToken()
		e, _ := shard.SplitToken(last)
		epochs[e] = true
		if ok, err := c.release("epoch", a.GetLeaseId()); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if i%20 == 19 {
			time.Sleep(3 * c.cfg.Router.ScanInterval) // a leader tick or two
		}
	}
	if len(epochs) < 3 {
		t.Fatalf("150 grants saw epochs %v: the shard did not take new epochs", epochs)
	}
	t.Logf("150 grants in %d epochs", len(epochs))
	checkReplicasAgree(t, c)
}
