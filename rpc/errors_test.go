package rpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/placement"
	"github.com/warden-dev/warden/router"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/shard"
)

// One table classifies every error: the code a client gets and the label
// metrics count are read from the same entry, for the shard's refusals,
// forwarded answers and the router's own errors alike.
func TestClassifyOneModel(t *testing.T) {
	refusal := func(c shardv1.Code) error { return &router.ResultError{Res: &shardv1.Result{Code: c, Reason: "r"}} }
	for _, tc := range []struct {
		err   error
		code  connect.Code
		label string
	}{
		{refusal(shardv1.Code_CODE_CONFLICT), connect.CodeAborted, "conflict"},
		{refusal(shardv1.Code_CODE_FAILED_PRECONDITION), connect.CodeFailedPrecondition, "stale"},
		{refusal(shardv1.Code_CODE_INVALID_ARGUMENT), connect.CodeInvalidArgument, "invalid"},
		{refusal(shardv1.Code_CODE_WRONG_SHARD), connect.CodeUnavailable, "unavailable"},
		{refusal(shardv1.Code_CODE_RESOURCE_EXHAUSTED), connect.CodeResourceExhausted, "exhausted"},
		{refusal(shardv1.Code_CODE_INTERNAL), connect.CodeInternal, "error"},
		{connect.NewError(connect.CodeUnavailable, errors.New("forwarded")), connect.CodeUnavailable, "unavailable"},
		{connect.NewError(connect.CodeAborted, errors.New("forwarded")), connect.CodeAborted, "conflict"},
		{&router.RemoteLeader{Node: &placementv1.Node{Id: 2}}, connect.CodeUnavailable, "unavailable"},
		{&shard.FieldError{Field: "resource", Reason: "empty"}, connect.CodeInvalidArgument, "invalid"},
		{context.Canceled, connect.CodeCanceled, "canceled"},
		{router.ErrWaitTimedOut, connect.CodeDeadlineExceeded, "timeout"},
		{router.ErrOutcomeUnknown, connect.CodeUnavailable, "unknown"},
		{router.ErrNoLeader, connect.CodeUnavailable, "unavailable"},
		{router.ErrClockUnconfirmed, connect.CodeUnavailable, "unavailable"},
		{errors.New("anything else"), connect.CodeInternal, "error"},
	} {
		if got := connect.CodeOf(toConnect(tc.err)); got != tc.code {
			t.Errorf("%v: code %v, want %v", tc.err, got, tc.code)
		}
		if got := outcome(tc.err); got != tc.label {
			t.Errorf("%v: outcome %q, want %q", tc.err, got, tc.label)
		}
		if unavailable(tc.err) != (tc.code == connect.CodeUnavailable) {
			t.Errorf("%v: unavailable %v with code %v", tc.err, unavailable(tc.err), tc.code)
		}
	}
	if outcome(nil) != "ok" || toConnect(nil) != nil {
		t.Error("nil is not ok")
	}
}

// The retryable answers carry what the caller needs to recover, as
// CockroachDB's NotLeaseHolderError and RangeKeyMismatchError do: where
// the shard is led from (only when that is known, not a replica merely
// asked) and where a moved range went.
func TestUnavailableCarriesRecoveryDetails(t *testing.T) {
	node := &placementv1.Node{Id: 2, ListenAddr: "10.0.0.2:7070"}
	moved := &wardenv1.RangeMoved{ShardId: 5, RangeStart: 1 << 63, Generation: 9, LeaderNodeId: 2, LeaderAddress: "10.0.0.2:7070"}
	for _, tc := range []struct {
		err  error
		want proto.Message
	}{
		{&router.RemoteLeader{ShardID: 3, Node: node, Term: 7}, &wardenv1.NotLeader{ShardId: 3, LeaderNodeId: 2, LeaderAddress: "10.0.0.2:7070", Term: 7}},
		{&router.RemoteLeader{ShardID: 3, Node: node}, &wardenv1.NotLeader{ShardId: 3}},
		{fmt.Errorf("leader: %w", &router.NoLeaderError{ShardID: 4}), &wardenv1.NotLeader{ShardId: 4}},
		{&router.ResultError{Res: &shardv1.Result{Code: shardv1.Code_CODE_WRONG_SHARD},
			Moved: &router.RangeMoved{ShardID: 5, Start: 1 << 63, Generation: 9, LeaderNodeID: 2, LeaderAddress: "10.0.0.2:7070"}}, moved},
	} {
		ce := new(connect.Error)
		if !errors.As(toConnect(tc.err), &ce) || ce.Code() != connect.CodeUnavailable {
			t.Fatalf("%v: %v, want unavailable", tc.err, toConnect(tc.err))
		}
		if len(ce.Details()) != 1 {
			t.Fatalf("%v: %d details, want 1", tc.err, len(ce.Details()))
		}
		got, err := ce.Details()[0].Value()
		if err != nil || !proto.Equal(got, tc.want) {
			t.Errorf("%v: detail %v (%v), want %v", tc.err, got, err, tc.want)
		}
	}
	if !errors.Is(&router.NoLeaderError{ShardID: 4}, router.ErrNoLeader) {
		t.Error("a noLeaderError is not ErrNoLeader")
	}
}

// An internal error reaches the client as an id, never its text; the
// node's log has the text under the same id.
func TestInternalErrorSendsOnlyAnID(t *testing.T) {
	var log bytes.Buffer
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.NewTextHandler(&log, nil)))
	for _, err := range []error{
		errors.New("pebble: /var/lib/warden/sm/shard-1 is corrupt"),
		&router.ResultError{Res: &shardv1.Result{Code: shardv1.Code_CODE_INTERNAL, Reason: "fencing token 7 would not exceed the last token 9"}},
	} {
		log.Reset()
		got := toConnect(err)
		var ce *connect.Error
		if !errors.As(got, &ce) || ce.Code() != connect.CodeInternal {
			t.Fatalf("%v: %v, want internal", err, got)
		}
		if strings.Contains(ce.Message(), "pebble") || strings.Contains(ce.Message(), "token") {
			t.Fatalf("the client got the internal text: %q", ce.Message())
		}
		id := strings.Fields(strings.TrimPrefix(ce.Message(), "internal error "))[0]
		id = strings.TrimSuffix(id, ":")
		if !strings.Contains(log.String(), "error_id="+id) || !strings.Contains(log.String(), err.Error()) {
			t.Fatalf("the log does not hold %v under id %s: %s", err, id, log.String())
		}
	}
}

// forward retries a call that got no answer from a Warden node and, when
// no node answers for LeaderWait, tells the client Unavailable (retry with
// the same ids), never the Internal that a plain HTTP 400 maps to.
func TestForwardRetriesWhatNoNodeAnswered(t *testing.T) {
	var calls atomic.Int32
	plain := plain400(t, &calls)
	r := ledFrom(plain.URL, router.Config{LeaderWait: 300 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	req := connect.NewRequest(&wardenv1.RenewRequest{Resource: "orders/42", LeaseId: "x"})
	_, where, err := forward(context.Background(), newNode(r), req, "orders/42", func(p *peer) peerCall[wardenv1.RenewRequest, wardenv1.RenewResponse] {
		return p.Locks.Renew
	})
	if where != servedNowhere || connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("forwarded: served %v, err %v; want no node's answer, Unavailable", where, err)
	}
	if n := calls.Load(); n < 2 {
		t.Fatalf("the plain server saw %d calls, want retries", n)
	}
}

// notLeaderOf is err's NotLeader detail, nil if it has none.
func notLeaderOf(err error) *wardenv1.NotLeader {
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if nl, ok := v.(*wardenv1.NotLeader); ok {
				return nl
			}
		}
	}
	return nil
}

// plain400 is a server that answers every request with Go's plain-text
// HTTP 400, as something other than a Warden node on a node's address
// would; it counts the requests in calls, if given.
func plain400(t *testing.T, calls *atomic.Int32) *httptest.Server {
	srv := peerServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls != nil {
			calls.Add(1)
		}
		http.Error(w, "400 Bad Request", http.StatusBadRequest)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// ledFrom is a Router with no local replica whose one shard, the whole
// key space, is led from node 2 at url (a peerServer).
func ledFrom(url string, cfg router.Config) *router.Router {
	m := placement.NewMap(&placementv1.State{
		Nodes:  []*placementv1.Node{{Id: 2, ListenAddr: strings.TrimPrefix(url, "http://")}},
		Ranges: []*shardv1.RangeDescriptor{{ShardId: 1}},
		Shards: []*placementv1.Shard{{Id: 1, Replicas: []*placementv1.Replica{{ReplicaId: 1, NodeId: 2}}}},
	})
	r := router.New(nil, nil, m, nil, cfg, router.NewPeers("", nil))
	return r
}

// renewAnswerer is a node's LockService that renews every lease.
type renewAnswerer struct {
	wardenv1connect.UnimplementedLockServiceHandler
	calls atomic.Int32
}

func (a *renewAnswerer) Renew(context.Context, *connect.Request[wardenv1.RenewRequest]) (*connect.Response[wardenv1.RenewResponse], error) {
	a.calls.Add(1)
	return connect.NewResponse(&wardenv1.RenewResponse{}), nil
}

// A call that another node served is counted and audited there, once:
// the forwarding node's observer records nothing of it.
func TestForwardedCallIsRecordedWhereServed(t *testing.T) {
	leader := &renewAnswerer{}
	_, h := wardenv1connect.NewLockServiceHandler(leader)
	remote := peerServer(h)
	defer remote.Close()
	var audit bytes.Buffer
	r := ledFrom(remote.URL, router.Config{Logger: slog.New(slog.DiscardHandler), Audit: slog.New(slog.NewJSONHandler(&audit, nil))})
	here := httptest.NewServer(NewHandler(r))
	defer here.Close()
	counted := func() float64 {
		return testutil.ToFloat64(metrics.rpcOutcomes.WithLabelValues("Renew", "ok"))
	}
	before := counted()
	if _, err := wardenv1connect.NewLockServiceClient(http.DefaultClient, here.URL).Renew(context.Background(),
		connect.NewRequest(&wardenv1.RenewRequest{Resource: "orders/42", LeaseId: strings.Repeat("00", 16)})); err != nil {
		t.Fatal(err)
	}
	if leader.calls.Load() != 1 {
		t.Fatalf("premise: the leader's node served %d calls, want 1", leader.calls.Load())
	}
	if got := counted() - before; got != 0 || audit.Len() != 0 {
		t.Fatalf("the forwarding node counted %v renewals and audited %q; the serving node records them", got, audit.String())
	}
}

// A forwarded call that no node answered is recorded where it came in
// (no node served it), once, and the client's Unavailable names no
// address or other server's text; the log keeps them.
func TestUnansweredForwardIsRecordedHere(t *testing.T) {
	plain := plain400(t, nil)
	addr := strings.TrimPrefix(plain.URL, "http://")
	var audit, logs bytes.Buffer
	r := ledFrom(plain.URL, router.Config{LeaderWait: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Audit: slog.New(slog.NewJSONHandler(&audit, nil))})
	here := httptest.NewServer(NewHandler(r))
	defer here.Close()
	counted := func() float64 { return testutil.ToFloat64(metrics.rpcOutcomes.WithLabelValues("Renew", "unavailable")) }
	before := counted()
	_, err := wardenv1connect.NewLockServiceClient(http.DefaultClient, here.URL).Renew(context.Background(),
		connect.NewRequest(&wardenv1.RenewRequest{Resource: "orders/42", LeaseId: strings.Repeat("00", 16)}))
	if connect.CodeOf(err) != connect.CodeUnavailable || strings.Contains(err.Error(), addr) || strings.Contains(err.Error(), "400") {
		t.Fatalf("client got %v: want unavailable, naming neither %s nor the other server's answer", err, addr)
	}
	// The node asked is only a replica of the shard (this node hosts none
	// and knows no leader): the detail names the shard, not a leader.
	if d := notLeaderOf(err); d == nil || d.GetShardId() != 1 || d.GetLeaderAddress() != "" {
		t.Fatalf("detail %v, want NotLeader of shard 1 with no leader", d)
	}
	if got := counted() - before; got != 1 || strings.Count(audit.String(), `"method":"Renew"`) != 1 {
		t.Fatalf("counted %v, audited %q: want the call recorded here once", got, audit.String())
	}
	if !strings.Contains(logs.String(), addr) {
		t.Fatalf("the log does not name the node's address: %s", logs.String())
	}
}

// An internal error is logged once, under the id the client is told.
func TestInternalErrorLoggedOnce(t *testing.T) {
	var logs bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	defer slog.SetDefault(old)
	r := router.New(nil, nil, placement.NewMap(&placementv1.State{}), nil, router.Config{Audit: slog.New(slog.DiscardHandler)}, router.NewPeers("", nil))
	next := connect.UnaryFunc(func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) {
		return nil, errors.New("pebble: disk on fire")
	})
	_, err := observer{newNode(r)}.WrapUnary(next)(context.Background(), connect.NewRequest(&wardenv1.AcquireRequest{Resource: "r"}))
	if connect.CodeOf(err) != connect.CodeInternal || strings.Contains(err.Error(), "disk") {
		t.Fatalf("client got %v: want internal with an id only", err)
	}
	if n := strings.Count(logs.String(), "internal error"); n != 1 {
		t.Fatalf("logged %d times:\n%s", n, logs.String())
	}
}

// peerServer serves h as a node's address does: HTTP/2 without TLS
// (h2c, which the router's peer clients speak), and HTTP/1.1.
func peerServer(h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	return srv
}

// A lock call that fails a check needing nothing of the shard is refused
// where it came in, with the field named, and never forwarded to the
// node that leads its key (security review: invalid input reached the
// leader's node first).
func TestInvalidLockCallsAreNotForwarded(t *testing.T) {
	var calls atomic.Int32
	plain := plain400(t, &calls)
	n := newNode(ledFrom(plain.URL, router.Config{LeaderWait: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}))
	local := connect.UnaryFunc(func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) {
		t.Fatal("an invalid call was served")
		return nil, nil
	})
	for _, tc := range []struct {
		procedure string
		req       connect.AnyRequest
		field     string
	}{
		{wardenv1connect.LockServiceAcquireProcedure, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "orders/42", RequestId: ""}), "request_id"},
		{wardenv1connect.LockServiceRenewProcedure, connect.NewRequest(&wardenv1.RenewRequest{Resource: "orders/42", LeaseId: "not hex"}), "lease_id"},
		{wardenv1connect.LockServiceReleaseProcedure, connect.NewRequest(&wardenv1.ReleaseRequest{Resource: "", LeaseId: "00"}), "resource"},
		{wardenv1connect.LockServiceDescribeProcedure, connect.NewRequest(&wardenv1.DescribeRequest{Resource: ""}), "resource"},
	} {
		_, where, err := routes[tc.procedure].serve(context.Background(), n, tc.req, local)
		var fe *shard.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || where != servedHere {
			t.Errorf("%s: %v (served %v), want a refusal naming %s here", tc.procedure, err, where, tc.field)
		}
	}
	if c := calls.Load(); c != 0 {
		t.Fatalf("the node that leads the key was called %d times", c)
	}
}
