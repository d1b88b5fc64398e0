package rpc

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics of the API layer (the calls it serves and forwards),
// registered with Prometheus's default registry; the routing core's are
// in package router.
var metrics = struct {
	rpcDuration  *prometheus.HistogramVec
	rpcOutcomes  *prometheus.CounterVec
	batchOps     prometheus.Histogram
	forwards     prometheus.Counter
	waitDuration prometheus.Histogram
	quotaDrift   *prometheus.GaugeVec
}{
	rpcDuration: promauto.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "warden_rpc_duration_seconds",
		Help:    "Latency of Warden RPCs, in seconds, by method and outcome (the labels of warden_rpc_outcomes_total).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"method", "outcome"}),
	rpcOutcomes: promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "warden_rpc_outcomes_total",
		Help: "Warden RPCs by method and outcome (ok, conflict, timeout, stale, invalid, exhausted, unknown, unavailable, canceled, error).",
	}, []string{"method", "outcome"}),
	batchOps: promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "warden_batch_command_ops",
		Help:    "Ops in each BatchCmd (one Raft entry) this node proposed for a Batch call.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 11),
	}),
	forwards: promauto.NewCounter(prometheus.CounterOpts{
		Name: "warden_forwarded_requests_total",
		Help: "Client RPCs this node forwarded to the node hosting the shard's leader.",
	}),
	waitDuration: promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "warden_lock_wait_seconds",
		Help:    "Time a queued Acquire waited until its grant, in seconds.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
	}),
	// By pool (a key's root segment), not by key: one series per key
	// would grow without bound with the tenants and projects under a pool.
	quotaDrift: promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "warden_quota_drift",
		Help: "Observed minus committed usage at the pool's last ReportUsage (of any key under the pool).",
	}, []string{"pool"}),
}
