// Package tlsconfig holds a Warden node's TLS material: the certificate
// its client API presents and the CA that verifies client certificates,
// and the peer certificate and peer CA of the node-to-node links. It
// reads them from PEM files, reloads them without a restart (Reload, on
// SIGHUP and when a file changes: Watch), and builds the tls.Config of
// the node's listener and of its calls to other nodes.
//
// One listener serves both APIs. A node calling another sends the
// server name PeerServerName: the listener then presents the node's peer
// certificate and requires the caller's, signed by the peer CA and
// naming a node id (NodeName). Any other handshake gets the client-API
// certificate and, with a client CA, may present a client certificate.
// The peer CA must be distinct from the client CA: Dragonboat's Raft
// transport checks only the CA, so a client certificate from a shared CA
// could talk Raft.
package tlsconfig

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/fsnotify/fsnotify"
)

// PeerServerName is the TLS server name (SNI) of a node-to-node call.
const PeerServerName = "peer.warden"

// nodeNameSuffix ends the DNS name that names a node id in its peer
// certificate: node-<id>.peer.warden.
const nodeNameSuffix = "." + PeerServerName

// NodeName is the DNS subject alternative name that names node id in its
// peer certificate.
func NodeName(id uint64) string { return "node-" + strconv.FormatUint(id, 10) + nodeNameSuffix }

// NodeIDOf returns the node id cert names (NodeName), if it names one.
// It does not verify cert.
func NodeIDOf(cert *x509.Certificate) (uint64, bool) {
	for _, n := range cert.DNSNames {
		s, ok := strings.CutSuffix(n, nodeNameSuffix)
		if !ok {
			continue
		}
		s, ok = strings.CutPrefix(s, "node-")
		if !ok {
			continue
		}
		if id, err := strconv.ParseUint(s, 10, 64); err == nil && id != 0 {
			return id, true
		}
	}
	return 0, false
}

// Files names the PEM files of a node's TLS material. ClientCert and
// ClientKey are required; the rest are optional, but PeerCA, PeerCert and
// PeerKey go together.
type Files struct {
	// ClientCert and ClientKey are the certificate (chain) and key the
	// client API presents (--tls-cert, --tls-key).
	ClientCert, ClientKey string
	// ClientCA verifies client certificates (--tls-client-ca); without it
	// the API asks for none.
	ClientCA string
	// PeerCA verifies other nodes' peer certificates; PeerCert and PeerKey
	// are this node's (--peer-ca, --peer-cert, --peer-key).
	PeerCA, PeerCert, PeerKey string
}

// paths lists the files set, for Watch.
func (f Files) paths() []string {
	var out []string
	for _, p := range []string{f.ClientCert, f.ClientKey, f.ClientCA, f.PeerCA, f.PeerCert, f.PeerKey} {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// material is one consistent load of Files.
type material struct {
	client    *tls.Certificate
	clientCAs *x509.CertPool // nil: no client certificates asked for
	peer      *tls.Certificate
	peerCAs   *x509.CertPool
}

// Store is a node's TLS material, replaced whole by each Reload. Its
// methods are safe for concurrent use.
type Store struct {
	files Files
	cur   atomic.Pointer[material]
}

// Load reads files and returns a Store of them. The errors name the flag
// of the file that failed.
func Load(files Files) (*Store, error) {
	if files.ClientCert == "" || files.ClientKey == "" {
		return nil, errors.New("tls: --tls-cert and --tls-key are both required")
	}
	if n := countSet(files.PeerCA, files.PeerCert, files.PeerKey); n != 0 && n != 3 {
		return nil, errors.New("tls: --peer-ca, --peer-cert and --peer-key go together")
	}
	s := &Store{files: files}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

func countSet(vals ...string) int {
	n := 0
	for _, v := range vals {
		if v != "" {
			n++
		}
	}
	return n
}

// Reload reads the files again and, if every one of them loads, serves
// the new material to the handshakes that follow (established
// connections keep theirs). On error the old material stays.
func (s *Store) Reload() error {
	m := &material{}
	var err error
	if m.client, err = keyPair(s.files.ClientCert, s.files.ClientKey, "--tls-cert", "--tls-key"); err != nil {
		return err
	}
	if s.files.ClientCA != "" {
		if m.clientCAs, err = pool(s.files.ClientCA, "--tls-client-ca"); err != nil {
			return err
		}
	}
	if s.files.PeerCA != "" {
		if m.peerCAs, err = pool(s.files.PeerCA, "--peer-ca"); err != nil {
			return err
		}
		if m.peer, err = keyPair(s.files.PeerCert, s.files.PeerKey, "--peer-cert", "--peer-key"); err != nil {
			return err
		}
		if _, ok := NodeIDOf(m.peer.Leaf); !ok {
			return fmt.Errorf("tls: --peer-cert %s names no node id (a DNS name node-<id>%s)", s.files.PeerCert, nodeNameSuffix)
		}
		if _, err := m.peer.Leaf.Verify(x509.VerifyOptions{Roots: m.peerCAs, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
			return fmt.Errorf("tls: --peer-cert %s is not valid under --peer-ca %s: %w", s.files.PeerCert, s.files.PeerCA, err)
		}
	}
	s.cur.Store(m)
	return nil
}

func keyPair(certFile, keyFile, certFlag, keyFlag string) (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: %s %s with %s %s: %w", certFlag, certFile, keyFlag, keyFile, err)
	}
	return &c, nil // Leaf is set (Go 1.23 and later)
}

func pool(file, flag string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tls: %s: %w", flag, err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("tls: %s %s holds no PEM certificate", flag, file)
	}
	return p, nil
}

// ClientConfig is the TLS config of a client of the client API: the
// nodes verified against caFile (the system's roots if empty), and the
// certificate in certFile with its key in keyFile presented, if set. The
// errors name the warden CLI's flags (--cacert, --cert, --key).
func ClientConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	var err error
	if caFile != "" {
		if cfg.RootCAs, err = pool(caFile, "--cacert"); err != nil {
			return nil, err
		}
	}
	if certFile != "" || keyFile != "" {
		if certFile == "" || keyFile == "" {
			return nil, errors.New("tls: --cert and --key go together")
		}
		pair, err := keyPair(certFile, keyFile, "--cert", "--key")
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{*pair}
	}
	return cfg, nil
}

// HasPeer reports whether the store holds peer material.
func (s *Store) HasPeer() bool { return s.cur.Load().peer != nil }

// PeerFiles returns the peer CA, certificate and key files, for
// Dragonboat's Raft transport (which reads them itself, once).
func (s *Store) PeerFiles() (ca, cert, key string) {
	return s.files.PeerCA, s.files.PeerCert, s.files.PeerKey
}

// nextProtos are the listener's ALPN protocols: HTTP/2 for gRPC and
// Connect, HTTP/1.1 for Connect's JSON from any HTTP client.
var nextProtos = []string{"h2", "http/1.1"}

// ServerConfig is the listener's TLS config. Each handshake takes the
// material current then: a peer handshake (server name PeerServerName)
// the peer certificate, requiring a peer one from the caller; any other
// the client-API certificate, verifying a client certificate if one is
// presented (the HTTP layer decides which calls need one, so health
// probes get through without).
func (s *Store) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.cur.Load()
			if hello.ServerName == PeerServerName {
				if m.peer == nil {
					return nil, errors.New("tls: a peer handshake, and this node has no peer certificate")
				}
				return &tls.Config{
					MinVersion:       tls.VersionTLS12,
					NextProtos:       nextProtos,
					Certificates:     []tls.Certificate{*m.peer},
					ClientAuth:       tls.RequireAndVerifyClientCert,
					ClientCAs:        m.peerCAs,
					VerifyConnection: requireNodeName,
				}, nil
			}
			c := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: nextProtos, Certificates: []tls.Certificate{*m.client}}
			if m.clientCAs != nil {
				c.ClientAuth, c.ClientCAs = tls.VerifyClientCertIfGiven, m.clientCAs
			}
			return c, nil
		},
	}
}

// requireNodeName refuses a verified peer certificate that names no
// node id.
func requireNodeName(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: no peer certificate")
	}
	if _, ok := NodeIDOf(cs.PeerCertificates[0]); !ok {
		return fmt.Errorf("tls: the peer certificate names no node id (a DNS name node-<id>%s)", nodeNameSuffix)
	}
	return nil
}

// PeerClientConfig is the TLS config of this node's calls to other
// nodes' APIs: it sends PeerServerName and this node's peer certificate,
// and accepts a server certificate that the peer CA signed for server
// use and that names a node id. (The server's address is not checked:
// the peer CA signs node certificates only, and a node's identity is its
// id.) It is nil when the store holds no peer material.
func (s *Store) PeerClientConfig() *tls.Config {
	if !s.HasPeer() {
		return nil
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
		ServerName: PeerServerName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return s.cur.Load().peer, nil
		},
		// The default verification would check the certificate against
		// the server name, which no certificate carries; VerifyConnection
		// verifies the chain against the current peer CA instead.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: the node presented no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			opts := x509.VerifyOptions{Roots: s.cur.Load().peerCAs, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
			if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
				return fmt.Errorf("tls: the node's certificate: %w", err)
			}
			return requireNodeName(cs)
		},
	}
}

// PeerNodeID returns the node id of a connection's verified peer
// certificate: the caller is another node. It is false for any other
// connection (no TLS, a client handshake, a certificate naming no node).
func PeerNodeID(cs *tls.ConnectionState) (uint64, bool) {
	if cs == nil || cs.ServerName != PeerServerName || len(cs.VerifiedChains) == 0 {
		return 0, false
	}
	return NodeIDOf(cs.VerifiedChains[0][0])
}

// Watch reloads the store when one of its files changes (written,
// created, renamed into place, as a Kubernetes Secret's volume swaps its
// symlink), until ctx ends. Reload errors go to onError; the old
// material stays. Watching the files' directories, not the files, sees a
// file replaced by a rename.
func (s *Store) Watch(ctx context.Context, onError func(error)) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("tls: watching the certificate files: %w", err)
	}
	dirs := map[string]bool{}
	for _, p := range s.files.paths() {
		dirs[filepath.Dir(p)] = true
	}
	for d := range dirs {
		if err := w.Add(d); err != nil {
			w.Close()
			return fmt.Errorf("tls: watching %s: %w", d, err)
		}
	}
	go func() {
		defer w.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename|fsnotify.Remove) == 0 {
					continue
				}
				// A writer may replace cert and key one after the other:
				// a load between them fails (a mismatched pair) and is
				// retried by the next event.
				if err := s.Reload(); err != nil {
					onError(err)
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				onError(err)
			}
		}
	}()
	return nil
}
