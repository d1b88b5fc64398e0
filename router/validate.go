package router

import (
	"encoding/hex"
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
