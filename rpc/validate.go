package rpc

import (
	"encoding/hex"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/shard"
)

// validateAcquire checks what can be checked without the shard's config
// (the lease TTL's bounds are the shard's to check). It returns a
// *shard.FieldError naming the field, or nil.
func validateAcquire(m *wardenv1.AcquireRequest) error {
	if err := shard.CheckName("resource", m.GetResource(), shard.MaxResourceBytes); err != nil {
		return err
	}
	if err := shard.CheckName("request_id", m.GetRequestId(), shard.MaxRequestIDBytes); err != nil {
		return err
	}
	if err := shard.CheckText("holder", m.GetHolder(), shard.MaxHolderBytes); err != nil {
		return err
	}
	if err := shard.CheckText("tenant", m.GetTenant(), shard.MaxTenantBytes); err != nil {
		return err
	}
	// An explicit zero is a mistake, not a request for the default (which
	// is asked for by leaving lease_ttl unset).
	if ttl, err := duration("lease_ttl", m.GetLeaseTtl(), 0); err != nil {
		return err
	} else if m.GetLeaseTtl() != nil && ttl == 0 {
		return &shard.FieldError{Field: "lease_ttl", Reason: "must be positive; leave it unset for the shard's default"}
	}
	// The bound of wait_timeout is the shard's (max_wait_timeout).
	_, err := duration("wait_timeout", m.GetWaitTimeout(), 0)
	return err
}

// duration converts an optional Duration field: unset is 0; negative,
// malformed or (when max > 0) larger than max is refused.
func duration(field string, d *durationpb.Duration, max time.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, &shard.FieldError{Field: field, Reason: "is not a valid duration"}
	}
	v := d.AsDuration()
	switch {
	case v < 0:
		return 0, &shard.FieldError{Field: field, Reason: "must not be negative"}
	case max > 0 && v > max:
		return 0, &shard.FieldError{Field: field, Reason: "must be at most " + max.String()}
	}
	return v, nil
}

// leaseRef checks a Renew or Release request and decodes its lease id.
func leaseRef(resource, leaseID string) ([]byte, error) {
	if err := validateResource(resource); err != nil {
		return nil, err
	}
	id, err := hex.DecodeString(leaseID)
	if err != nil || len(id) != shard.LeaseIDBytes {
		return nil, &shard.FieldError{Field: "lease_id", Reason: "must be the 32 hex characters Acquire returned"}
	}
	return id, nil
}

func validateResource(resource string) error {
	return shard.CheckName("resource", resource, shard.MaxResourceBytes)
}

// The floors and ceilings of the safety-relevant shard settings, which no
// SetShardConfig may pass (whoever calls it). Below them the rules of
// docs/DESIGN.md §1 still hold in the state machine, but what they
// promise a client does not: a skew bound under real clocks' drift lets
// a lock be regranted while its holder's clock says it is still valid,
// a short dedup window lets a retried request_id take a second lease, a
// lease of milliseconds expires before its holder hears of it, and a
// waiter limit in the billions lets one caller fill a shard's memory.
const (
	minClockSkewFloor   = 100 * time.Millisecond
	dedupWindowFloor    = time.Minute
	minLeaseTTLFloor    = time.Second
	maxWaitersCeiling   = 100_000
	maxWaitTimeoutFloor = time.Second
)

// validateShardConfig checks a SetShardConfig's settings against the
// safety floors and ceilings; the shard checks the rest (their order,
// its own bounds). It returns a *shard.FieldError naming the field and
// the bound, or nil.
func validateShardConfig(m *wardenv1.SetShardConfigRequest) error {
	floors := []struct {
		field string
		d     *durationpb.Duration
		floor time.Duration
	}{
		{"max_clock_skew", m.GetMaxClockSkew(), minClockSkewFloor},
		{"min_lease_ttl", m.GetMinLeaseTtl(), minLeaseTTLFloor},
		{"max_lease_ttl", m.GetMaxLeaseTtl(), minLeaseTTLFloor},
		{"default_lease_ttl", m.GetDefaultLeaseTtl(), minLeaseTTLFloor},
		{"dedup_window", m.GetDedupWindow(), dedupWindowFloor},
		{"max_wait_timeout", m.GetMaxWaitTimeout(), maxWaitTimeoutFloor},
	}
	for _, f := range floors {
		v, err := duration(f.field, f.d, 0)
		if err != nil {
			return err
		}
		if f.d != nil && v < f.floor {
			return &shard.FieldError{Field: f.field, Reason: "must be at least " + f.floor.String() + " (a safety floor)"}
		}
	}
	ceilings := []struct {
		field string
		v     *uint32
	}{{"max_waiters_per_resource", m.MaxWaitersPerResource}, {"max_waiters_per_tenant", m.MaxWaitersPerTenant}}
	for _, c := range ceilings {
		if c.v != nil && *c.v > maxWaitersCeiling {
			return &shard.FieldError{Field: c.field, Reason: fmt.Sprintf("must be at most %d (a safety ceiling)", maxWaitersCeiling)}
		}
	}
	return nil
}
