package router

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/warden-dev/warden/placement"
)

// metrics of the router, registered with Prometheus's default registry.
var metrics = struct {
	proposal prometheus.Histogram
	// proposalsFailed counts failed proposals by outcome label.
	proposalsFailed *prometheus.CounterVec
	snapshots       *prometheus.HistogramVec
	storage         *prometheus.HistogramVec
	fsync           prometheus.Histogram
	leaderChanges   prometheus.Counter
	expirations     prometheus.Counter
	activeLocks     *prometheus.GaugeVec
	waiters         *prometheus.GaugeVec
	moveRetries     prometheus.Counter
	splitFence      prometheus.Histogram
	clockOffset     *prometheus.GaugeVec
	reclaimLag      prometheus.Gauge
}{
	reclaimLag: promauto.NewGauge(prometheus.GaugeOpts{
		Name: "warden_quota_reclaim_lag_seconds",
		Help: "How long past its ttl the oldest expired reservation waited for the reclaimer, at the leader's last pass (0 when none was waiting).",
	}),

	clockOffset: promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warden_clock_offset_seconds",
		Help: "Another node's wall clock minus this node's, in seconds, as last measured (NTP-style, within half a round trip).",
	}, []string{"peer"}),
	moveRetries: promauto.NewCounter(prometheus.CounterOpts{
		Name: "warden_move_retries_total",
		Help: "Proposals retried because the key's range was moving or the router's placement map was stale.",
	}),
	splitFence: promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "warden_split_fence_seconds",
		Help:    "How long a split kept its moving range fenced (writes answering unavailable), from the fence to the map commit, in seconds.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 12),
	}),
	proposalsFailed: promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "warden_proposals_failed_total",
		Help: "Proposals to a local leader that failed, by outcome (unavailable: dropped or no leader; unknown: the outcome was not learned; timeout, canceled, error).",
	}, []string{"outcome"}),
	snapshots: promauto.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "warden_snapshot_duration_seconds",
		Help:    "Time a data-shard replica took to write a snapshot for a replica that needs one (kind save: a new or lagging replica; Dragonboat's own snapshots of an on-disk state machine write none) or to load one (kind recover), in seconds.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
	}, []string{"kind"}),
	storage: promauto.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "warden_storage_duration_seconds",
		Help:    "Time a data-shard replica's database took for a flush of its memtable to a table (kind flush) or a compaction of tables (kind compaction), in seconds; a long one stalls the replica's applies.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
	}, []string{"kind"}),
	fsync: promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "warden_disk_fsync_duration_seconds",
		Help:    "Time a node took to write and fsync one 4 KiB block of a probe file in its data directory, once a second, in seconds: the disk's sync latency, which every Raft commit waits for (Dragonboat's write-ahead log is synced before each commit and cannot be timed itself).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
	}),
	proposal: promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "warden_proposal_duration_seconds",
		Help:    "Time from proposing a command to learning its committed result, in seconds.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}),
	leaderChanges: promauto.NewCounter(prometheus.CounterOpts{
		Name: "warden_raft_leader_changes_total",
		Help: "Terms in which a local replica became a shard leader.",
	}),
	expirations: promauto.NewCounter(prometheus.CounterOpts{
		Name: "warden_lease_expirations_total",
		Help: "Leases ended by the leader's expiry timer.",
	}),
	activeLocks: promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warden_active_locks",
		Help: "Locks held (including leases expired but not yet reaped), as the shard's leader last applied.",
	}, []string{"shard"}),
	waiters: promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warden_waiters",
		Help: "Acquire requests queued for a lock, as the shard's leader last applied.",
	}, []string{"shard"}),
}

// Every outcome a failed proposal can have is exported from the start,
// at 0, so that rates and alerts over them see a series before the first
// failure.
func init() {
	for _, o := range []string{"unavailable", "unknown", "timeout", "canceled", "error"} {
		metrics.proposalsFailed.WithLabelValues(o)
	}
	for _, k := range []string{"save", "recover"} {
		metrics.snapshots.WithLabelValues(k)
	}
	for _, k := range []string{"flush", "compaction"} {
		metrics.storage.WithLabelValues(k)
	}
}

// ObserveSnapshot records how long a data-shard replica took to write
// (kind "save") or load ("recover") a snapshot; the composition root
// passes it to each node (placement.NodeConfig.OnSnapshot).
func ObserveSnapshot(kind string, d time.Duration) {
	metrics.snapshots.WithLabelValues(kind).Observe(d.Seconds())
}

// ObserveStorage records how long a data-shard replica's database took
// to flush (kind "flush") or compact ("compaction"); the composition
// root passes it to each node (placement.NodeConfig.OnStorage).
func ObserveStorage(kind string, d time.Duration) {
	metrics.storage.WithLabelValues(kind).Observe(d.Seconds())
}

// ObserveFsync records how long a node's fsync probe took; the
// composition root passes it to each node (placement.NodeConfig.OnFsync).
func ObserveFsync(d time.Duration) { metrics.fsync.Observe(d.Seconds()) }

// proposalOutcome labels a failed proposal for proposalsFailed
// (unavailable: dropped or no leader; unknown: the outcome was not
// learned; timeout, canceled, error).
func proposalOutcome(err error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, ErrOutcomeUnknown):
		return "unknown"
	case errors.Is(err, ErrNoLeader), errors.Is(err, ErrDropped), errors.Is(err, ErrClockUnconfirmed), errors.As(err, new(*placement.DiskLowError)):
		return "unavailable"
	}
	return "error"
}
