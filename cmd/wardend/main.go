// Command wardend is the Warden server.
//
//	wardend --dev --data-dir ./data/dev --listen 127.0.0.1:7070
//
// runs a whole cluster in one process: three Raft nodes on loopback in
// zones az1..az3, each with a replica of the placement group and of every
// data shard, serving the Connect API, grpc.health.v1, reflection and
// /metrics on --listen.
//
// In production each node is one process (see deploy/):
//
//	wardend --node-id 1 --zone az1 --raft-addr 10.0.1.5:7100 --listen 10.0.1.5:7070 \
//	  --data-dir /var/lib/warden --cluster-secret-file /etc/warden/secret \
//	  --initial-members 1=10.0.1.5:7100=10.0.1.5:7070,2=10.0.2.5:7100=10.0.2.5:7070,3=10.0.3.5:7100=10.0.3.5:7070 \
//	  --initial-cluster-state new   # the first start only
//
// Every initial member gets the same --initial-members, and on its very
// first start --initial-cluster-state new, which lets it initialise its
// empty --data-dir; a node added later starts with --join (the Connect
// addresses of running nodes) instead. SIGTERM or SIGINT shuts it down
// gracefully; a second start on the same --data-dir recovers the state.
// A start on an empty --data-dir without --initial-cluster-state new is
// refused: a member that lost its data must never vote again under its
// id.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alecthomas/kong"

	"github.com/warden-dev/warden/auth"
	"github.com/warden-dev/warden/cmd/wardend/flags"
	"github.com/warden-dev/warden/placement"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/server"
	"github.com/warden-dev/warden/tlsconfig"
)

// cli is wardend's command line (package flags, which deploy/kubernetes's
// tests parse rendered manifests with).
type cli = flags.CLI

func main() {
	var c cli
	k, err := parser(&c)
	if err != nil {
		panic(err) // the flag definitions are wrong: a programming error
	}
	kctx, err := k.Parse(os.Args[1:])
	k.FatalIfErrorf(err)
	k.FatalIfErrorf(c.ResolveNodeID(os.Hostname))
	if c.Dev && c.DataDir == "" {
		c.DataDir = "./data/dev"
	}
	if kctx.Command() == "restore" {
		k.FatalIfErrorf(restore(c, os.Stdout))
		return
	}
	if !c.Dev {
		_, err := clusterConfig(c)
		k.FatalIfErrorf(err) // a usage error, before anything starts
	} else if c.PeerCA != "" || c.PeerCert != "" || c.PeerKey != "" {
		k.Fatalf("--dev serves no node API (its nodes share one process): the --peer flags do not apply")
	} else if c.AuthBootstrap != "" {
		k.Fatalf("--auth-bootstrap is for production nodes (with TLS); a dev cluster runs without authentication")
	}
	slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: c.LogLevel})))
	if err := run(c); err != nil {
		slog.Error("wardend stopped", "err", err)
		os.Exit(1)
	}
}

func run(c cli) error {
	placement.RouteRaftLogs(c.RaftLogLevel)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	audit, auditFile, err := openAudit(c.AuditLog)
	if err != nil {
		return err
	}
	defer auditFile.Close()
	cfg := server.Config{Listen: c.Listen, PprofAddr: c.PprofAddr}
	if cfg.CORSOrigins, err = server.ParseCORSOrigins(c.CORSOrigins); err != nil {
		return err
	}
	if c.Dev && len(c.CORSOrigins) == 0 {
		cfg.CORSOrigins = server.DevCORSOrigins
	}
	if c.TLSCert != "" || c.TLSKey != "" {
		files := tlsconfig.Files{ClientCert: c.TLSCert, ClientKey: c.TLSKey, ClientCA: c.TLSClientCA, PeerCA: c.PeerCA, PeerCert: c.PeerCert, PeerKey: c.PeerKey}
		if cfg.TLS, err = tlsconfig.Load(files); err != nil {
			return err
		}
		if err := cfg.TLS.Watch(ctx, func(err error) { slog.Error("reloading the TLS material; the old stays", "err", err) }); err != nil {
			return err
		}
	} else if !c.Dev {
		slog.Warn("serving without TLS (--insecure): the nodes authenticate each other by the cluster secret alone, and anyone on the network can read and alter traffic")
	}
	if c.Dev {
		cfg.Dev = &server.DevConfig{DataDir: c.DataDir, ListenAddr: c.Listen, Router: router.Config{Audit: audit}, BuildVersion: buildVersion()}
	} else {
		if cfg.Cluster, err = clusterConfig(c); err != nil {
			return err
		}
		cfg.Cluster.Router.Audit = audit
		cfg.Cluster.Router.MetricsAuth = c.MetricsAuth
		cfg.Cluster.Router.Knobs.ClockOffset = c.ClockOffset
	}
	go reloadOnHangup(ctx, cfg.TLS, auditFile)
	srv, err := server.Start(cfg)
	if err != nil {
		return err
	}
	var modes []string
	for _, m := range srv.Cluster.Modes {
		modes = append(modes, m.String())
	}
	slog.Info("wardend serving", "listen", srv.Addr(), "data_dir", c.DataDir, "dev", c.Dev, "start", modes, "members", srv.Cluster.Members())

	var failed error // the HTTP server's, when it stopped by itself
	select {
	case failed = <-srv.Failed():
	case <-ctx.Done():
		slog.Info("wardend shutting down")
	}
	sctx, cancel := context.WithTimeout(context.Background(), c.ShutdownWait)
	defer cancel()
	return errors.Join(failed, srv.Shutdown(sctx))
}

// parser is wardend's command line (flags.Parser) with this binary's
// version.
func parser(c *cli) (*kong.Kong, error) {
	return flags.Parser(c, "wardend "+buildVersion()+" "+runtime.Version())
}

// reloadOnHangup, on each SIGHUP until ctx ends, reloads the TLS
// material s (if any) and reopens the audit file (for rotation).
func reloadOnHangup(ctx context.Context, s *tlsconfig.Store, audit *auditFile) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		if s != nil {
			if err := s.Reload(); err != nil {
				slog.Error("reloading the TLS material on SIGHUP; the old stays", "err", err)
			} else {
				slog.Info("reloaded the TLS material on SIGHUP")
			}
		}
		if err := audit.Reopen(); err != nil {
			slog.Error("reopening the audit log on SIGHUP; writing to the old file", "err", err)
		}
	}
}

// clusterConfig builds a production node's config from the flags.
func clusterConfig(c cli) (server.ClusterConfig, error) {
	switch {
	case c.NodeID == 0:
		return server.ClusterConfig{}, errors.New("--node-id is required (or --node-id-from-ordinal, or --dev)")
	case c.Zone == "":
		return server.ClusterConfig{}, errors.New("--zone is required")
	case c.RaftAddr == "":
		return server.ClusterConfig{}, errors.New("--raft-addr is required")
	case c.DataDir == "":
		return server.ClusterConfig{}, errors.New("--data-dir is required (a production node keeps its Raft log there)")
	case c.InitialMembers == "" && len(c.Join) == 0:
		return server.ClusterConfig{}, errors.New("--initial-members or --join is required")
	}
	members, err := parseMembers(c.InitialMembers)
	if err != nil {
		return server.ClusterConfig{}, err
	}
	if c.InitialState == "new" && !slices.ContainsFunc(members, func(m server.Member) bool { return m.ID == c.NodeID }) {
		return server.ClusterConfig{}, fmt.Errorf("--initial-cluster-state new: node %d is not in --initial-members; a node that joins a running cluster starts with --join alone", c.NodeID)
	}
	listen, err := advertised("--advertise-addr", c.Advertise, "--listen", c.Listen)
	if err != nil {
		return server.ClusterConfig{}, err
	}
	raft, err := advertised("--raft-advertise-addr", c.RaftAdvertise, "--raft-addr", c.RaftAddr)
	if err != nil {
		return server.ClusterConfig{}, err
	}
	cfg := server.ClusterConfig{
		Nodes:        []server.NodeSpec{{ID: c.NodeID, Zone: c.Zone, RaftAddr: raft, RaftListenAddr: c.RaftAddr, DataDir: c.DataDir}},
		ListenAddr:   listen,
		Members:      members,
		Join:         c.Join,
		NewCluster:   c.InitialState == "new",
		BuildVersion: buildVersion(),
	}
	if cfg.DiskReserve, err = placement.ParseDiskReserve(c.DiskReserve); err != nil {
		return server.ClusterConfig{}, fmt.Errorf("--disk-reserve: %w", err)
	}
	switch tlsSet := c.TLSCert != "" || c.TLSKey != "" || c.TLSClientCA != "" || c.PeerCA != "" || c.PeerCert != "" || c.PeerKey != ""; {
	case c.Insecure && tlsSet:
		return server.ClusterConfig{}, errors.New("--insecure and the TLS flags exclude each other")
	case c.Insecure && c.SecretFile == "":
		return server.ClusterConfig{}, errors.New("--insecure needs --cluster-secret-file: it is all that authenticates the nodes to each other")
	case !c.Insecure && (c.TLSCert == "" || c.TLSKey == "" || c.PeerCA == "" || c.PeerCert == "" || c.PeerKey == ""):
		return server.ClusterConfig{}, errors.New("a node serves TLS: --tls-cert, --tls-key, --peer-ca, --peer-cert and --peer-key are required (or --insecure, for cleartext with --cluster-secret-file)")
	}
	if c.AuthBootstrap != "" {
		if c.Insecure {
			return server.ClusterConfig{}, errors.New("--auth-bootstrap needs TLS (not --insecure): tokens must not travel in clear")
		}
		if cfg.AuthBootstrap, err = auth.LoadBootstrap(c.AuthBootstrap, time.Now().UnixMilli()); err != nil {
			return server.ClusterConfig{}, fmt.Errorf("--auth-bootstrap: %w", err)
		}
	}
	if c.SecretFile != "" {
		b, err := os.ReadFile(c.SecretFile)
		if err != nil {
			return server.ClusterConfig{}, fmt.Errorf("--cluster-secret-file: %w", err)
		}
		if cfg.Router.ClusterSecret = strings.TrimSpace(string(b)); len(cfg.Router.ClusterSecret) < 16 {
			return server.ClusterConfig{}, fmt.Errorf("--cluster-secret-file: the secret must be at least 16 characters")
		}
	}
	return cfg, nil
}

// advertised is the address the other nodes reach a bound address at:
// adv (the flag named advFlag) if set, else bind (bindFlag's). An address
// without a host, or with an unspecified one (0.0.0.0, ::), binds every
// interface and cannot be advertised.
func advertised(advFlag, adv, bindFlag, bind string) (string, error) {
	if adv == "" {
		if host, _, err := net.SplitHostPort(bind); err == nil && (host == "" || net.ParseIP(host).IsUnspecified()) {
			return "", fmt.Errorf("%s %s binds every interface: give %s, the address the other nodes reach", bindFlag, bind, advFlag)
		}
		return bind, nil
	}
	host, port, err := net.SplitHostPort(adv)
	if err != nil || port == "" || port == "0" {
		return "", fmt.Errorf("%s %q: want host:port with a port", advFlag, adv)
	}
	if host == "" || net.ParseIP(host).IsUnspecified() {
		return "", fmt.Errorf("%s %q: the other nodes cannot reach an unspecified host", advFlag, adv)
	}
	return adv, nil
}

// parseMembers parses --initial-members: id=raftaddr=listenaddr,...
func parseMembers(v string) ([]server.Member, error) {
	var out []server.Member
	if v == "" {
		return nil, nil
	}
	for _, item := range strings.Split(v, ",") {
		parts := strings.Split(strings.TrimSpace(item), "=")
		if len(parts) != 3 {
			return nil, fmt.Errorf("--initial-members: %q is not id=raftaddr=listenaddr", item)
		}
		id, err := strconv.ParseUint(parts[0], 10, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("--initial-members: %q: the id must be a positive integer", item)
		}
		for _, a := range parts[1:] {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return nil, fmt.Errorf("--initial-members: %q: %v", item, err)
			}
		}
		if slices.ContainsFunc(out, func(m server.Member) bool { return m.ID == id }) {
			return nil, fmt.Errorf("--initial-members: node %d is listed twice", id)
		}
		out = append(out, server.Member{ID: id, RaftAddr: parts[1], ListenAddr: parts[2]})
	}
	return out, nil
}

// openAudit opens the audit log: nil when path is empty, stderr for "-",
// else the file, appended to. The file (nil for the first two) is
// reopened by Reopen.
func openAudit(path string) (*slog.Logger, *auditFile, error) {
	switch path {
	case "":
		return nil, nil, nil
	case "-":
		return slog.New(slog.NewJSONHandler(os.Stderr, nil)), nil, nil
	}
	a := &auditFile{path: path}
	if err := a.Reopen(); err != nil {
		return nil, nil, err
	}
	return slog.New(slog.NewJSONHandler(a, nil)), a, nil
}

// auditFile is the audit log's file, which Reopen swaps for the file now
// at its path (after logrotate moved the old one away). Each record is
// one Write.
type auditFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

func (a *auditFile) Write(b []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.f.Write(b)
}

// Reopen opens the file at the path (creating it) and closes the old one;
// on error the old one stays. A nil auditFile does nothing.
func (a *auditFile) Reopen() error {
	if a == nil {
		return nil
	}
	f, err := os.OpenFile(a.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o640)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	a.mu.Lock()
	old := a.f
	a.f = f
	a.mu.Unlock()
	if old != nil {
		return old.Close()
	}
	return nil
}

// Close closes the file; a nil auditFile does nothing.
func (a *auditFile) Close() {
	if a != nil {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.f.Close()
	}
}

// restore runs wardend restore: it checks the backup whole, then writes
// the node's (or the dev cluster's) data directory and says how to start.
func restore(c cli, out io.Writer) error {
	trust := server.BackupTrust{AllowUnsigned: c.Restore.AllowUnsigned}
	if c.Restore.VerifyKey != "" {
		b, err := os.ReadFile(c.Restore.VerifyKey)
		if err != nil {
			return fmt.Errorf("restore: --verify-key: %w", err)
		}
		if trust.Key, err = server.ParseBackupPublicKey(b); err != nil {
			return fmt.Errorf("restore: --verify-key %s: %w", c.Restore.VerifyKey, err)
		}
	}
	b, err := server.OpenBackup(c.Restore.From, trust)
	if err != nil {
		return err
	}
	if c.Dev {
		res, err := server.RestoreDev(b, c.DataDir, c.Restore.MinEpoch)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "restored backup %s (taken %s) into %s: restore %s, shard epochs %v\nstart it with: wardend --dev --data-dir %s\n",
			b.Manifest.GetBackupId(), b.Manifest.GetCreatedAt().AsTime().Format(time.RFC3339), c.DataDir, res[0].RestoreID, res[0].Epochs, c.DataDir)
		return nil
	}
	switch {
	case c.NodeID == 0:
		return errors.New("restore: --node-id is required (or --dev)")
	case c.DataDir == "":
		return errors.New("restore: --data-dir is required")
	}
	res, err := server.RestoreNode(b, c.NodeID, c.Zone, c.DataDir, c.Restore.MinEpoch)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "restored node %d of backup %s (taken %s) into %s: %d replicas, restore %s, shard epochs %v\n"+
		"restore every other node of the backup the same way, then start each with its usual flags and --initial-members naming them all\n",
		c.NodeID, b.Manifest.GetBackupId(), b.Manifest.GetCreatedAt().AsTime().Format(time.RFC3339), c.DataDir, res.Replicas, res.RestoreID, res.Epochs)
	return nil
}
