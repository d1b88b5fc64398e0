package rpc

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/warden-dev/warden/auth"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	"github.com/warden-dev/warden/router"
)

// readTracker is a request body that records whether anyone read it.
type readTracker struct{ read bool }

func (r *readTracker) Read([]byte) (int, error) { r.read = true; return 0, io.EOF }

// The guard decides before any body is read: the node API answers only
// nodes (by the cluster secret without TLS, by a verified peer
// certificate with it, never with neither), and the headers that mean
// something inside the cluster reach the handlers only from nodes.
func TestGuard(t *testing.T) {
	const secret = "test-secret-0123456789"
	nodePath := "/" + placementv1connect.NodeServiceName + "/"
	var seen http.Header
	next := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { seen = req.Header.Clone() })
	for _, tc := range []struct {
		name    string
		cfg     router.Config
		path    string
		headers map[string]string
		tls     *tls.ConnectionState
		served  bool   // reaches next
		hops    string // Warden-Forwarded as next sees it
	}{
		{"insecure: node API without the secret", router.Config{ClusterSecret: secret}, nodePath + "Propose", nil, nil, false, ""},
		{"insecure: node API with a wrong secret", router.Config{ClusterSecret: secret}, nodePath + "Propose", map[string]string{router.SecretHeader: "guess"}, nil, false, ""},
		{"insecure: node API with the secret", router.Config{ClusterSecret: secret}, nodePath + "Propose", map[string]string{router.SecretHeader: secret, router.ForwardedHeader: "1"}, nil, true, "1"},
		{"insecure: a client's forwarding header", router.Config{ClusterSecret: secret}, "/warden.v1.LockService/Acquire", map[string]string{router.ForwardedHeader: "2"}, nil, true, ""},
		{"insecure: a client's principal header", router.Config{ClusterSecret: secret}, "/warden.v1.LockService/Acquire", map[string]string{router.PrincipalHeader: "admin"}, nil, true, ""},
		{"TLS: the secret is no peer certificate", router.Config{ClusterSecret: secret, PeerTLS: true}, nodePath + "Propose", map[string]string{router.SecretHeader: secret}, nil, false, ""},
		{"TLS: a client handshake", router.Config{PeerTLS: true}, nodePath + "Propose", nil, &tls.ConnectionState{ServerName: "node-1.example"}, false, ""},
		{"TLS: a client's forwarding header", router.Config{PeerTLS: true}, "/warden.v1.LockService/Acquire", map[string]string{router.ForwardedHeader: "-1"}, &tls.ConnectionState{}, true, ""},
		{"dev: no node is authenticated", router.Config{}, nodePath + "Propose", nil, nil, false, ""},
	} {
		seen = nil
		body := &readTracker{}
		req := httptest.NewRequest(http.MethodPost, tc.path, body)
		req.Header.Set("Content-Type", "application/proto")
		for k, v := range tc.headers {
			req.Header.Set(k, v)
		}
		req.TLS = tc.tls
		w := httptest.NewRecorder()
		guard(&tc.cfg, &authState{}, nil, next).ServeHTTP(w, req)
		switch {
		case tc.served && seen == nil:
			t.Errorf("%s: not served (%d %s)", tc.name, w.Code, w.Body)
		case !tc.served && seen != nil:
			t.Errorf("%s: served", tc.name)
		case !tc.served && (w.Code != http.StatusUnauthorized || body.read):
			t.Errorf("%s: answered %d (body read: %v), want 401 unread", tc.name, w.Code, body.read)
		case tc.served && seen.Get(router.ForwardedHeader) != tc.hops:
			t.Errorf("%s: the handler saw %s %q, want %q", tc.name, router.ForwardedHeader, seen.Get(router.ForwardedHeader), tc.hops)
		case tc.served && seen.Get(router.SecretHeader) != "" && !strings.HasPrefix(tc.path, nodePath):
			t.Errorf("%s: the handler saw the secret header", tc.name)
		case tc.served && seen.Get(router.PrincipalHeader) != "" && tc.headers[router.SecretHeader] != secret:
			t.Errorf("%s: the handler saw a client's principal header", tc.name)
		}
	}
	// The refusal is a Connect error clients understand.
	req := httptest.NewRequest(http.MethodPost, nodePath+"Propose", nil)
	req.Header.Set("Content-Type", "application/proto")
	w := httptest.NewRecorder()
	guard(&router.Config{ClusterSecret: secret}, &authState{}, nil, next).ServeHTTP(w, req)
	if !strings.Contains(w.Body.String(), `"code":"unauthenticated"`) {
		t.Errorf("the refusal: %d %q, want a Connect unauthenticated error", w.Code, w.Body)
	}
}

// A forwarding count that is not a count is the most hops: the request
// is served where it is.
func TestHopsOf(t *testing.T) {
	for v, want := range map[string]int{"": 0, "1": 1, "2": 2, "-1": router.MaxHops, "x": router.MaxHops, "99": 99} {
		h := http.Header{}
		if v != "" {
			h.Set(router.ForwardedHeader, v)
		}
		if got := hopsOf(h); got != want {
			t.Errorf("hopsOf(%q) = %d, want %d", v, got, want)
		}
	}
}

// With authentication on, guard authenticates each client call before
// its body is read, and a principal header counts only from a node.
func TestGuardAuthenticates(t *testing.T) {
	const secret = "test-secret-0123456789"
	token, _ := auth.NewToken()
	rec, err := auth.TokenRecord(token, "admin", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	st := &placementv1.AuthState{Enabled: true, Revision: 1, Tokens: []*placementv1.Token{rec},
		Roles:    []*placementv1.Role{{Name: "op", Grants: []*placementv1.Grant{{Permission: "admin"}}}},
		Bindings: []*placementv1.Binding{{Principal: "admin", Role: "op"}}}
	fresh := newAuthState(st, time.Now(), false)
	stale := newAuthState(st, time.Now().Add(-2*AuthMaxStale), false)
	unset := newAuthState(nil, time.Now(), true)
	overTLS := &tls.ConnectionState{}
	const acquire = "/warden.v1.LockService/Acquire"
	var principal string
	next := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { principal = router.PrincipalOf(req.Context()) + "|" })
	for _, tc := range []struct {
		name    string
		a       *authState
		path    string
		headers map[string]string
		tls     *tls.ConnectionState
		want    string // the principal next saw, "" when not served
		code    int
	}{
		{"a token", fresh, acquire, map[string]string{"Authorization": "Bearer " + token}, overTLS, "admin", 0},
		{"no credentials", fresh, acquire, nil, overTLS, "", http.StatusUnauthorized},
		{"a bad token", fresh, acquire, map[string]string{"Authorization": "Bearer wdn1.0123456789abcdef.x"}, overTLS, "", http.StatusUnauthorized},
		{"not a bearer token", fresh, acquire, map[string]string{"Authorization": "Basic YTpi"}, overTLS, "", http.StatusUnauthorized},
		{"a token in clear", fresh, acquire, map[string]string{"Authorization": "Bearer " + token}, nil, "", http.StatusUnauthorized},
		{"a client's principal header", fresh, acquire, map[string]string{router.PrincipalHeader: "admin"}, overTLS, "", http.StatusUnauthorized},
		{"a node's principal header", fresh, acquire, map[string]string{router.PrincipalHeader: "admin", router.SecretHeader: secret}, nil, "admin", 0},
		{"probes need nothing", fresh, "/metrics", nil, nil, "", 0},
		{"a stale view", stale, acquire, map[string]string{"Authorization": "Bearer " + token}, overTLS, "", http.StatusServiceUnavailable},
		{"auth not bootstrapped yet", unset, acquire, nil, overTLS, "", http.StatusServiceUnavailable},
		{"auth off, anonymous", &authState{}, acquire, nil, nil, "", 0},
	} {
		principal = ""
		body := &readTracker{}
		req := httptest.NewRequest(http.MethodPost, tc.path, body)
		req.Header.Set("Content-Type", "application/proto")
		for k, v := range tc.headers {
			req.Header.Set(k, v)
		}
		req.TLS = tc.tls
		w := httptest.NewRecorder()
		guard(&router.Config{ClusterSecret: secret}, tc.a, nil, next).ServeHTTP(w, req)
		switch {
		case tc.code == 0 && principal != tc.want+"|":
			t.Errorf("%s: next saw principal %q (served: %v; %d %s), want %q", tc.name, principal, principal != "", w.Code, w.Body, tc.want)
		case tc.code != 0 && (principal != "" || w.Code != tc.code || body.read):
			t.Errorf("%s: served %v, answered %d (body read %v), want %d unread", tc.name, principal != "", w.Code, body.read, tc.code)
		}
	}
}

// A node's call with no principal header is the cluster's own (the
// core's question to another node's admin API, router.Remote): it is
// authorized whatever it asks, and a node's call with a principal is
// authorized as that principal; a client cannot pass for either.
func TestClusterCallsAreAuthorized(t *testing.T) {
	const secret = "test-secret-0123456789"
	st := &placementv1.AuthState{Enabled: true, Revision: 1,
		Roles:    []*placementv1.Role{{Name: "op", Grants: []*placementv1.Grant{{Permission: "admin"}}}},
		Bindings: []*placementv1.Binding{{Principal: "admin", Role: "op"}}}
	n := &node{auth: newAuthState(st, time.Now(), false)}
	const transfer = "/warden.v1.AdminService/TransferLeader"
	for _, tc := range []struct {
		name    string
		headers map[string]string
		want    connect.Code // of authorize for admin; 0: allowed
	}{
		{"a node's own call", map[string]string{router.SecretHeader: secret}, 0},
		{"a node's call for a principal without admin", map[string]string{router.SecretHeader: secret, router.PrincipalHeader: "orders"}, connect.CodePermissionDenied},
		{"a node's call for an admin", map[string]string{router.SecretHeader: secret, router.PrincipalHeader: "admin"}, 0},
	} {
		var got error
		served := false
		next := http.HandlerFunc(func(_ http.ResponseWriter, req *http.Request) {
			served = true
			got = authorize(req.Context(), n, auth.Admin, "", "")
		})
		req := httptest.NewRequest(http.MethodPost, transfer, nil)
		for k, v := range tc.headers {
			req.Header.Set(k, v)
		}
		guard(&router.Config{ClusterSecret: secret}, n.auth, nil, next).ServeHTTP(httptest.NewRecorder(), req)
		if !served || connect.CodeOf(got) != tc.want && (tc.want != 0 || got != nil) {
			t.Errorf("%s: served %v, authorize %v, want code %v", tc.name, served, got, tc.want)
		}
	}
	// A client's call without credentials never reaches authorization.
	served := false
	req := httptest.NewRequest(http.MethodPost, transfer, nil)
	guard(&router.Config{ClusterSecret: secret}, n.auth, nil, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = true })).ServeHTTP(httptest.NewRecorder(), req)
	if served {
		t.Error("a client's call without credentials was served")
	}
}

// With the node's auth view too old to decide by, an Acquire records no
// replay principal: it fails, as authorization does (else any principal
// could replay the request id and be handed the lease).
func TestReplayPrincipalFailsClosedWhenStale(t *testing.T) {
	st := &placementv1.AuthState{Enabled: true, Revision: 1}
	ctx := router.WithPrincipal(context.Background(), "victim")
	fresh := &node{auth: newAuthState(st, time.Now(), false)}
	if p, err := fresh.replayPrincipal(ctx); err != nil || p != "victim" {
		t.Fatalf("fresh view: %q, %v; want the caller's principal", p, err)
	}
	stale := &node{auth: newAuthState(st, time.Now().Add(-2*AuthMaxStale), false)}
	if p, err := stale.replayPrincipal(ctx); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("stale view: %q, %v; want unavailable", p, err)
	}
	off := &node{auth: newAuthState(&placementv1.AuthState{Revision: 2}, time.Now().Add(-time.Hour), false)}
	if p, err := off.replayPrincipal(ctx); err != nil || p != "" {
		t.Fatalf("authentication off: %q, %v; want none", p, err)
	}
}
