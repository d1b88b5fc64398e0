package placement

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/lni/dragonboat/v4/logger"
)

// RouteRaftLogs sends Dragonboat's logs to slog, dropping records below
// min (slog.LevelWarn keeps Raft quiet in normal operation) and limiting
// each kind of message to one per raftLogEvery (see logLimiter). Call it
// once, before the first node starts.
func RouteRaftLogs(min slog.Level) {
	lim := newLogLimiter(raftLogEvery, time.Now)
	logger.SetLoggerFactory(func(pkg string) logger.ILogger {
		return &raftLogger{pkg: pkg, min: min, lim: lim}
	})
}

// raftLogEvery is how often one kind of Dragonboat message is logged at
// most: a peer that is down made each survivor's transport log an ERROR
// for every connection attempt and every failed batch, several a second.
const raftLogEvery = 30 * time.Second

type raftLogger struct {
	pkg string
	min slog.Level
	lim *logLimiter
}

func (l *raftLogger) log(level slog.Level, format string, args []any) {
	if level < l.min {
		return
	}
	pass, suppressed := l.lim.allow(l.pkg + "\x00" + format)
	if !pass {
		return
	}
	attrs := []any{"component", "raft/" + l.pkg}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed_since_last", suppressed)
	}
	slog.Default().Log(context.Background(), level, fmt.Sprintf(format, args...), attrs...)
}

// logLimiter lets one record of each kind (Dragonboat's format string:
// a fixed, small set) through per interval, and counts the rest, so the
// next one that passes says how many were dropped. The first of a kind
// always passes.
type logLimiter struct {
	every time.Duration
	now   func() time.Time
	mu    sync.Mutex
	kinds map[string]*logKind
}

type logKind struct {
	last       time.Time
	suppressed int
}

func newLogLimiter(every time.Duration, now func() time.Time) *logLimiter {
	return &logLimiter{every: every, now: now, kinds: map[string]*logKind{}}
}

// allow reports whether a record of kind may be logged now, and how many
// of its kind were dropped since the last that was.
func (l *logLimiter) allow(kind string) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	k := l.kinds[kind]
	if k == nil {
		l.kinds[kind] = &logKind{last: now}
		return true, 0
	}
	if now.Sub(k.last) < l.every {
		k.suppressed++
		return false, 0
	}
	n := k.suppressed
	k.last, k.suppressed = now, 0
	return true, n
}

func (l *raftLogger) SetLevel(logger.LogLevel)            {}
func (l *raftLogger) Debugf(format string, args ...any)   { l.log(slog.LevelDebug, format, args) }
func (l *raftLogger) Infof(format string, args ...any)    { l.log(slog.LevelInfo, format, args) }
func (l *raftLogger) Warningf(format string, args ...any) { l.log(slog.LevelWarn, format, args) }
func (l *raftLogger) Errorf(format string, args ...any)   { l.log(slog.LevelError, format, args) }
func (l *raftLogger) Panicf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	ExitIfOutOfSpace(msg) // a write that found the disk full: one line, no stack trace
	slog.Error(msg, "component", "raft/"+l.pkg)
	panic(msg)
}
