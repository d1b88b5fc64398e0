package shard

import (
	"fmt"
	"time"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// The shard's replicated config and its fencing-token epoch.

// DefaultConfig is the shard config a new shard starts with.
func DefaultConfig() *shardv1.ShardConfig {
	return &shardv1.ShardConfig{
		MaxClockSkewNanos:          int64(500 * time.Millisecond),
		MinLeaseTtlNanos:           int64(time.Second),
		MaxLeaseTtlNanos:           int64(10 * time.Minute),
		DefaultLeaseTtlNanos:       int64(30 * time.Second),
		DefaultReservationTtlNanos: int64(5 * time.Minute),
		MaxReservationTtlNanos:     int64(time.Hour),
		FairnessThresholdPercent:   80,
		LedgerRetentionNanos:       int64(7 * 24 * time.Hour),
		DedupWindowNanos:           int64(10 * time.Minute),
		MaxWaitTimeoutNanos:        int64(5 * time.Minute),
		MaxWaitersPerResource:      1_000,
		MaxWaitersPerTenant:        10_000,
	}
}

func (a *applier) setConfig(c *shardv1.SetConfigCmd) *shardv1.Result {
	cfg := cloneConfig(a.cfg())
	set := func(dst *int64, v *int64) {
		if v != nil {
			*dst = *v
		}
	}
	set(&cfg.MaxClockSkewNanos, c.MaxClockSkewNanos)
	set(&cfg.MinLeaseTtlNanos, c.MinLeaseTtlNanos)
	set(&cfg.MaxLeaseTtlNanos, c.MaxLeaseTtlNanos)
	set(&cfg.DefaultLeaseTtlNanos, c.DefaultLeaseTtlNanos)
	set(&cfg.DedupWindowNanos, c.DedupWindowNanos)
	set(&cfg.MaxWaitTimeoutNanos, c.MaxWaitTimeoutNanos)
	set(&cfg.DefaultReservationTtlNanos, c.DefaultReservationTtlNanos)
	set(&cfg.MaxReservationTtlNanos, c.MaxReservationTtlNanos)
	set(&cfg.LedgerRetentionNanos, c.LedgerRetentionNanos)
	if c.FairnessThresholdPercent != nil {
		cfg.FairnessThresholdPercent = *c.FairnessThresholdPercent
	}
	if c.MaxWaitersPerResource != nil {
		cfg.MaxWaitersPerResource = *c.MaxWaitersPerResource
	}
	if c.MaxWaitersPerTenant != nil {
		cfg.MaxWaitersPerTenant = *c.MaxWaitersPerTenant
	}
	if err := CheckConfig(cfg); err != nil {
		return invalidErr(err)
	}
	if old := a.cfg().GetMaxClockSkewNanos(); a.version >= VersionSkewRaiseOnly && cfg.GetMaxClockSkewNanos() < old {
		return invalid("max_clock_skew", fmt.Sprintf("can only be raised (it is %v): shard time that leaders stamped under it may lead real time by up to half of it, and a lower bound would let leases be granted early", time.Duration(old)))
	}
	a.dirtyMeta()
	a.meta.Config = cfg
	return &shardv1.Result{Code: shardv1.Code_CODE_OK, Config: cfg}
}

// CheckConfig validates a shard config and returns a *FieldError naming
// the first bad field, or nil.
func CheckConfig(c *shardv1.ShardConfig) error {
	switch {
	case c.GetMaxClockSkewNanos() < 0 || c.GetMaxClockSkewNanos() > maxClockSkewBound:
		return &FieldError{"max_clock_skew", fmt.Sprintf("must be within [0, %v]", time.Duration(maxClockSkewBound))}
	case c.GetMinLeaseTtlNanos() < int64(time.Millisecond):
		return &FieldError{"min_lease_ttl", "must be at least 1ms"}
	case c.GetMaxLeaseTtlNanos() < c.GetMinLeaseTtlNanos() || c.GetMaxLeaseTtlNanos() > maxDurationBound:
		return &FieldError{"max_lease_ttl", fmt.Sprintf("must be within [min_lease_ttl, %v]", time.Duration(maxDurationBound))}
	case c.GetDefaultLeaseTtlNanos() < c.GetMinLeaseTtlNanos() || c.GetDefaultLeaseTtlNanos() > c.GetMaxLeaseTtlNanos():
		return &FieldError{"default_lease_ttl", "must be within [min_lease_ttl, max_lease_ttl]"}
	case c.GetDedupWindowNanos() < 0 || c.GetDedupWindowNanos() > maxDurationBound:
		return &FieldError{"dedup_window", fmt.Sprintf("must be within [0, %v]", time.Duration(maxDurationBound))}
	case c.GetMaxWaitTimeoutNanos() < int64(time.Millisecond) || c.GetMaxWaitTimeoutNanos() > maxDurationBound:
		return &FieldError{"max_wait_timeout", fmt.Sprintf("must be within [1ms, %v]", time.Duration(maxDurationBound))}
	case c.GetMaxReservationTtlNanos() < c.GetMinLeaseTtlNanos() || c.GetMaxReservationTtlNanos() > maxDurationBound:
		return &FieldError{"max_reservation_ttl", fmt.Sprintf("must be within [min_lease_ttl, %v]", time.Duration(maxDurationBound))}
	case c.GetDefaultReservationTtlNanos() < c.GetMinLeaseTtlNanos() || c.GetDefaultReservationTtlNanos() > c.GetMaxReservationTtlNanos():
		return &FieldError{"default_reservation_ttl", "must be within [min_lease_ttl, max_reservation_ttl]"}
	case c.GetLedgerRetentionNanos() != 0 && (c.GetLedgerRetentionNanos() < int64(time.Hour) || c.GetLedgerRetentionNanos() > 10*365*int64(24*time.Hour)):
		return &FieldError{"ledger_retention", "must be 0 (forever) or within [1h, 3650 days]"}
	case c.GetFairnessThresholdPercent() < 1 || c.GetFairnessThresholdPercent() > 100:
		return &FieldError{"fairness_threshold_percent", "must be within [1, 100]"}
	}
	return nil
}

// newEpoch moves an active shard to a fresh, larger epoch, its revision
// starting again at 0 (NewEpochCmd). The shard's current epoch again is a
// replay: resetting the revision within an epoch would repeat tokens.
func (a *applier) newEpoch(c *shardv1.NewEpochCmd) *shardv1.Result {
	switch {
	case a.meta.GetInactive():
		return failed("the shard is not active")
	case c.GetEpoch() == a.meta.GetEpoch():
		return &shardv1.Result{Code: shardv1.Code_CODE_OK, Replayed: true}
	case c.GetEpoch() < a.meta.GetEpoch() || c.GetEpoch() > MaxEpoch:
		return invalid("epoch", fmt.Sprintf("%d is not in (%d, %d]", c.GetEpoch(), a.meta.GetEpoch(), MaxEpoch))
	}
	a.dirtyMeta()
	a.meta.Epoch, a.meta.Revision = c.GetEpoch(), 0
	return &shardv1.Result{Code: shardv1.Code_CODE_OK}
}

func (a *applier) bumpRevision() {
	a.dirtyMeta()
	a.meta.Revision++
}

// maxClockSkewBound caps max_clock_skew: a larger bound would make a dead
// holder's lock wait longer than any sane lease.
const maxClockSkewBound = int64(time.Minute)

// maxDurationBound caps the config's lease TTL, wait and dedup durations
// (7 days), so that shard time plus any of them stays far from int64
// overflow (year 2262) and a lease can never expire "before" it began.
const maxDurationBound = int64(7 * 24 * time.Hour)
