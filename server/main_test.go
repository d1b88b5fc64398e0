package server

import (
	"log/slog"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/warden-dev/warden/placement"
)

func TestMain(m *testing.M) {
	placement.RouteRaftLogs(slog.LevelError + 4) // stopped nodes make the transport complain
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	goleak.VerifyTestMain(m)
}
