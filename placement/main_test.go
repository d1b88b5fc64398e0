package placement

import (
	"log/slog"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	RouteRaftLogs(slog.LevelError + 4) // stopped leaders make the transport complain
	goleak.VerifyTestMain(m)
}
