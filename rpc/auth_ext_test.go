package rpc_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/client"
	"github.com/warden-dev/warden/internal/logbuf"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/rpc"
	"github.com/warden-dev/warden/server"
	"github.com/warden-dev/warden/tlsconfig"
)

// authCluster is a dev cluster served over real TLS (client certificates
// verified by a test CA), whose callers each hold their own credentials.
type authCluster struct {
	t     *testing.T
	dev   *server.Dev
	srv   *httptest.Server
	ca    *tlsconfig.CA
	plain *http.Client // TLS, no client certificate
}

func startAuthCluster(t *testing.T, audit *slog.Logger) *authCluster {
	t.Helper()
	return startAuthClusterWith(t, router.Config{Audit: audit})
}

// startAuthClusterWith is startAuthCluster with the router's config cfg.
func startAuthClusterWith(t *testing.T, cfg router.Config) *authCluster {
	t.Helper()
	cfg.ClientTLS = true
	dev, err := server.StartDev(server.DevConfig{DataDir: t.TempDir(), Router: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dev.Close)
	ca, err := tlsconfig.NewCA("test client CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	srv := httptest.NewUnstartedServer(rpc.NewHandler(dev.Router))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pool}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return &authCluster{t: t, dev: dev, srv: srv, ca: ca, plain: srv.Client()}
}

// withCert is an HTTP client presenting a certificate for commonName.
func (c *authCluster) withCert(commonName string) *http.Client {
	c.t.Helper()
	certPEM, keyPEM, err := c.ca.Issue(tlsconfig.CertSpec{CommonName: commonName, Client: true})
	if err != nil {
		c.t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		c.t.Fatal(err)
	}
	tr := c.srv.Client().Transport.(*http.Transport).Clone()
	tr.TLSClientConfig.Certificates = []tls.Certificate{cert}
	return &http.Client{Transport: tr}
}

type caller struct {
	locks wardenv1connect.LockServiceClient
	quota wardenv1connect.QuotaServiceClient
	admin wardenv1connect.AdminServiceClient
	auth  wardenv1connect.AuthServiceClient
}

func (c *authCluster) caller(h *http.Client, opts ...connect.ClientOption) caller {
	u := c.srv.URL
	return caller{wardenv1connect.NewLockServiceClient(h, u, opts...), wardenv1connect.NewQuotaServiceClient(h, u, opts...),
		wardenv1connect.NewAdminServiceClient(h, u, opts...), wardenv1connect.NewAuthServiceClient(h, u, opts...)}
}

// wantDenied checks that err is PermissionDenied naming every one of
// names (the permission and the resource).
func wantDenied(t *testing.T, what string, err error, names ...string) {
	t.Helper()
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("%s: %v, want permission_denied", what, err)
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("%s: %q does not name %q", what, err, n)
		}
	}
}

func acquireReq(resource string) *connect.Request[wardenv1.AcquireRequest] {
	return connect.NewRequest(&wardenv1.AcquireRequest{Resource: resource, RequestId: "r-" + resource, LeaseTtl: durationpb.New(10 * time.Second)})
}

// Each permission allows what it names and nothing else, a denial names
// the permission and the resource, a Batch's and a RenewBatch's denied
// ops fail alone, calls without credentials or with a bad or revoked
// token are unauthenticated before anything is read, and the audit log
// names the principal of every change but never a token.
func TestAuthorization(t *testing.T) {
	var audit logbuf.Buffer
	c := startAuthCluster(t, slog.New(slog.NewJSONHandler(&audit, nil)))
	anon := c.caller(c.plain)
	// Authentication off: the first operator sets it up, anonymously.
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	role := func(name string, grants ...string) *connect.Request[wardenv1.PutRoleRequest] {
		r := &wardenv1.AuthRole{Name: name}
		for _, g := range grants {
			perm, prefix, _ := strings.Cut(g, ":")
			r.Grants = append(r.Grants, &wardenv1.AuthGrant{Permission: perm, Prefix: prefix})
		}
		return connect.NewRequest(&wardenv1.PutRoleRequest{Role: r})
	}
	bind := func(principal, role string) {
		t.Helper()
		_, err := anon.auth.Bind(ctx(t), connect.NewRequest(&wardenv1.BindRequest{Binding: &wardenv1.AuthBinding{Principal: principal, Role: role}}))
		must("bind "+principal, err)
	}
	_, err := anon.auth.PutRole(ctx(t), role("operator", "admin", "read", "lock", "quota.use", "quota.admin"))
	must("put operator", err)
	_, err = anon.auth.PutRole(ctx(t), role("orders", "lock:orders/", "quota.use:orders/"))
	must("put orders", err)
	_, err = anon.auth.PutRole(ctx(t), role("bad", "write"))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "role.grants[0].permission") {
		t.Fatalf("a role with an unknown permission: %v", err)
	}
	bind("admin", "operator")
	bind("orders", "orders")
	bind("client", "orders")
	tok := func(principal string) (token, id string) {
		t.Helper()
		resp, err := anon.auth.CreateToken(ctx(t), connect.NewRequest(&wardenv1.CreateTokenRequest{Principal: principal}))
		must("create token", err)
		return resp.Msg.GetToken(), resp.Msg.GetId()
	}
	adminToken, _ := tok("admin")
	ordersToken, ordersID := tok("orders")
	_, err = anon.auth.SetEnabled(ctx(t), connect.NewRequest(&wardenv1.SetEnabledRequest{Enabled: true}))
	must("enable", err)

	admin := c.caller(c.plain, client.WithToken(adminToken))
	orders := c.caller(c.plain, client.WithToken(ordersToken))
	certified := c.caller(c.withCert("client"))
	stranger := c.caller(c.withCert("stranger"))

	// Authentication.
	_, err = anon.locks.Acquire(ctx(t), acquireReq("orders/1"))
	wantCode(t, err, connect.CodeUnauthenticated)
	forged, _, _ := strings.Cut(ordersToken, ".")
	_, err = c.caller(c.plain, client.WithToken(forged+".0123456789abcdef."+strings.Repeat("A", 43))).locks.Acquire(ctx(t), acquireReq("orders/1"))
	wantCode(t, err, connect.CodeUnauthenticated)
	if strings.Contains(err.Error(), "orders") {
		t.Errorf("a bad token's refusal says something of the principal: %v", err)
	}

	// lock on orders/.
	resp, err := orders.locks.Acquire(ctx(t), acquireReq("orders/1"))
	must("orders acquires orders/1", err)
	lease := resp.Msg.GetLeaseId()
	_, err = orders.locks.Acquire(ctx(t), acquireReq("payments/1"))
	wantDenied(t, "orders acquires payments/1", err, `"orders"`, "lock", `"payments/1"`)
	_, err = stranger.locks.Acquire(ctx(t), acquireReq("orders/2"))
	wantDenied(t, "an unbound certificate", err, `"stranger"`, "lock")
	_, err = certified.locks.Acquire(ctx(t), acquireReq("orders/3"))
	must("the client certificate acquires orders/3", err)
	// A lease id is a capability only for a principal allowed the lock.
	_, err = c.caller(c.withCert("stranger")).locks.Renew(ctx(t), connect.NewRequest(&wardenv1.RenewRequest{Resource: "orders/1", LeaseId: lease}))
	wantDenied(t, "renew with another's lease id, unbound", err, "lock", `"orders/1"`)
	_, err = certified.locks.Renew(ctx(t), connect.NewRequest(&wardenv1.RenewRequest{Resource: "orders/1", LeaseId: lease}))
	must("renew by a principal allowed the lock", err)

	// A request id answers only to the principal that made it: another
	// one, even one allowed the lock, does not get the lease id back.
	again, err := orders.locks.Acquire(ctx(t), acquireReq("orders/1"))
	if err != nil || again.Msg.GetLeaseId() != lease {
		t.Fatalf("orders replays its own request: %v, %v", again, err)
	}
	_, err = admin.locks.Acquire(ctx(t), acquireReq("orders/1"))
	wantDenied(t, "admin replays orders' request", err, "request_id")
	if strings.Contains(err.Error(), lease) {
		t.Fatal("the refusal holds the lease id")
	}

	// Batch and RenewBatch: the denied op fails alone.
	bresp, err := orders.locks.Batch(ctx(t), connect.NewRequest(&wardenv1.BatchRequest{Ops: []*wardenv1.BatchOp{acquireOp("orders/4", "b4"), acquireOp("payments/4", "b5")}}))
	must("batch", err)
	if out := bresp.Msg.GetOutcomes(); out[0].GetCode() != "" || out[1].GetCode() != connect.CodePermissionDenied.String() || !strings.Contains(out[1].GetMessage(), "payments/4") {
		t.Fatalf("batch outcomes %v, want the first granted and the second denied naming payments/4", out)
	}
	rresp, err := orders.locks.RenewBatch(ctx(t), connect.NewRequest(&wardenv1.RenewBatchRequest{Renewals: []*wardenv1.RenewRequest{
		{Resource: "orders/1", LeaseId: lease}, {Resource: "payments/1", LeaseId: lease}}}))
	must("renew batch", err)
	if out := rresp.Msg.GetOutcomes(); out[0].GetCode() != "" || out[1].GetCode() != connect.CodePermissionDenied.String() {
		t.Fatalf("renew batch outcomes %v, want the first renewed and the second denied", out)
	}

	// quota.use, quota.admin, read and admin.
	_, err = orders.quota.SetLimit(ctx(t), connect.NewRequest(&wardenv1.SetLimitRequest{Key: "orders/eu", Limit: 10}))
	wantDenied(t, "orders sets a limit", err, "quota.admin", `"orders/eu"`)
	_, err = admin.quota.SetLimit(ctx(t), connect.NewRequest(&wardenv1.SetLimitRequest{Key: "orders/eu", Limit: 10}))
	must("admin sets a limit", err)
	_, err = orders.quota.Reserve(ctx(t), connect.NewRequest(&wardenv1.ReserveRequest{Key: "orders/eu", Amount: 1, ReservationId: "res1", Ttl: durationpb.New(time.Minute)}))
	must("orders reserves", err)
	_, err = orders.quota.Reserve(ctx(t), connect.NewRequest(&wardenv1.ReserveRequest{Key: "ads/eu", Amount: 1, ReservationId: "res2", Ttl: durationpb.New(time.Minute)}))
	wantDenied(t, "orders reserves ads/eu", err, "quota.use", `"ads/eu"`)
	_, err = orders.admin.ListShards(ctx(t), connect.NewRequest(&wardenv1.ListShardsRequest{}))
	wantDenied(t, "orders lists shards", err, "read")
	_, err = admin.admin.ListShards(ctx(t), connect.NewRequest(&wardenv1.ListShardsRequest{}))
	must("admin lists shards", err)
	_, err = orders.admin.Snapshot(ctx(t), connect.NewRequest(&wardenv1.SnapshotRequest{}))
	wantDenied(t, "orders snapshots", err, "admin")
	// A backup holds every lease id: admin alone may take one.
	backup := func(who caller) (chunks int, err error) {
		stream, err := who.admin.Backup(ctx(t), connect.NewRequest(&wardenv1.BackupRequest{}))
		if err != nil {
			return 0, err
		}
		defer stream.Close()
		for stream.Receive() {
			chunks++
		}
		return chunks, stream.Err()
	}
	n, err := backup(orders)
	wantDenied(t, "orders takes a backup", err, `"orders"`, "admin")
	if n != 0 {
		t.Fatalf("a denied backup sent %d messages", n)
	}
	_, err = backup(anon)
	wantCode(t, err, connect.CodeUnauthenticated)
	n, err = backup(admin)
	must("admin takes a backup", err)
	if n < 4 {
		t.Fatalf("admin's backup sent %d messages", n)
	}
	// A watch needs lock or read on its resource, checked on the request
	// before anything is sent.
	watch := func(who caller, resource string) (*wardenv1.WatchResponse, error) {
		wctx, cancel := context.WithCancel(ctx(t))
		defer cancel()
		stream, err := who.locks.Watch(wctx, connect.NewRequest(&wardenv1.WatchRequest{Resource: resource}))
		if err != nil {
			return nil, err
		}
		defer stream.Close()
		if stream.Receive() {
			return stream.Msg(), nil
		}
		return nil, stream.Err()
	}
	first, err := watch(orders, "orders/1")
	must("orders watches orders/1", err)
	if !first.GetInitial() || first.GetFencingToken() != resp.Msg.GetFencingToken() {
		t.Fatalf("orders' watch of orders/1 began with %v", first)
	}
	got, err := watch(orders, "payments/1")
	wantDenied(t, "orders watches payments/1", err, `"orders"`, "lock", `"payments/1"`)
	if got != nil {
		t.Fatalf("a denied watch sent %v", got)
	}
	_, err = watch(anon, "orders/1")
	wantCode(t, err, connect.CodeUnauthenticated)
	_, err = orders.auth.CreateToken(ctx(t), connect.NewRequest(&wardenv1.CreateTokenRequest{Principal: "admin"}))
	wantDenied(t, "orders mints an admin token", err, "admin")
	_, err = admin.admin.SetShardConfig(ctx(t), connect.NewRequest(&wardenv1.SetShardConfigRequest{ShardId: 0, MaxClockSkew: durationpb.New(time.Millisecond)}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("admin passes the skew floor: %v", err)
	}

	// No change can lock every operator out.
	_, err = admin.auth.Unbind(ctx(t), connect.NewRequest(&wardenv1.UnbindRequest{Binding: &wardenv1.AuthBinding{Principal: "admin", Role: "operator"}}))
	wantCode(t, err, connect.CodeFailedPrecondition)

	// An unknown token id: not found, in the caller's terms.
	_, err = admin.auth.RevokeToken(ctx(t), connect.NewRequest(&wardenv1.RevokeTokenRequest{Id: "0123456789abcdef"}))
	if connect.CodeOf(err) != connect.CodeNotFound || strings.Contains(err.Error(), "placement") {
		t.Errorf("revoking an unknown token: %v, want not_found without the placement group's prefix", err)
	}

	// A revoked token fails on the next call.
	_, err = admin.auth.RevokeToken(ctx(t), connect.NewRequest(&wardenv1.RevokeTokenRequest{Id: ordersID}))
	must("revoke", err)
	_, err = orders.locks.Acquire(ctx(t), acquireReq("orders/5"))
	wantCode(t, err, connect.CodeUnauthenticated)
	st, err := admin.auth.GetAuth(ctx(t), connect.NewRequest(&wardenv1.GetAuthRequest{}))
	must("get auth", err)
	if len(st.Msg.GetTokens()) != 1 || st.Msg.GetTokens()[0].GetPrincipal() != "admin" || !st.Msg.GetEnabled() {
		t.Errorf("auth state %v, want the admin token alone, enabled", st.Msg)
	}

	// The audit log: principals, denials, and no token.
	out := audit.String()
	for _, secret := range []string{adminToken, ordersToken, lease, "r-orders/1"} {
		if strings.Contains(out, secret) {
			t.Fatalf("the audit log holds %q", secret)
		}
	}
	var sawDenied, sawTokenID, sawPrincipal bool
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q", l)
		}
		switch {
		case m["method"] == "Acquire" && m["resource"] == "payments/1" && m["outcome"] == "denied" && m["principal"] == "orders":
			sawDenied = true
		case m["method"] == "CreateToken" && m["token_id"] == ordersID:
			sawTokenID = true
		case m["method"] == "SetLimit" && m["principal"] == "admin" && m["resource"] == "orders/eu" && m["outcome"] == "ok":
			sawPrincipal = true
		}
	}
	if !sawDenied || !sawTokenID || !sawPrincipal {
		t.Errorf("audit: denied acquire %v, token id %v, admin's SetLimit %v:\n%s", sawDenied, sawTokenID, sawPrincipal, out)
	}
}

// enable sets up roles (name → grants) and bindings (principal → role)
// anonymously, creates a token for each of tokenFor, and turns
// authentication on; it returns the tokens by principal.
func (c *authCluster) enable(roles map[string][]*wardenv1.AuthGrant, bindings map[string]string, tokenFor ...string) map[string]*wardenv1.CreateTokenResponse {
	t := c.t
	t.Helper()
	anon := c.caller(c.plain)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for name, grants := range roles {
		_, err := anon.auth.PutRole(ctx(t), connect.NewRequest(&wardenv1.PutRoleRequest{Role: &wardenv1.AuthRole{Name: name, Grants: grants}}))
		must("put role "+name, err)
	}
	for principal, role := range bindings {
		_, err := anon.auth.Bind(ctx(t), connect.NewRequest(&wardenv1.BindRequest{Binding: &wardenv1.AuthBinding{Principal: principal, Role: role}}))
		must("bind "+principal, err)
	}
	tokens := map[string]*wardenv1.CreateTokenResponse{}
	for _, principal := range tokenFor {
		resp, err := anon.auth.CreateToken(ctx(t), connect.NewRequest(&wardenv1.CreateTokenRequest{Principal: principal}))
		must("create token", err)
		tokens[principal] = resp.Msg
	}
	_, err := anon.auth.SetEnabled(ctx(t), connect.NewRequest(&wardenv1.SetEnabledRequest{Enabled: true}))
	must("enable", err)
	return tokens
}

// A waiting Acquire ends when the auth state no longer lets its caller
// wait: unauthenticated when its token is revoked, permission_denied
// when its principal's binding is removed; and it leaves the queue, so
// the lock is not granted to it once free.
func TestAuthChangeEndsWaits(t *testing.T) {
	c := startAuthCluster(t, nil)
	tokens := c.enable(map[string][]*wardenv1.AuthGrant{
		"operator": {{Permission: "admin"}, {Permission: "read"}, {Permission: "lock"}},
		"workers":  {{Permission: "lock", Prefix: "jobs/"}},
	}, map[string]string{"admin": "operator", "worker": "workers", "certified": "workers"}, "admin", "worker")
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	admin := c.caller(c.plain, client.WithToken(tokens["admin"].GetToken()))
	held, err := admin.locks.Acquire(ctx(t), connect.NewRequest(&wardenv1.AcquireRequest{Resource: "jobs/1", RequestId: "held", LeaseTtl: durationpb.New(time.Minute)}))
	must("admin acquires jobs/1", err)
	waiters := func(want uint32) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			d, err := admin.locks.Describe(ctx(t), connect.NewRequest(&wardenv1.DescribeRequest{Resource: "jobs/1"}))
			must("describe", err)
			if d.Msg.GetWaiters() == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("jobs/1 has %d waiters, want %d", d.Msg.GetWaiters(), want)
			}
		}
	}
	// wait starts who's Acquire of jobs/1, waiting up to a minute, once
	// it is queued; the channel gets its error after change ran.
	wait := func(who caller, requestID string, change func()) error {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			_, err := who.locks.Acquire(context.Background(), connect.NewRequest(&wardenv1.AcquireRequest{Resource: "jobs/1", RequestId: requestID,
				LeaseTtl: durationpb.New(time.Minute), WaitTimeout: durationpb.New(time.Minute)}))
			done <- err
		}()
		waiters(1)
		changed := time.Now()
		change()
		select {
		case err := <-done:
			t.Logf("%s's wait ended %v after the change", requestID, time.Since(changed).Round(time.Millisecond))
			waiters(0)
			return err
		case <-time.After(20 * time.Second):
			t.Fatalf("%s still waits 20 s after the change", requestID)
			return nil
		}
	}
	err = wait(c.caller(c.plain, client.WithToken(tokens["worker"].GetToken())), "revoked", func() {
		_, err := admin.auth.RevokeToken(ctx(t), connect.NewRequest(&wardenv1.RevokeTokenRequest{Id: tokens["worker"].GetId()}))
		must("revoke", err)
	})
	wantCode(t, err, connect.CodeUnauthenticated)
	err = wait(c.caller(c.withCert("certified")), "unbound", func() {
		_, err := admin.auth.Unbind(ctx(t), connect.NewRequest(&wardenv1.UnbindRequest{Binding: &wardenv1.AuthBinding{Principal: "certified", Role: "workers"}}))
		must("unbind", err)
	})
	wantDenied(t, "an unbound principal's wait", err, `"certified"`, "lock", `"jobs/1"`)
	// Released, the lock goes to nobody: neither wait is in the queue.
	_, err = admin.locks.Release(ctx(t), connect.NewRequest(&wardenv1.ReleaseRequest{Resource: "jobs/1", LeaseId: held.Msg.GetLeaseId()}))
	must("release", err)
	d, err := admin.locks.Describe(ctx(t), connect.NewRequest(&wardenv1.DescribeRequest{Resource: "jobs/1"}))
	must("describe", err)
	if d.Msg.GetHeld() {
		t.Fatalf("jobs/1 was granted after its waiters' credentials ended: %v", d.Msg)
	}
}

// What a refused call writes is bounded: a denied Acquire's 60,000-byte
// resource and bidi, zero-width and control characters reach neither
// the error nor the audit line whole or raw, and a Batch of 1,000
// denied acquires writes one audit line with their count.
func TestRefusedCallsBoundedAudit(t *testing.T) {
	var audit logbuf.Buffer
	c := startAuthCluster(t, slog.New(slog.NewJSONHandler(&audit, nil)))
	c.enable(map[string][]*wardenv1.AuthGrant{
		"operator": {{Permission: "admin"}},
		"orders":   {{Permission: "lock", Prefix: "orders/"}},
	}, map[string]string{"admin": "operator", "orders": "orders"})
	orders := c.caller(c.withCert("orders"))
	raw := []string{"\u202e", "\u200b", "\ufeff", "\u0085", "\n"}
	wantClean := func(what, s string, max int) {
		t.Helper()
		if len(s) > max {
			t.Errorf("%s is %d bytes, want at most %d", what, len(s), max)
		}
		for _, r := range raw {
			if strings.Contains(strings.TrimSuffix(s, "\n"), r) {
				t.Errorf("%s holds raw %q", what, r)
			}
		}
	}
	before := len(audit.String())
	long := "payments/\u202eevil\u200b\ufeff\u0085\n" + strings.Repeat("x", 60000)
	_, err := orders.locks.Acquire(ctx(t), connect.NewRequest(&wardenv1.AcquireRequest{Resource: long, RequestId: "r1", Holder: "h\u202eh"}))
	wantDenied(t, "a long resource", err, `"orders"`, "lock", `payments/\u202Eevil`)
	wantClean("the denial", err.Error(), 1024)
	line := audit.String()[before:]
	wantClean("the denial's audit line", line, 2048)
	if strings.Count(line, "\n") != 1 || !strings.Contains(line, "(+") {
		t.Errorf("the denial's audit: %q, want one line with the resource cut", line)
	}

	before = len(audit.String())
	ops := make([]*wardenv1.BatchOp, 1000)
	for i := range ops {
		ops[i] = acquireOp(fmt.Sprintf("payments/%04d-\u202e", i), fmt.Sprintf("b%d", i))
	}
	resp, err := orders.locks.Batch(ctx(t), connect.NewRequest(&wardenv1.BatchRequest{Ops: ops}))
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range resp.Msg.GetOutcomes() {
		if o.GetCode() != connect.CodePermissionDenied.String() {
			t.Fatalf("op %d: %v, want permission_denied", i, o)
		}
	}
	line = audit.String()[before:]
	wantClean("the denied Batch's audit", line, 1024)
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil || m["method"] != "Batch" || m["denied_ops"] != float64(1000) || m["outcome"] != "denied" {
		t.Fatalf("the denied Batch's audit: %q (%v), want one line of method Batch with denied_ops 1000", line, err)
	}
}

// With authentication on, an anonymous scrape of /metrics shows no
// quota pool's name (warden_quota_drift{pool}), a reader of every key's
// shows it; with MetricsAuth an anonymous scrape is refused.
func TestMetricsHideTenants(t *testing.T) {
	scrape := func(t *testing.T, c *authCluster, h *http.Client, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx(t), http.MethodGet, c.srv.URL+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := h.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, metricsAuth := range []bool{false, true} {
		// One cluster at a time: the metrics of two would collide.
		t.Run(fmt.Sprintf("MetricsAuth=%v", metricsAuth), func(t *testing.T) { testMetricsHideTenants(t, metricsAuth, scrape) })
	}
}

func testMetricsHideTenants(t *testing.T, metricsAuth bool, scrape func(*testing.T, *authCluster, *http.Client, string) (int, string)) {
	const drift = `warden_quota_drift{pool="tenantx"}`
	c := startAuthClusterWith(t, router.Config{MetricsAuth: metricsAuth})
	anon := c.caller(c.plain)
	_, err := anon.quota.SetLimit(ctx(t), connect.NewRequest(&wardenv1.SetLimitRequest{Key: "tenantx/eu", Limit: 10}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err = anon.quota.ReportUsage(ctx(t), connect.NewRequest(&wardenv1.ReportUsageRequest{Key: "tenantx/eu", Observed: 3, ReportId: "u1"})); err != nil {
		t.Fatal(err)
	}
	if code, body := scrape(t, c, c.plain, ""); code != http.StatusOK || !strings.Contains(body, drift) {
		t.Fatalf("authentication off: an anonymous scrape: %d, want 200 with %s:\n%.2000s", code, drift, body)
	}
	tokens := c.enable(map[string][]*wardenv1.AuthGrant{
		"operator": {{Permission: "admin"}, {Permission: "read"}},
		"orders":   {{Permission: "read", Prefix: "orders/"}},
	}, map[string]string{"admin": "operator", "orders": "orders"}, "admin", "orders")
	if code, body := scrape(t, c, c.plain, tokens["admin"].GetToken()); code != http.StatusOK || !strings.Contains(body, drift) {
		t.Fatalf("a reader of every key's scrape: %d, want 200 with %s", code, drift)
	}
	for who, token := range map[string]string{"anonymous": "", "a prefix-limited reader": tokens["orders"].GetToken()} {
		code, body := scrape(t, c, c.plain, token)
		switch {
		case metricsAuth && code/100 != 4:
			t.Errorf("MetricsAuth: %s scrape: %d, want refused", who, code)
		case !metricsAuth && (code != http.StatusOK || !strings.Contains(body, "warden_rpc_") || strings.Contains(body, "tenantx")):
			t.Errorf("%s scrape: %d, want 200 with the RPC metrics and without tenantx", who, code)
		}
	}
}

// With authentication on, gRPC reflection (which lists AuthService)
// answers only callers that authenticate.
func TestReflectionNeedsAuthentication(t *testing.T) {
	c := startAuthCluster(t, nil)
	list := func(opts ...connect.ClientOption) error {
		stream := grpcreflect.NewClient(c.plain, c.srv.URL, append(opts, connect.WithGRPC())...).NewStream(ctx(t))
		defer stream.Close()
		_, err := stream.ListServices()
		return err
	}
	if err := list(); err != nil {
		t.Fatalf("authentication off: reflection: %v", err)
	}
	tokens := c.enable(map[string][]*wardenv1.AuthGrant{"operator": {{Permission: "admin"}}, "nothing": {}},
		map[string]string{"admin": "operator", "someone": "nothing"}, "someone")
	wantCode(t, list(), connect.CodeUnauthenticated)
	if err := list(client.WithToken(tokens["someone"].GetToken())); err != nil {
		t.Fatalf("reflection by an authenticated principal: %v", err)
	}
}

// A principal allowed quota.use under a prefix sees, in Query, the
// limits and totals of the levels under it, not those of the levels
// above (another tenant's usage): only their keys and remaining.
func TestQueryRedactsLevelsAbovePrefix(t *testing.T) {
	c := startAuthCluster(t, nil)
	tokens := c.enable(map[string][]*wardenv1.AuthGrant{
		"operator": {{Permission: "admin"}, {Permission: "read"}, {Permission: "quota.use"}, {Permission: "quota.admin"}},
		"eu":       {{Permission: "quota.use", Prefix: "acme/eu"}},
	}, map[string]string{"admin": "operator", "eu": "eu"}, "admin", "eu")
	admin := c.caller(c.plain, client.WithToken(tokens["admin"].GetToken()))
	eu := c.caller(c.plain, client.WithToken(tokens["eu"].GetToken()))
	for key, limit := range map[string]int64{"acme": 100, "acme/eu": 50} {
		if _, err := admin.quota.SetLimit(ctx(t), connect.NewRequest(&wardenv1.SetLimitRequest{Key: key, Limit: limit})); err != nil {
			t.Fatal(err)
		}
	}
	// Another tenant's usage of the parent.
	if _, err := admin.quota.Reserve(ctx(t), connect.NewRequest(&wardenv1.ReserveRequest{Key: "acme/us", Amount: 30, ReservationId: "us1", Ttl: durationpb.New(time.Minute)})); err != nil {
		t.Fatal(err)
	}
	if _, err := eu.quota.Reserve(ctx(t), connect.NewRequest(&wardenv1.ReserveRequest{Key: "acme/eu", Amount: 5, ReservationId: "eu1", Ttl: durationpb.New(time.Minute)})); err != nil {
		t.Fatal(err)
	}
	levels := func(who caller) map[string]*wardenv1.QuotaLevel {
		t.Helper()
		resp, err := who.quota.Query(ctx(t), connect.NewRequest(&wardenv1.QueryRequest{Key: "acme/eu"}))
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*wardenv1.QuotaLevel{}
		for _, l := range resp.Msg.GetLevels() {
			out[l.GetKey()] = l
		}
		return out
	}
	if l := levels(admin)["acme"]; l.GetReserved() != 35 || l.GetLimit() != 100 {
		t.Fatalf("admin's view of acme: %v, want reserved 35 of 100", l)
	}
	got := levels(eu)
	if l := got["acme"]; l == nil || l.GetReserved() != 0 || l.GetLimit() != 0 || l.GetHasLimit() || l.GetRemaining() != 65 {
		t.Errorf("eu's view of acme: %v, want its key and remaining 65 alone", l)
	}
	if l := got["acme/eu"]; l.GetReserved() != 5 || l.GetLimit() != 50 {
		t.Errorf("eu's view of acme/eu: %v, want reserved 5 of 50", l)
	}
}
