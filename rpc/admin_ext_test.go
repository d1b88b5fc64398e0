package rpc_test

import (
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/server"
)

func TestHotResources(t *testing.T) {
	c := startCluster(t, server.DevConfig{})
	admin := wardenv1connect.NewAdminServiceClient(c.srv.Client(), c.srv.URL)
	c.mustAcquire("hot", "h", 30*time.Second)
	c.mustAcquire("warm", "w", 30*time.Second)
	queue := func(res string, n int) {
		for i := range n {
			go func() { _, _ = c.acquireWait(ctx(t), res, fmt.Sprintf("%s-%d", res, i), time.Second, 5*time.Second) }()
		}
	}
	queue("hot", 3)
	queue("warm", 1)
	waitFor(t, func() bool { return c.describe("hot").GetWaiters() == 3 && c.describe("warm").GetWaiters() == 1 })
	resp, err := admin.HotResources(ctx(t), connect.NewRequest(&wardenv1.HotResourcesRequest{Limit: 5}))
	if err != nil {
		t.Fatal(err)
	}
	w := resp.Msg.GetByWaiters()
	if len(w) != 2 || w[0].GetResource() != "hot" || w[0].GetWaiters() != 3 || w[1].GetResource() != "warm" {
		t.Fatalf("by waiters: %v", w)
	}
	r := resp.Msg.GetByAcquireRate()
	if len(r) != 2 || r[0].GetResource() != "hot" || r[0].GetAcquiresPerSecond() <= r[1].GetAcquiresPerSecond() {
		t.Fatalf("by acquire rate: %v", r)
	}
	_, err = admin.HotResources(ctx(t), connect.NewRequest(&wardenv1.HotResourcesRequest{Limit: 101}))
	wantCode(t, err, connect.CodeInvalidArgument)
}
