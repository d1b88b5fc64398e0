package rpc_test

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/server"
	"github.com/warden-dev/warden/shard"
)

// renewBatch sends one RenewBatch of (resource, lease id) pairs.
func (c *cluster) renewBatch(pairs ...string) ([]*wardenv1.RenewOutcome, error) {
	req := &wardenv1.RenewBatchRequest{}
	for i := 0; i+1 < len(pairs); i += 2 {
		req.Renewals = append(req.Renewals, &wardenv1.RenewRequest{Resource: pairs[i], LeaseId: pairs[i+1]})
	}
	resp, err := c.locks.RenewBatch(ctx(c.t), connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	if len(resp.Msg.GetOutcomes()) != len(req.Renewals) {
		c.t.Fatalf("%d outcomes for %d renewals", len(resp.Msg.GetOutcomes()), len(req.Renewals))
	}
	return resp.Msg.GetOutcomes(), nil
}

func TestRenewBatch(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	a := c.mustAcquire("batch/a", "ra", 10*time.Second)
	b := c.mustAcquire("batch/b", "rb", 10*time.Second)
	gone := c.mustAcquire("batch/gone", "rg", 10*time.Second)
	if ok, err := c.release("batch/gone", gone.GetLeaseId()); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	time.Sleep(20 * time.Millisecond) // so a renewal moves the expiry
	out, err := c.renewBatch(
		"batch/a", a.GetLeaseId(),
		"batch/b", a.GetLeaseId(), // a's lease does not renew b (rule 3)
		"batch/gone", gone.GetLeaseId(),
		"batch/b", "not-hex",
		"", b.GetLeaseId(),
		"batch/b", b.GetLeaseId(),
	)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ code, field string }{
		{"", ""},
		{"failed_precondition", ""},
		{"failed_precondition", ""},
		{"invalid_argument", "lease_id: "},
		{"invalid_argument", "resource: "},
		{"", ""},
	}
	for i, w := range want {
		o := out[i]
		// A bad field is named as Renew names it, not with the renewal's
		// index: the outcome's place says which renewal it is.
		if o.GetCode() != w.code || !strings.HasPrefix(o.GetMessage(), w.field) {
			t.Errorf("renewal %d: %q %q, want code %q starting %q", i, o.GetCode(), o.GetMessage(), w.code, w.field)
		}
		if w.code == "" && !o.GetExpiresAt().AsTime().After(a.GetExpiresAt().AsTime()) {
			t.Errorf("renewal %d: expires at %v, not after the grant's %v", i, o.GetExpiresAt().AsTime(), a.GetExpiresAt().AsTime())
		}
	}
	// The renewals committed: Describe shows the new expiries.
	for i, r := range map[int]string{0: "batch/a", 5: "batch/b"} {
		if d := c.describe(r); !d.GetHeld() || !d.GetExpiresAt().AsTime().Equal(out[i].GetExpiresAt().AsTime()) {
			t.Errorf("%s: %v, want expiry %v", r, d, out[i].GetExpiresAt().AsTime())
		}
	}

	_, err = c.renewBatch()
	wantCode(t, err, connect.CodeInvalidArgument)
	many := make([]string, 0, 2*(shard.MaxRenewBatch+1))
	for range shard.MaxRenewBatch + 1 {
		many = append(many, "batch/a", a.GetLeaseId())
	}
	_, err = c.renewBatch(many...)
	wantCode(t, err, connect.CodeInvalidArgument)
	if err != nil && !strings.Contains(err.Error(), "renewals") {
		t.Errorf("oversized batch: %v, want the field named", err)
	}
}
