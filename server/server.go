package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // served only on Config.PprofAddr
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/rpc"
	"github.com/warden-dev/warden/tlsconfig"
)

// Config is what a wardend process runs: a dev cluster or one production
// node, and the HTTP surface it serves.
type Config struct {
	// Listen is the address (host:port) of the Connect API, health,
	// reflection and /metrics. Port 0 picks a free port; the cluster then
	// advertises the port picked.
	Listen string
	// Dev, if set, runs a whole dev cluster in this process and Cluster
	// is ignored.
	Dev *DevConfig
	// Cluster is the production node (and what it knows of its cluster).
	Cluster ClusterConfig
	// PprofAddr, if set, serves Go's profiler (/debug/pprof/) on this
	// address, for performance work; keep it on loopback.
	PprofAddr string
	// CORSOrigins are the origins (ParseCORSOrigins's forms) whose
	// browser pages may call the API: none when empty.
	CORSOrigins []string
	// TLS, if set, serves Listen over TLS with its material (HTTP/2 by
	// ALPN, and HTTP/1.1), the node API included: other nodes' calls
	// present the peer certificate. Cluster.TLS is set to it. Without it
	// a production node needs Cluster.Router.ClusterSecret (wardend
	// --insecure), which authenticates the nodes instead.
	TLS *tlsconfig.Store
}

// insecure is 1 on a node that serves without TLS outside a dev cluster
// (wardend --insecure).
// buildInfo is 1 for the version this process serves, labelled with it,
// the VCS revision (when the build recorded it) and the Go version.
var buildInfo = promauto.NewGaugeVec(prometheus.GaugeOpts{Name: "warden_build_info",
	Help: "1, labelled with the wardend version, its VCS revision and the Go version."}, []string{"version", "revision", "go"})

// revision is the VCS revision the binary was built from, or "unknown".
func revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

var insecure = promauto.NewGauge(prometheus.GaugeOpts{Name: "warden_insecure", Help: "1 if this production node serves its APIs and Raft without TLS (wardend --insecure), else 0."})

// Server is a running wardend: its cluster and its HTTP servers.
type Server struct {
	// Cluster is the part of the cluster this process runs.
	Cluster *Cluster
	ln      net.Listener
	http    *http.Server
	pprof   net.Listener
	failed  chan error
}

// Start listens on cfg.Listen, starts the cluster (StartDev or
// StartCluster) advertising the address it listens on unless the config
// names one, and serves the HTTP surface. Call Shutdown to stop it.
func Start(cfg Config) (*Server, error) {
	if cfg.Dev == nil {
		cfg.Cluster.TLS = cfg.TLS
		switch {
		case cfg.TLS != nil && !cfg.TLS.HasPeer():
			return nil, errors.New("server: TLS without peer material: the nodes could not authenticate each other (--peer-ca, --peer-cert, --peer-key)")
		case cfg.TLS == nil && cfg.Cluster.AuthBootstrap != nil:
			return nil, errors.New("server: authentication needs TLS on the client API, or tokens would travel in clear")
		case cfg.TLS == nil && cfg.Cluster.Router.ClusterSecret == "":
			return nil, errors.New("server: a node without TLS needs the cluster secret, which authenticates the nodes to each other")
		}
	}
	version := cfg.Cluster.BuildVersion
	if cfg.Dev != nil {
		version = cfg.Dev.BuildVersion
	}
	buildInfo.WithLabelValues(version, revision(), runtime.Version()).Set(1)
	insecure.Set(0)
	if cfg.Dev == nil && cfg.TLS == nil {
		insecure.Set(1)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("server: listen: %w", err)
	}
	s := &Server{ln: ln, failed: make(chan error, 1)}
	// The listener answers while the cluster starts: another starting
	// node asks how this one starts (rpc.NewStartingHandler), which
	// its identity check waits for (confirmIdentity).
	var current atomic.Pointer[http.Handler]
	starting := rpc.NewStartingHandler(router.Config{}, func() string { return "" }) // a dev cluster serves no node API
	if cfg.Dev == nil {
		rc := cfg.Cluster.Router
		rc.PeerTLS = cfg.TLS != nil // with peer material, checked above
		cfg.Cluster.Status = NewStatus(cfg.Cluster)
		starting = rpc.NewStartingHandler(rc, cfg.Cluster.Status.String)
	}
	// No client call is served before the router exists: a gRPC-Web-text
	// one is refused unread, as one that fails authentication is after.
	starting = withCORS(grpcWebText(starting, maxTextRequestBytes, refuseWhileStarting), cfg.CORSOrigins)
	current.Store(&starting)
	s.http = newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		(*current.Load()).ServeHTTP(w, req)
	}), cfg.TLS != nil)
	serve := ln
	if cfg.TLS != nil {
		serve = tls.NewListener(ln, cfg.TLS.ServerConfig())
	}
	go func() {
		if err := s.http.Serve(serve); !errors.Is(err, http.ErrServerClosed) {
			s.failed <- err
		}
	}()
	if cfg.Dev != nil {
		dev := *cfg.Dev
		dev.Router.ClientTLS = cfg.TLS != nil
		if dev.ListenAddr == "" {
			dev.ListenAddr = ln.Addr().String()
		}
		s.Cluster, err = StartDev(dev)
	} else {
		cc := cfg.Cluster
		cc.Router.ClientTLS = cfg.TLS != nil
		if cc.ListenAddr == "" {
			cc.ListenAddr = ln.Addr().String()
		}
		s.Cluster, err = StartCluster(cc)
	}
	if err != nil {
		s.http.Close()
		ln.Close()
		return nil, err
	}
	if cfg.PprofAddr != "" {
		if s.pprof, err = net.Listen("tcp", cfg.PprofAddr); err != nil {
			s.http.Close()
			s.Cluster.Close()
			return nil, fmt.Errorf("server: pprof-addr: %w", err)
		}
		// net/http/pprof registers its handlers on the default mux.
		go func() { _ = http.Serve(s.pprof, http.DefaultServeMux) }()
	}
	full := handler(s.Cluster.Router, cfg.CORSOrigins)
	current.Store(&full)
	return s, nil
}

// refuseWhileStarting answers a client call that reaches a node whose
// cluster is still starting: unavailable, so that the client retries.
func refuseWhileStarting(req *http.Request) error {
	if !rpc.ClientPath(req.URL.Path) {
		return nil
	}
	return connect.NewError(connect.CodeUnavailable, errors.New("the node is starting"))
}

// handler is the HTTP surface of r: rpc.NewHandler, with the
// gRPC-Web-text translation and CORS (for corsOrigins) in front.
func handler(r *router.Router, corsOrigins []string) http.Handler {
	h := rpc.NewHandler(r)
	return withCORS(grpcWebText(h, maxTextRequestBytes, h.Refusal), corsOrigins)
}

// tlsHandshakeFailures counts the connections whose TLS handshake
// failed (a port scanner, a client with the wrong CA, plain HTTP sent to
// the TLS port).
var tlsHandshakeFailures = promauto.NewCounter(prometheus.CounterOpts{Name: "warden_tls_handshake_failures_total",
	Help: "Connections to the client API whose TLS handshake failed; each is logged at DEBUG only."})

// httpErrorLog is the net/http server's error log: a failed TLS
// handshake, which anyone who reaches the port can cause at will, is
// counted (tlsHandshakeFailures) and logged at DEBUG, not at INFO once
// per connection; anything else is logged at WARN.
type httpErrorLog struct{}

func (httpErrorLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	if strings.Contains(msg, "TLS handshake error") {
		tlsHandshakeFailures.Inc()
		slog.Debug(msg)
	} else {
		slog.Warn(msg)
	}
	return len(p), nil
}

// newHTTPServer returns an HTTP server for h that speaks HTTP/1.1 and
// HTTP/2: over TLS (negotiated by ALPN) when secure, else cleartext
// (h2c), as gRPC clients without TLS need.
func newHTTPServer(h http.Handler, secure bool) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ErrorLog:          log.New(httpErrorLog{}, "", 0),
		ReadHeaderTimeout: 10 * time.Second,
		// Requests are small; a body that trickles in is an attack. (There
		// is no WriteTimeout: a waiting Acquire may answer minutes later.)
		ReadTimeout:    30 * time.Second,
		IdleTimeout:    5 * time.Minute,
		MaxHeaderBytes: 64 << 10,
	}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	if secure {
		srv.Protocols.SetHTTP2(true)
	} else {
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	return srv
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Failed receives the error of an HTTP server that stopped serving by
// itself (not by Shutdown).
func (s *Server) Failed() <-chan error { return s.failed }

// Shutdown stops accepting calls, waits for those in flight until ctx
// ends, and then stops the cluster. The cluster is stopped even when ctx
// ends first; the error says so.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.http.Shutdown(ctx)
	if s.pprof != nil {
		s.pprof.Close()
	}
	s.Cluster.Close()
	return err
}
