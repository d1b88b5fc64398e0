package server

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/warden-dev/warden/tlsconfig"
)

// recordLevels is a slog handler that keeps each record's level and
// message.
type recordLevels struct {
	mu  sync.Mutex
	got []slog.Record
}

func (h *recordLevels) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordLevels) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got = append(h.got, r)
	return nil
}
func (h *recordLevels) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordLevels) WithGroup(string) slog.Handler      { return h }

// A failed TLS handshake (plain text sent to the TLS port) is counted in
// warden_tls_handshake_failures_total and logged at DEBUG, not at INFO.
func TestTLSHandshakeFailureIsDebug(t *testing.T) {
	logs := &recordLevels{}
	old := slog.Default()
	slog.SetDefault(slog.New(logs))
	defer slog.SetDefault(old)
	ca, err := tlsconfig.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(tlsconfig.CertSpec{CommonName: "node", Names: []string{"127.0.0.1"}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(http.NotFoundHandler(), true)
	go func() { _ = srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})) }()
	defer srv.Close()
	before := testutil.ToFloat64(tlsHandshakeFailures)
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	_, _ = conn.Read(make([]byte, 512))
	conn.Close()
	for deadline := time.Now().Add(10 * time.Second); testutil.ToFloat64(tlsHandshakeFailures) == before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			logs.mu.Lock()
			t.Fatalf("the failed handshake was not counted; logged: %v", logs.got)
		}
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	for _, r := range logs.got {
		if strings.Contains(r.Message, "TLS handshake") && r.Level >= slog.LevelInfo {
			t.Errorf("a failed TLS handshake logged at %v: %s", r.Level, r.Message)
		}
	}
}
