package rpc

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-dev/warden/router"
)

// A starting node tells another node, and only a node, how it starts,
// as it is at the time of the call (it changes once the node starts
// Raft); a caller without the cluster secret learns nothing but
// Unavailable.
func TestStartingHandlerAnswersNodesOnly(t *testing.T) {
	var status atomic.Value
	status.Store("restore 0a1b")
	srv := httptest.NewUnstartedServer(NewStartingHandler(router.Config{ClusterSecret: "secret-0123456789"}, func() string { return status.Load().(string) }))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		secret, want string
	}{
		{"secret-0123456789", "restore 0a1b"},
		{"another-secret-0123", ""},
		{"", ""},
	} {
		st, status, err := router.NewPeers(tc.secret, nil).ProbeStart(ctx, addr)
		if st != nil || status != tc.want || (tc.want == "") != (err != nil) {
			t.Errorf("secret %q: ProbeStart = %v, %q, %v; want status %q", tc.secret, st, status, err, tc.want)
		}
	}
	status.Store("running")
	if _, got, err := router.NewPeers("secret-0123456789", nil).ProbeStart(ctx, addr); got != "running" || err != nil {
		t.Errorf("after the status changed: ProbeStart = %q, %v; want status %q", got, err, "running")
	}
	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/healthz while starting: %d, want 503", resp.StatusCode)
	}
}
