package server

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
)

// countingBody counts the bytes read of a request body.
type countingBody struct {
	r    io.Reader
	read atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.read.Add(int64(n))
	return n, err
}

func (b *countingBody) Close() error { return nil }

// With authentication on, a gRPC-Web-text call without credentials is
// refused unauthenticated, in gRPC-Web-text, before a byte of its body
// is read (docs/security.md: credentials are checked first).
func TestGRPCWebTextAuthenticatesFirst(t *testing.T) {
	dev, err := StartDev(DevConfig{DataDir: t.TempDir(), Router: router.Config{ClientTLS: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	h := handler(dev.Router, nil)
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Authentication off: an operator turns it on, anonymously.
	authc := wardenv1connect.NewAuthServiceClient(srv.Client(), srv.URL)
	if _, err := authc.PutRole(ctx, connect.NewRequest(&wardenv1.PutRoleRequest{Role: &wardenv1.AuthRole{Name: "operator", Grants: []*wardenv1.AuthGrant{{Permission: "admin"}}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := authc.Bind(ctx, connect.NewRequest(&wardenv1.BindRequest{Binding: &wardenv1.AuthBinding{Principal: "admin", Role: "operator"}})); err != nil {
		t.Fatal(err)
	}
	if _, err := authc.SetEnabled(ctx, connect.NewRequest(&wardenv1.SetEnabledRequest{Enabled: true})); err != nil {
		t.Fatal(err)
	}

	body := &countingBody{r: strings.NewReader(strings.Repeat("A", 96<<10))}
	req := httptest.NewRequest(http.MethodPost, "/warden.v1.LockService/Acquire", body)
	req.Header.Set("Content-Type", "application/grpc-web-text")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if n := body.read.Load(); n != 0 {
		t.Errorf("%d bytes of an unauthenticated call's body were read", n)
	}
	raw, err := base64.StdEncoding.DecodeString(rec.Body.String())
	if ct := rec.Header().Get("Content-Type"); ct != "application/grpc-web-text+proto" || err != nil ||
		(rec.Header().Get("Grpc-Status") != "16" && !strings.Contains(string(raw), "grpc-status: 16")) {
		t.Fatalf("answer %d %q %q (%q, %v), want gRPC-Web-text with grpc-status 16 (unauthenticated)", rec.Code, ct, rec.Header(), raw, err)
	}

	// The node API, called by anyone but a node, is refused unread too:
	// before, the body was read and decoded (up to 96 KiB) and only then
	// refused.
	body = &countingBody{r: strings.NewReader(strings.Repeat("A", 96<<10))}
	req = httptest.NewRequest(http.MethodPost, "/"+placementv1connect.NodeServiceName+"/ReadMeta", body)
	req.Header.Set("Content-Type", "application/grpc-web-text")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if n := body.read.Load(); n != 0 {
		t.Errorf("%d bytes of a non-node's call of the node API were read", n)
	}
	raw, _ = base64.StdEncoding.DecodeString(rec.Body.String())
	if rec.Header().Get("Grpc-Status") != "16" && !strings.Contains(string(raw), "grpc-status: 16") {
		t.Fatalf("node API: answer %d %q (%q), want grpc-status 16 (unauthenticated)", rec.Code, rec.Header(), raw)
	}
}
