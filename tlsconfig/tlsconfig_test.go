package tlsconfig

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pki is a test's client CA, peer CA, and a node's files issued by them.
type pki struct {
	clientCA, peerCA *CA
	files            Files
	dir              string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	var err error
	if p.clientCA, err = NewCA("test client CA", time.Hour); err != nil {
		t.Fatal(err)
	}
	if p.peerCA, err = NewCA("test peer CA", time.Hour); err != nil {
		t.Fatal(err)
	}
	p.files = Files{
		ClientCert: p.write(t, "api.pem", nil), ClientKey: p.write(t, "api-key.pem", nil),
		ClientCA: p.write(t, "client-ca.pem", p.clientCA.PEM),
		PeerCA:   p.write(t, "peer-ca.pem", p.peerCA.PEM),
		PeerCert: p.write(t, "peer.pem", nil), PeerKey: p.write(t, "peer-key.pem", nil),
	}
	p.issueAPI(t)
	p.issuePeer(t, 1)
	return p
}

func (p *pki) write(t *testing.T, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issueAPI (re)issues the node's client-API certificate, for 127.0.0.1.
func (p *pki) issueAPI(t *testing.T) *x509.Certificate {
	t.Helper()
	return p.issue(t, p.clientCA, CertSpec{CommonName: "node api", Names: []string{"127.0.0.1"}, Server: true}, p.files.ClientCert, p.files.ClientKey)
}

// issuePeer (re)issues the node's peer certificate, naming node id.
func (p *pki) issuePeer(t *testing.T, id uint64) *x509.Certificate {
	t.Helper()
	return p.issue(t, p.peerCA, CertSpec{CommonName: "node", Names: []string{"127.0.0.1", NodeName(id)}, Server: true, Client: true}, p.files.PeerCert, p.files.PeerKey)
}

func (p *pki) issue(t *testing.T, ca *CA, spec CertSpec, certFile, keyFile string) *x509.Certificate {
	t.Helper()
	c, k, err := ca.Issue(spec)
	if err != nil {
		t.Fatal(err)
	}
	// The key first, then the certificate, as a rotation would.
	if err := os.WriteFile(keyFile, k, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, c, 0o600); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return pair.Leaf
}

// clientCert returns a client certificate ca issued for spec.
func clientCert(t *testing.T, ca *CA, spec CertSpec) tls.Certificate {
	t.Helper()
	c, k, err := ca.Issue(spec)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// serve accepts TLS connections with s's server config on loopback and
// completes their handshakes; each connection's state (or handshake
// error) goes to the channel.
func serve(t *testing.T, s *Store) (string, <-chan tls.ConnectionState) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", s.ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	states := make(chan tls.ConnectionState, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := c.(*tls.Conn)
				if err := tc.Handshake(); err != nil {
					return
				}
				states <- tc.ConnectionState()
				_, _ = tc.Write([]byte("x")) // proves the handshake to the client
				var b [1]byte
				_, _ = tc.Read(b[:])
			}()
		}
	}()
	return ln.Addr().String(), states
}

// dial handshakes with addr and reads the server's first byte; it returns
// the client's view of the connection, open (closed at the test's end).
func dial(t *testing.T, addr string, cfg *tls.Config) (*tls.Conn, error) {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	// TLS 1.3 reports a refused client certificate only at the first read.
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil {
		return nil, err
	}
	return c, nil
}

func TestClientAPIHandshakes(t *testing.T) {
	p := newPKI(t)
	s, err := Load(p.files)
	if err != nil {
		t.Fatal(err)
	}
	addr, states := serve(t, s)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(p.clientCA.PEM)

	// A client that trusts the CA gets HTTP/2 by ALPN, with no client
	// certificate (health probes are such clients).
	c, err := dial(t, addr, &tls.Config{RootCAs: roots, NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		t.Fatalf("a client without a certificate: %v", err)
	}
	if got := c.ConnectionState().NegotiatedProtocol; got != "h2" {
		t.Fatalf("ALPN negotiated %q, want h2", got)
	}
	if st := <-states; len(st.VerifiedChains) != 0 {
		t.Fatal("a client without a certificate has verified chains")
	}
	// HTTP/1.1 for clients that speak only that (Connect's JSON).
	c, err = dial(t, addr, &tls.Config{RootCAs: roots, NextProtos: []string{"http/1.1"}})
	if err != nil || c.ConnectionState().NegotiatedProtocol != "http/1.1" {
		t.Fatalf("an HTTP/1.1 client: %v", err)
	}
	<-states

	// A client certificate of the client CA is verified: a principal.
	good := clientCert(t, p.clientCA, CertSpec{CommonName: "orders", Client: true})
	if _, err := dial(t, addr, &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{good}}); err != nil {
		t.Fatalf("a client certificate of the client CA: %v", err)
	}
	if st := <-states; len(st.VerifiedChains) == 0 || st.VerifiedChains[0][0].Subject.CommonName != "orders" {
		t.Fatalf("the client certificate was not verified: %v", st.VerifiedChains)
	}
	if id, ok := PeerNodeID(&tls.ConnectionState{}); ok {
		t.Fatalf("an empty connection state names node %d", id)
	}

	// Refused: a server the client does not trust, an expired client
	// certificate, one from another CA, one from the peer CA on a client
	// handshake (the CAs are distinct).
	other, err := NewCA("other", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherRoots := x509.NewCertPool()
	otherRoots.AppendCertsFromPEM(other.PEM)
	if _, err := dial(t, addr, &tls.Config{RootCAs: otherRoots}); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("a client trusting another CA: %v, want unknown authority", err)
	}
	expired := clientCert(t, p.clientCA, CertSpec{CommonName: "old", Client: true, NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	for name, cert := range map[string]tls.Certificate{
		"expired":     expired,
		"foreign CA":  clientCert(t, other, CertSpec{CommonName: "x", Client: true}),
		"peer CA":     clientCert(t, p.peerCA, CertSpec{CommonName: "x", Names: []string{NodeName(2)}, Client: true}),
		"server only": clientCert(t, p.clientCA, CertSpec{CommonName: "x", Server: true}),
	} {
		// GetClientCertificate sends it whatever CAs the server names (Go's
		// client would send none of another CA's from Certificates).
		force := func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
		if _, err := dial(t, addr, &tls.Config{RootCAs: roots, GetClientCertificate: force}); err == nil {
			t.Errorf("a client certificate (%s) was accepted", name)
		}
	}
}

func TestPeerHandshakes(t *testing.T) {
	p := newPKI(t)
	s, err := Load(p.files)
	if err != nil {
		t.Fatal(err)
	}
	addr, states := serve(t, s)

	// Node 1 calls itself here: both sides verify the other's peer
	// certificate, and the server learns the caller's node id.
	if _, err := dial(t, addr, s.PeerClientConfig()); err != nil {
		t.Fatalf("a peer handshake: %v", err)
	}
	st := <-states
	if id, ok := PeerNodeID(&st); !ok || id != 1 {
		t.Fatalf("PeerNodeID = %d, %v; want node 1", id, ok)
	}

	other, err := NewCA("other", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	peerConfig := func(cert tls.Certificate) *tls.Config {
		c := s.PeerClientConfig()
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
		return c
	}
	// Refused on a peer handshake: a client certificate (client CA), a
	// foreign CA's node certificate, a peer-CA certificate naming no node,
	// none at all.
	for name, cert := range map[string]tls.Certificate{
		"client CA":  clientCert(t, p.clientCA, CertSpec{CommonName: "client", Names: []string{NodeName(2)}, Client: true}),
		"foreign CA": clientCert(t, other, CertSpec{CommonName: "node", Names: []string{NodeName(2)}, Server: true, Client: true}),
		"no node id": clientCert(t, p.peerCA, CertSpec{CommonName: "node", Names: []string{"127.0.0.1"}, Server: true, Client: true}),
		"none":       {},
	} {
		if _, err := dial(t, addr, peerConfig(cert)); err == nil {
			t.Errorf("a peer handshake with a certificate (%s) was accepted", name)
		}
	}

	// The caller refuses a server that is not a node: one presenting a
	// client-API certificate, as any listener of the client CA would.
	impostor := clientCert(t, p.clientCA, CertSpec{CommonName: "impostor", Names: []string{NodeName(3)}, Server: true})
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{impostor}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	if _, err := dial(t, ln.Addr().String(), s.PeerClientConfig()); err == nil || !strings.Contains(err.Error(), "the node's certificate") {
		t.Fatalf("a peer call to a server with a client-CA certificate: %v, want refused", err)
	}
}

func TestLoadErrorsNameTheFlag(t *testing.T) {
	p := newPKI(t)
	for _, tc := range []struct {
		name string
		edit func(*Files)
		want string
	}{
		{"no key", func(f *Files) { f.ClientKey = "" }, "--tls-key"},
		{"missing cert", func(f *Files) { f.ClientCert = filepath.Join(p.dir, "nope.pem") }, "--tls-cert"},
		{"bad client CA", func(f *Files) { f.ClientCA = f.ClientKey }, "--tls-client-ca"},
		{"peer half set", func(f *Files) { f.PeerKey = "" }, "go together"},
		{"peer cert of another CA", func(f *Files) { f.PeerCA = f.ClientCA }, "--peer-cert"},
		{"peer cert without node id", func(f *Files) { f.PeerCert, f.PeerKey = f.ClientCert, f.ClientKey }, "names no node id"},
	} {
		f := p.files
		tc.edit(&f)
		if _, err := Load(f); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
}

// Rotation: a certificate rewritten on disk serves the next handshake
// (by Watch, without Reload being called), while a connection made
// before keeps working; a broken rewrite keeps the old material.
func TestRotationWithoutRestart(t *testing.T) {
	p := newPKI(t)
	s, err := Load(p.files)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 16)
	if err := s.Watch(ctx, func(err error) { errs <- err }); err != nil {
		t.Fatal(err)
	}
	addr, states := serve(t, s)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(p.clientCA.PEM)
	cfg := &tls.Config{RootCAs: roots}
	before, err := dial(t, addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	<-states
	oldSerial := before.ConnectionState().PeerCertificates[0].SerialNumber

	next := p.issueAPI(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := dial(t, addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		<-states
		got := c.ConnectionState().PeerCertificates[0].SerialNumber
		if got.Cmp(next.SerialNumber) == 0 {
			break
		}
		if got.Cmp(oldSerial) != 0 {
			t.Fatalf("served serial %v, neither the old nor the new", got)
		}
		if time.Now().After(deadline) {
			t.Fatal("the rewritten certificate was not served within 10 s")
		}
		time.Sleep(20 * time.Millisecond) // the watcher's event is not observable here
	}
	// The connection from before the rotation still works.
	if _, err := before.Write([]byte("y")); err != nil {
		t.Fatalf("a connection from before the rotation: %v", err)
	}

	// A key that does not match its certificate: Reload fails, and the
	// material stays.
	if err := os.WriteFile(p.files.ClientKey, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err == nil || !strings.Contains(err.Error(), "--tls-key") {
		t.Fatalf("Reload with a broken key: %v, want an error naming --tls-key", err)
	}
	c, err := dial(t, addr, cfg)
	if err != nil {
		t.Fatalf("after a failed reload: %v", err)
	}
	if got := c.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(next.SerialNumber) != 0 {
		t.Fatalf("after a failed reload the server presents serial %v, want the last good one", got)
	}
}
