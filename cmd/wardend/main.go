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
	"github.com/warden-dev/warden/placement"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/server"
	"github.com/warden-dev/warden/tlsconfig"
)

type cli struct {
	Config         kong.ConfigFlag  `placeholder:"FILE" env:"-" help:"Read flags from FILE (YAML: flag names without the dashes as keys, docs/operations.md). Command-line flags and WARDEN_… variables override it."`
	Version        kong.VersionFlag `env:"-" help:"Print the version and exit."`
	Dev            bool             `help:"Run a whole three-node cluster in this process (the embedded setup make run uses). Without it, run one production node (--node-id and the flags below)."`
	NodeID         uint64           `name:"node-id" placeholder:"ID" help:"This node's id (production mode), unique in the cluster, never reused."`
	Zone           string           `help:"This node's availability zone; a shard's replicas go to distinct zones."`
	RaftAddr       string           `name:"raft-addr" help:"host:port the Raft transport binds (and advertises, unless --raft-advertise-addr)."`
	RaftAdvertise  string           `name:"raft-advertise-addr" placeholder:"HOST:PORT" help:"host:port the other nodes reach this node's Raft transport at, when it differs from --raft-addr (a 0.0.0.0 bind, NAT). Peer certificates name its host."`
	Advertise      string           `name:"advertise-addr" placeholder:"HOST:PORT" help:"host:port the other nodes and clients reach this node's Connect API at, when it differs from --listen (a 0.0.0.0 bind, NAT)."`
	InitialMembers string           `name:"initial-members" help:"The cluster's first nodes, id=raftaddr=listenaddr,... (the same list on each of them)."`
	Join           []string         `help:"Connect addresses of running nodes, for a node that is not an initial member."`
	InitialState   string           `name:"initial-cluster-state" enum:"new,existing" default:"existing" help:"new: this initial member may initialise an empty --data-dir, as every initial member of a cluster being created does on its first start (only then). existing (the default): a node whose data directory holds no state refuses to start, since a member that lost its data must never vote again under its id."`
	SecretFile     string           `name:"cluster-secret-file" placeholder:"PATH" help:"File holding the cluster secret, the same on every node (at least 16 characters). Required with --insecure, where it authenticates the nodes to each other in place of the peer certificates."`
	TLSCert        string           `name:"tls-cert" placeholder:"PATH" group:"TLS" help:"PEM certificate (chain) the client API presents on --listen. With --tls-key, serves TLS (HTTP/2 by ALPN, and HTTP/1.1). Reloaded on SIGHUP and when the file changes."`
	TLSKey         string           `name:"tls-key" placeholder:"PATH" group:"TLS" help:"PEM private key of --tls-cert."`
	TLSClientCA    string           `name:"tls-client-ca" placeholder:"PATH" group:"TLS" help:"PEM CA bundle that verifies client certificates; without it the client API asks for none. Health probes and /metrics need none either way."`
	PeerCA         string           `name:"peer-ca" placeholder:"PATH" group:"TLS" help:"PEM CA that signs the nodes' peer certificates, and only those (not the client CA): verifies the other nodes on the node API and on Raft."`
	PeerCert       string           `name:"peer-cert" placeholder:"PATH" group:"TLS" help:"PEM peer certificate of this node: names its node id (DNS node-<id>.peer.warden) and the host of --raft-addr; for server and client use."`
	PeerKey        string           `name:"peer-key" placeholder:"PATH" group:"TLS" help:"PEM private key of --peer-cert. Raft reads the peer files at start: rotate them with a rolling restart."`
	AuthBootstrap  string           `name:"auth-bootstrap" placeholder:"FILE" help:"Turn authentication on for a cluster that has no auth state yet, with the roles, bindings and tokens of FILE (JSON; docs/security.md). Give the same file to every initial member; the first to commit wins, and later starts ignore it. Needs TLS. Until it commits the node refuses client calls."`
	Insecure       bool             `group:"TLS" env:"-" help:"Serve every port in cleartext, with no TLS: the nodes authenticate each other by --cluster-secret-file alone, and anyone on the network can read and alter traffic. For tests and trusted networks; logged and exported as warden_insecure 1."`
	ClockOffset    time.Duration    `name:"debug-clock-offset" hidden:"" env:"-" help:"Pretend this node's wall clock is off by this much (clock skew tests only)."`
	DataDir        string           `placeholder:"DIR" help:"Directory for Raft logs and state: required for a production node; --dev defaults to ./data/dev."`
	Listen         string           `default:"127.0.0.1:7070" help:"Address to serve the Connect API on."`
	LogLevel       slog.Level       `default:"info" help:"Log level: debug, info, warn, error."`
	RaftLogLevel   slog.Level       `default:"error" help:"Level below which Dragonboat's own logs are dropped (warn shows its election chatter)."`
	ShutdownWait   time.Duration    `default:"10s" help:"How long a graceful shutdown waits for RPCs in flight."`
	AuditLog       string           `help:"Write the audit log (one JSON line per state-changing call, with its principal) to this file, or - for stderr. Reopened on SIGHUP, for rotation."`
	PprofAddr      string           `name:"pprof-addr" placeholder:"HOST:PORT" help:"Serve Go's profiler (/debug/pprof/) on this address, for performance work; keep it on loopback. Off by default."`

	Serve   struct{}   `cmd:"" default:"withargs" help:"Run the node, or with --dev the whole dev cluster (the default command)."`
	Restore restoreCmd `cmd:"" help:"Write an empty --data-dir from a backup (warden admin backup --out), for this node's first start in the restored cluster; takes the node's usual flags (--node-id, --zone, --data-dir, or --dev). Every node of the backup restores its own directory from the same backup, then all start with --initial-members naming them."`
}

// restoreCmd is wardend restore's own flags.
type restoreCmd struct {
	From     string `required:"" placeholder:"DIR" help:"The backup directory (warden admin backup --out DIR)."`
	MinEpoch uint64 `name:"min-epoch" placeholder:"EPOCH" help:"The lowest fencing-token epoch the restored shards may take: the old cluster's epoch limit (warden admin shards shows it), if it can still be read; never below the backup's. Default: the backup's epoch limit plus 65,536 (placement.RestoreEpochGap). Give every node the same value."`
}

func main() {
	var c cli
	k, err := parser(&c)
	if err != nil {
		panic(err) // the flag definitions are wrong: a programming error
	}
	kctx, err := k.Parse(os.Args[1:])
	k.FatalIfErrorf(err)
	if c.Dev && c.DataDir == "" {
		c.DataDir = "./data/dev"
	}
	if kctx.Command() == "restore" {
		k.FatalIfErrorf(restore(c, os.Stdout))
		return
	}
	if !c.Dev {
		_, err := c.clusterConfig()
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
		if cfg.Cluster, err = c.clusterConfig(); err != nil {
			return err
		}
		cfg.Cluster.Router.Audit = audit
		cfg.Cluster.Router.ClockOffset = c.ClockOffset
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

// parser is wardend's command line: the flags of cli, each also read
// from a WARDEN_… environment variable (but --insecure and the debug
// flags) and from --config's file, the command line winning over the
// environment and the environment over the file.
func parser(c *cli) (*kong.Kong, error) {
	return kong.New(c, kong.Name("wardend"), kong.Description("Warden: exclusive locks with leases and fencing tokens, replicated by Raft."),
		kong.DefaultEnvars("WARDEN"), kong.Configuration(yamlConfig), kong.Vars{"version": "wardend " + buildVersion() + " " + runtime.Version()})
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
func (c cli) clusterConfig() (server.ClusterConfig, error) {
	switch {
	case c.NodeID == 0:
		return server.ClusterConfig{}, errors.New("--node-id is required (or --dev)")
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
	b, err := server.OpenBackup(c.Restore.From)
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
