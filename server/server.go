package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof" // served only on Config.PprofAddr
	"time"

	"github.com/warden-dev/warden/router"
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
}

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
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("server: listen: %w", err)
	}
	s := &Server{ln: ln, failed: make(chan error, 1)}
	if cfg.Dev != nil {
		dev := *cfg.Dev
		if dev.ListenAddr == "" {
			dev.ListenAddr = ln.Addr().String()
		}
		s.Cluster, err = StartDev(dev)
	} else {
		cc := cfg.Cluster
		if cc.ListenAddr == "" {
			cc.ListenAddr = ln.Addr().String()
		}
		s.Cluster, err = StartCluster(cc)
	}
	if err != nil {
		ln.Close()
		return nil, err
	}
	if cfg.PprofAddr != "" {
		if s.pprof, err = net.Listen("tcp", cfg.PprofAddr); err != nil {
			ln.Close()
			s.Cluster.Close()
			return nil, fmt.Errorf("server: pprof-addr: %w", err)
		}
		// net/http/pprof registers its handlers on the default mux.
		go func() { _ = http.Serve(s.pprof, http.DefaultServeMux) }()
	}
	s.http = newHTTPServer(router.NewHandler(s.Cluster.Router))
	go func() {
		if err := s.http.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.failed <- err
		}
	}()
	return s, nil
}

// newHTTPServer returns an HTTP server for h that speaks HTTP/1.1 and
// cleartext HTTP/2 (h2c), as gRPC clients without TLS need.
func newHTTPServer(h http.Handler) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		// Requests are small; a body that trickles in is an attack. (There
		// is no WriteTimeout: a waiting Acquire may answer minutes later.)
		ReadTimeout:    30 * time.Second,
		IdleTimeout:    5 * time.Minute,
		MaxHeaderBytes: 64 << 10,
	}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
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
