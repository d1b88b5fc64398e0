package router

import (
	"errors"
	"testing"
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
