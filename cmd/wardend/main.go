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
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // served only with --pprof-addr
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kong"

	"github.com/warden-dev/warden/placement"
	"github.com/warden-dev/warden/router"
)

type cli struct {
	Dev            bool          `help:"Run a whole three-node cluster in this process (the embedded setup make run uses). Without it, run one production node (--node-id and the flags below)."`
	NodeID         uint64        `name:"node-id" placeholder:"ID" help:"This node's id (production mode), unique in the cluster, never reused."`
	Zone           string        `help:"This node's availability zone; a shard's replicas go to distinct zones."`
	RaftAddr       string        `name:"raft-addr" help:"host:port of this node's Raft transport."`
	InitialMembers string        `name:"initial-members" help:"The cluster's first nodes, id=raftaddr=listenaddr,... (the same list on each of them)."`
	Join           []string      `help:"Connect addresses of running nodes, for a node that is not an initial member."`
	InitialState   string        `name:"initial-cluster-state" enum:"new,existing" default:"existing" help:"new: this initial member may initialise an empty --data-dir, as every initial member of a cluster being created does on its first start (only then). existing (the default): a node whose data directory holds no state refuses to start, since a member that lost its data must never vote again under its id."`
	SecretFile     string        `name:"cluster-secret-file" placeholder:"PATH" help:"File holding the cluster secret, the same on every node: the node-to-node API requires it (recommended; without it that API is open to anyone who reaches --listen)."`
	ClockOffset    time.Duration `name:"debug-clock-offset" hidden:"" help:"Pretend this node's wall clock is off by this much (clock skew tests only)."`
	DataDir        string        `default:"./data/dev" help:"Directory for Raft logs and state."`
	Listen         string        `default:"127.0.0.1:7070" help:"Address to serve the Connect API on."`
	LogLevel       slog.Level    `default:"info" help:"Log level: debug, info, warn, error."`
	RaftLogLevel   slog.Level    `default:"error" help:"Level below which Dragonboat's own logs are dropped (warn shows its election chatter)."`
	ShutdownWait   time.Duration `default:"10s" help:"How long a graceful shutdown waits for RPCs in flight."`
	AuditLog       string        `help:"Write the audit log (one JSON line per Acquire, Renew, Release) to this file, or - for stderr."`
	PprofAddr      string        `name:"pprof-addr" placeholder:"HOST:PORT" help:"Serve Go's profiler (/debug/pprof/) on this address, for performance work; keep it on loopback. Off by default."`
}

func main() {
	var c cli
	k := kong.Parse(&c, kong.Description("Warden: exclusive locks with leases and fencing tokens, replicated by Raft."))
	if !c.Dev {
		_, err := c.clusterConfig()
		k.FatalIfErrorf(err) // a usage error, before anything starts
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

	audit, closeAudit, err := openAudit(c.AuditLog)
	if err != nil {
		return err
	}
	defer closeAudit()
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	var cluster *router.Cluster
	mode := "dev"
	if c.Dev {
		cluster, err = router.StartDev(router.DevConfig{DataDir: c.DataDir, ListenAddr: c.Listen, Router: router.Config{Audit: audit}})
	} else {
		mode = "node"
		var cfg router.ClusterConfig
		if cfg, err = c.clusterConfig(); err != nil {
			return err
		}
		cfg.Router.Audit = audit
		cfg.Router.ClockOffset = c.ClockOffset
		cluster, err = router.StartCluster(cfg)
	}
	if err != nil {
		return err
	}
	defer cluster.Close()

	if c.PprofAddr != "" {
		pl, err := net.Listen("tcp", c.PprofAddr)
		if err != nil {
			return fmt.Errorf("pprof-addr: %w", err)
		}
		defer pl.Close()
		// net/http/pprof registers its handlers on the default mux.
		go func() { _ = http.Serve(pl, http.DefaultServeMux) }()
	}
	srv := router.NewServer(c.Listen, router.NewHandler(cluster.Router))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	slog.Info("wardend serving", "listen", ln.Addr().String(), "data_dir", c.DataDir, "mode", mode, "members", cluster.Members())

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	slog.Info("wardend shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), c.ShutdownWait)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// clusterConfig builds a production node's config from the flags.
func (c cli) clusterConfig() (router.ClusterConfig, error) {
	switch {
	case c.NodeID == 0:
		return router.ClusterConfig{}, errors.New("--node-id is required (or --dev)")
	case c.Zone == "":
		return router.ClusterConfig{}, errors.New("--zone is required")
	case c.RaftAddr == "":
		return router.ClusterConfig{}, errors.New("--raft-addr is required")
	case c.InitialMembers == "" && len(c.Join) == 0:
		return router.ClusterConfig{}, errors.New("--initial-members or --join is required")
	}
	members, err := parseMembers(c.InitialMembers)
	if err != nil {
		return router.ClusterConfig{}, err
	}
	if c.InitialState == "new" && !slices.ContainsFunc(members, func(m router.Member) bool { return m.ID == c.NodeID }) {
		return router.ClusterConfig{}, fmt.Errorf("--initial-cluster-state new: node %d is not in --initial-members; a node that joins a running cluster starts with --join alone", c.NodeID)
	}
	cfg := router.ClusterConfig{
		Nodes:      []router.NodeSpec{{ID: c.NodeID, Zone: c.Zone, RaftAddr: c.RaftAddr, DataDir: c.DataDir}},
		ListenAddr: c.Listen,
		Members:    members,
		Join:       c.Join,
		NewCluster: c.InitialState == "new",
	}
	if c.SecretFile != "" {
		b, err := os.ReadFile(c.SecretFile)
		if err != nil {
			return router.ClusterConfig{}, fmt.Errorf("--cluster-secret-file: %w", err)
		}
		if cfg.Router.ClusterSecret = strings.TrimSpace(string(b)); len(cfg.Router.ClusterSecret) < 16 {
			return router.ClusterConfig{}, fmt.Errorf("--cluster-secret-file: the secret must be at least 16 characters")
		}
	}
	return cfg, nil
}

// parseMembers parses --initial-members: id=raftaddr=listenaddr,...
func parseMembers(v string) ([]router.Member, error) {
	var out []router.Member
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
		if slices.ContainsFunc(out, func(m router.Member) bool { return m.ID == id }) {
			return nil, fmt.Errorf("--initial-members: node %d is listed twice", id)
		}
		out = append(out, router.Member{ID: id, RaftAddr: parts[1], ListenAddr: parts[2]})
	}
	return out, nil
}

// openAudit opens the audit log: nil when path is empty, stderr for "-",
// else the file, appended to.
func openAudit(path string) (*slog.Logger, func(), error) {
	switch path {
	case "":
		return nil, func() {}, nil
	case "-":
		return slog.New(slog.NewJSONHandler(os.Stderr, nil)), func() {}, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o640)
	if err != nil {
		return nil, nil, fmt.Errorf("audit log: %w", err)
	}
	return slog.New(slog.NewJSONHandler(f, nil)), func() { f.Close() }, nil
}
