package placement

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/lni/dragonboat/v4/logger"
)

// RouteRaftLogs sends Dragonboat's logs to slog, dropping records below
// min (slog.LevelWarn keeps Raft quiet in normal operation). Call it once,
// before the first node starts.
func RouteRaftLogs(min slog.Level) {
	logger.SetLoggerFactory(func(pkg string) logger.ILogger {
		return &raftLogger{pkg: pkg, min: min}
	})
}

type raftLogger struct {
	pkg string
	min slog.Level
}

func (l *raftLogger) log(level slog.Level, format string, args []any) {
	if level < l.min {
		return
	}
	slog.Default().Log(context.Background(), level, fmt.Sprintf(format, args...), "component", "raft/"+l.pkg)
}

func (l *raftLogger) SetLevel(logger.LogLevel)            {}
func (l *raftLogger) Debugf(format string, args ...any)   { l.log(slog.LevelDebug, format, args) }
func (l *raftLogger) Infof(format string, args ...any)    { l.log(slog.LevelInfo, format, args) }
func (l *raftLogger) Warningf(format string, args ...any) { l.log(slog.LevelWarn, format, args) }
func (l *raftLogger) Errorf(format string, args ...any)   { l.log(slog.LevelError, format, args) }
func (l *raftLogger) Panicf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	slog.Error(msg, "component", "raft/"+l.pkg)
	panic(msg)
}
