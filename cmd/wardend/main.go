// Command wardend is the Warden server.
//
//	wardend --dev --data-dir ./data/dev --listen 127.0.0.1:7070
//
// runs a whole cluster in one process: three Raft nodes on loopback in
// zones az1..az3, each with a replica of the data shard, serving the
// Connect API, grpc.health.v1, reflection and /metrics on --listen.
// SIGTERM or SIGINT shuts it down gracefully; a second start on the same
// --data-dir recovers the state.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alecthomas/kong"

	"github.com/warden-dev/warden/placement"
	"github.com/warden-dev/warden/router"
)

type cli struct {
	Dev          bool          `help:"Run a whole three-node cluster in this process (the embedded default)."`
	DataDir      string        `default:"./data/dev" help:"Directory for Raft logs and state."`
	Listen       string        `default:"127.0.0.1:7070" help:"Address to serve the Connect API on."`
	LogLevel     slog.Level    `default:"info" help:"Log level: debug, info, warn, error."`
	RaftLogLevel slog.Level    `default:"error" help:"Level below which Dragonboat's own logs are dropped (warn shows its election chatter)."`
	ShutdownWait time.Duration `default:"10s" help:"How long a graceful shutdown waits for RPCs in flight."`
	AuditLog     string        `help:"Write the audit log (one JSON line per Acquire, Renew, Release) to this file, or - for stderr."`
}

func main() {
	var c cli
	kong.Parse(&c, kong.Description("Warden: exclusive locks with leases and fencing tokens, replicated by Raft."))
	slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: c.LogLevel})))
	if err := run(c); err != nil {
		slog.Error("wardend stopped", "err", err)
		os.Exit(1)
	}
}

func run(c cli) error {
	if !c.Dev {
		return errors.New("only --dev is supported in this version; multi-process clusters arrive with sharding")
	}
	placement.RouteRaftLogs(c.RaftLogLevel)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	audit, closeAudit, err := openAudit(c.AuditLog)
	if err != nil {
		return err
	}
	defer closeAudit()
	dev, err := router.StartDev(router.DevConfig{DataDir: c.DataDir, Router: router.Config{Audit: audit}})
	if err != nil {
		return err
	}
	defer dev.Close()

	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := router.NewServer(c.Listen, router.NewHandler(dev.Router))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	slog.Info("wardend serving", "listen", ln.Addr().String(), "data_dir", c.DataDir, "mode", "dev", "members", dev.Members())

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
