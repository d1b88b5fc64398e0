package rpc

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/shard"
)

// FuzzValidate checks request validation on arbitrary input: it never
// panics, every refusal names a field, and what it accepts meets the
// input rules.
func FuzzValidate(f *testing.F) {
	f.Add("orders/42", "q1", "worker", "", int64(30), int32(0), int64(0), "00112233445566778899aabbccddeeff")
	f.Add("", "", "", "", int64(-1), int32(-1), int64(1<<40), "zz")
	f.Add("a\x00b", "q\n", "\xff", "t", int64(1), int32(1e9), int64(0), "")
	f.Fuzz(func(t *testing.T, resource, requestID, holder, tenant string, ttlSec int64, ttlNanos int32, waitSec int64, leaseID string) {
		m := &wardenv1.AcquireRequest{
			Resource: resource, RequestId: requestID, Holder: holder, Tenant: tenant,
			LeaseTtl:    &durationpb.Duration{Seconds: ttlSec, Nanos: ttlNanos},
			WaitTimeout: &durationpb.Duration{Seconds: waitSec},
		}
		if err := validateAcquire(m); err != nil {
			var fe *shard.FieldError
			if !errors.As(err, &fe) || fe.Field == "" {
				t.Fatalf("refusal %v names no field", err)
			}
		} else {
			for _, s := range []string{resource, requestID} {
				if s == "" || !utf8.ValidString(s) {
					t.Fatalf("accepted %q", s)
				}
			}
			if len(resource) > shard.MaxResourceBytes || len(requestID) > shard.MaxRequestIDBytes || len(holder) > shard.MaxHolderBytes {
				t.Fatal("accepted an oversized field")
			}
			if m.GetLeaseTtl().AsDuration() < 0 || m.GetWaitTimeout().AsDuration() < 0 {
				t.Fatal("accepted a bad duration")
			}
		}
		id, err := leaseRef(resource, leaseID)
		if err == nil && len(id) != shard.LeaseIDBytes {
			t.Fatalf("accepted lease id %q", leaseID)
		}
	})
}

// The safety floors and ceilings of SetShardConfig: each setting an
// attack tried (a zero skew bound, a zero dedup window, a 1 ms minimum
// lease, billions of waiters) is refused naming the field and the bound;
// the defaults and values at the bounds pass.
func TestShardConfigSafetyBounds(t *testing.T) {
	d := durationpb.New
	u := func(v uint32) *uint32 { return &v }
	for _, tc := range []struct {
		m     *wardenv1.SetShardConfigRequest
		field string // "" for accepted
	}{
		{&wardenv1.SetShardConfigRequest{MaxClockSkew: d(0)}, "max_clock_skew"},
		{&wardenv1.SetShardConfigRequest{MaxClockSkew: d(99 * time.Millisecond)}, "max_clock_skew"},
		{&wardenv1.SetShardConfigRequest{DedupWindow: d(0)}, "dedup_window"},
		{&wardenv1.SetShardConfigRequest{MinLeaseTtl: d(time.Millisecond)}, "min_lease_ttl"},
		{&wardenv1.SetShardConfigRequest{DefaultLeaseTtl: d(10 * time.Millisecond)}, "default_lease_ttl"},
		{&wardenv1.SetShardConfigRequest{MaxLeaseTtl: d(time.Millisecond)}, "max_lease_ttl"},
		{&wardenv1.SetShardConfigRequest{MaxWaitTimeout: d(time.Millisecond)}, "max_wait_timeout"},
		{&wardenv1.SetShardConfigRequest{MaxWaitersPerResource: u(4_000_000_000)}, "max_waiters_per_resource"},
		{&wardenv1.SetShardConfigRequest{MaxWaitersPerTenant: u(100_001)}, "max_waiters_per_tenant"},
		{&wardenv1.SetShardConfigRequest{DedupWindow: d(-time.Minute)}, "dedup_window"},
		{&wardenv1.SetShardConfigRequest{}, ""},
		{&wardenv1.SetShardConfigRequest{MaxClockSkew: d(100 * time.Millisecond), DedupWindow: d(time.Minute), MinLeaseTtl: d(time.Second),
			MaxWaitersPerResource: u(100_000), MaxWaitersPerTenant: u(0), MaxWaitTimeout: d(time.Second)}, ""},
	} {
		err := validateShardConfig(tc.m)
		var fe *shard.FieldError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%v: refused: %v", tc.m, err)
		case tc.field != "" && (!errors.As(err, &fe) || fe.Field != tc.field):
			t.Errorf("%v: %v, want a refusal naming %s", tc.m, err, tc.field)
		case tc.field != "" && !strings.Contains(err.Error(), "safety") && !strings.Contains(err.Error(), "negative"):
			t.Errorf("%v: %v does not name the bound", tc.m, err)
		}
	}
}
