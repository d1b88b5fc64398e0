package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/auth"
	"github.com/warden-dev/warden/client"
	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/tlsconfig"
)

// authBootstrap writes, in p's folder, adminToken, a new orders token
// and the bootstrap file that binds them (and the principal "client") as
// deploy/local/cluster.sh --secure does, and returns the file and the
// orders token.
func authBootstrap(t *testing.T, p *clusterPKI, adminToken string) (file, ordersToken string) {
	t.Helper()
	ordersToken, _ = auth.NewToken()
	p.write(t, "admin.token", []byte(adminToken+"\n"))
	p.write(t, "orders.token", []byte(ordersToken+"\n"))
	file = p.write(t, "auth.json", []byte(`{
	  "roles": [{"name": "operator", "grants": [{"permission": "admin"}, {"permission": "read"}, {"permission": "lock"},
	                                            {"permission": "quota.use"}, {"permission": "quota.admin"}]},
	            {"name": "orders", "grants": [{"permission": "lock", "prefix": "orders/"}]}],
	  "bindings": [{"principal": "admin", "role": "operator"}, {"principal": "orders", "role": "orders"},
	               {"principal": "client", "role": "orders"}],
	  "tokens": [{"principal": "admin", "file": "admin.token"}, {"principal": "orders", "file": "orders.token"}]}`))
	return file, ordersToken
}

// secureCluster is a three-node cluster (not started) that serves TLS,
// mutual TLS between nodes, and authentication from authBootstrap's
// file. Each node's clients (locks, admin, quota, the node API with a
// peer certificate, /metrics) call as the admin; orders[i] is node i's
// LockService as the orders token.
type secureCluster struct {
	*procCluster
	pki                     *clusterPKI
	adminToken, ordersToken string
	orders                  []wardenv1connect.LockServiceClient
}

func newSecureCluster(t *testing.T) *secureCluster {
	t.Helper()
	adminToken, _ := auth.NewToken()
	c, p := newTLSCluster(t, client.WithToken(adminToken))
	file, ordersToken := authBootstrap(t, p, adminToken)
	s := &secureCluster{procCluster: c, pki: p, adminToken: adminToken, ordersToken: ordersToken}
	testerPEM, testerKey := p.issue(t, p.peerCA, "tester-peer", tlsconfig.CertSpec{CommonName: "tester", Names: []string{tlsconfig.NodeName(1)}, Client: true, Server: true})
	tester := pair(t, testerPEM, testerKey)
	for i, n := range s.nodes {
		s.extra[i] = append(s.extra[i], "--auth-bootstrap", file)
		url := "https://" + n.listen
		n.nodeAPI = placementv1connect.NewNodeServiceClient(peerClient(p, tester), url)
		s.orders = append(s.orders, wardenv1connect.NewLockServiceClient(n.web, url, client.WithToken(ordersToken)))
	}
	return s
}

// auditLines returns the JSON lines of an audit file that match.
func auditLines(t *testing.T, path string, match func(map[string]any) bool) []map[string]any {
	t.Helper()
	b, _ := os.ReadFile(path)
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && match(m) {
			out = append(out, m)
		}
	}
	return out
}

// Three real processes bootstrapped with authentication (wardend
// --auth-bootstrap, TLS everywhere): a forwarded call is authorized as
// its original caller and audited with that principal on the node that
// served it; a client's principal header is stripped; the CLI works with
// a certificate and with a token file; a token revoked through one node
// is refused by the two others within 2 s; a node that cannot read the
// credentials for longer than the bound refuses rather than decide by an
// old view; and SIGHUP reopens the audit log.
func TestClusterAuth(t *testing.T) {
	t.Parallel()
	c := newSecureCluster(t)
	p, adminToken, ordersToken, orders := c.pki, c.adminToken, c.ordersToken, c.orders
	audits := make([]string, len(c.nodes))
	for i := range c.nodes {
		audits[i] = filepath.Join(p.dir, fmt.Sprintf("audit-%d.log", i+1))
		c.extra[i] = append(c.extra[i], "--audit-log", audits[i])
	}
	c.boot()

	// Unauthenticated, and the spoofed principal header of a client.
	anon := wardenv1connect.NewLockServiceClient(httpsClient(p.roots, nil, ""), "https://"+c.nodes[0].listen)
	spoof := connect.NewRequest(&wardenv1.AcquireRequest{Resource: "orders/spoof", RequestId: "s1"})
	spoof.Header().Set("Warden-Principal", "admin")
	if _, err := anon.Acquire(context.Background(), spoof); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("anonymous with a principal header: %v, want unauthenticated", err)
	}

	// A forwarded call: through a node that does not lead the shard.
	lead := c.leaderIndex("orders/fwd")
	via := (lead + 1) % 3
	ctx, cancel := rpcCtx()
	_, err := orders[via].Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "orders/fwd", RequestId: "f1"}))
	cancel()
	if err != nil {
		t.Fatalf("orders acquires orders/fwd via node %d (node %d leads): %v", via+1, lead+1, err)
	}
	ctx, cancel = rpcCtx()
	_, err = orders[via].Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "payments/1", RequestId: "f2"}))
	cancel()
	if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), `"payments/1"`) {
		t.Fatalf("orders acquires payments/1: %v, want permission_denied naming it", err)
	}
	// The serving node audited it, with the original caller's principal,
	// the forwarding node's address as the caller, and no request id.
	served := auditLines(t, audits[lead], func(m map[string]any) bool { return m["resource"] == "orders/fwd" && m["method"] == "Acquire" })
	if len(served) != 1 || served[0]["principal"] != "orders" || served[0]["outcome"] != "ok" || served[0]["request_hash"] == nil {
		t.Fatalf("the leader's audit of the forwarded Acquire: %v", served)
	}
	if b, _ := os.ReadFile(audits[lead]); strings.Contains(string(b), ordersToken) || strings.Contains(string(b), `"f1"`) {
		t.Fatal("the audit log holds a token or a request id")
	}

	// The CLI: a client certificate (principal "client", role orders),
	// and the admin token from a file.
	cliPEM, cliKey := p.issue(t, p.clientCA, "client", tlsconfig.CertSpec{CommonName: "client", Client: true})
	cli := func(args ...string) (string, error) {
		base := []string{"--addr", "https://" + c.nodes[via].listen, "--cacert", filepath.Join(p.dir, "client-ca.pem")}
		out, err := exec.Command(cliBinary, append(base, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := cli("--cert", cliPEM, "--key", cliKey, "lock", "acquire", "orders/cli"); err != nil || !strings.Contains(out, "fencing_token") {
		t.Fatalf("warden lock acquire with the client certificate: %v\n%s", err, out)
	}
	if out, err := cli("--cert", cliPEM, "--key", cliKey, "admin", "shards"); exitCode(err) != 7 || !strings.Contains(out, "permission_denied") {
		t.Fatalf("warden admin shards with the client certificate: %v, want status 7\n%s", err, out)
	}
	if out, err := cli("lock", "acquire", "orders/anonymous"); exitCode(err) != 7 || !strings.Contains(out, "unauthenticated") {
		t.Fatalf("warden lock acquire with no credentials: %v, want status 7\n%s", err, out)
	}
	adminFile := filepath.Join(p.dir, "admin.token")
	// A backup over TLS: the stream carries the token, the shards are read
	// over the nodes' mutual TLS; the orders role may not take one.
	backupDir := filepath.Join(t.TempDir(), "backup")
	if out, err := cli("--cert", cliPEM, "--key", cliKey, "admin", "backup", "--out", backupDir); err == nil || !strings.Contains(out, "permission_denied") {
		t.Fatalf("warden admin backup with the client certificate: %v\n%s", err, out)
	}
	if _, err := os.Stat(backupDir); err == nil {
		t.Fatal("a denied backup left its directory")
	}
	if out, err := cli("--token-file", adminFile, "admin", "backup", "--out", backupDir); err != nil || !strings.Contains(out, "shard-1.snap") {
		t.Fatalf("warden admin backup with the admin token: %v\n%s", err, out)
	}
	tokenFile := filepath.Join(p.dir, "temp.token")
	if out, err := cli("--token-file", adminFile, "auth", "token", "create", "orders", "--description", "temp", "--out", tokenFile); err != nil {
		t.Fatalf("warden auth token create: %v\n%s", err, out)
	}
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	temp := strings.TrimSpace(string(b))
	tempID, err := auth.ParseToken(temp)
	if err != nil {
		t.Fatalf("the token written: %v", err)
	}
	if out, err := cli("--token-file", adminFile, "auth", "token", "list"); err != nil || !strings.Contains(out, tempID) || strings.Contains(out, temp) {
		t.Fatalf("warden auth token list: %v\n%s", err, out)
	}

	// Revocation through node 1 reaches nodes 2 and 3 within 2 s. Premise:
	// the token works on each of them first.
	hc := httpsClient(p.roots, nil, "")
	describe := func(i int) error {
		cl := wardenv1connect.NewLockServiceClient(hc, "https://"+c.nodes[i].listen, client.WithToken(temp))
		ctx, cancel := rpcCtx()
		defer cancel()
		_, err := cl.Describe(ctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: "orders/fwd"}))
		return err
	}
	// A new token reaches the other nodes within the same bound.
	created := time.Now()
	for i := range c.nodes {
		for err := describe(i); err != nil; err = describe(i) {
			if time.Since(created) > 2*time.Second {
				t.Fatalf("the new token on node %d: %v", i+1, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	out, err := exec.Command(cliBinary, "--addr", "https://"+c.nodes[0].listen, "--cacert", filepath.Join(p.dir, "client-ca.pem"), "--token-file", adminFile,
		"auth", "token", "revoke", tempID).CombinedOutput()
	if err != nil {
		t.Fatalf("warden auth token revoke: %v\n%s", err, out)
	}
	revoked := time.Now()
	for _, i := range []int{1, 2} {
		for describe(i) == nil {
			if time.Since(revoked) > 2*time.Second {
				t.Fatalf("node %d still takes the revoked token %v after the revocation", i+1, time.Since(revoked))
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := describe(i); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("node %d after the revocation: %v, want unauthenticated", i+1, err)
		}
		t.Logf("node %d refused the revoked token %v after the revocation", i+1, time.Since(revoked).Round(time.Millisecond))
	}

	// The placement leader's SIGKILL does not age the survivors' views
	// past the bound: for 3 s after it, no call is refused for stale
	// credentials (the new leader answers the next short read).
	ctx, cancel = rpcCtx()
	ln, err := c.nodes[0].admin.ListNodes(ctx, connect.NewRequest(&wardenv1.ListNodesRequest{}))
	cancel()
	if err != nil || ln.Msg.GetPlacementLeaderId() == 0 {
		t.Fatalf("the placement leader: %v, %v", ln, err)
	}
	dead := int(ln.Msg.GetPlacementLeaderId() - 1)
	c.kill(dead)
	for killed := time.Now(); time.Since(killed) < 3*time.Second; time.Sleep(20 * time.Millisecond) {
		for i := range c.nodes {
			if i == dead {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := c.nodes[i].locks.Describe(ctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: "orders/fwd"}))
			cancel()
			if err != nil && strings.Contains(err.Error(), "credentials") {
				t.Fatalf("node %d %v after the placement leader's SIGKILL: %v", i+1, time.Since(killed).Round(time.Millisecond), err)
			}
		}
	}
	c.start(dead)
	c.waitServing(dead)

	// A node cut off from the placement group's quorum stops deciding by
	// its old view once it is older than the bound: its refusal, before
	// the call is read, says so (without the bound, the call would wait
	// for a shard leader and answer that there is none). Premise: served
	// before.
	hot := func() error {
		cl := wardenv1connect.NewAdminServiceClient(hc, "https://"+c.nodes[0].listen, client.WithToken(adminToken))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cl.HotResources(ctx, connect.NewRequest(&wardenv1.HotResourcesRequest{Limit: 1}))
		return err
	}
	if err := hot(); err != nil {
		t.Fatalf("HotResources before the partition: %v", err)
	}
	for _, i := range []int{1, 2} {
		_ = c.nodes[i].cmd.Process.Signal(syscall.SIGSTOP)
	}
	stopped := time.Now()
	for err = hot(); !strings.Contains(fmt.Sprint(err), "credentials"); err = hot() {
		if time.Since(stopped) > 10*time.Second {
			t.Fatalf("node 1 decides by its auth view 10 s after losing the placement quorum: %v", err)
		}
	}
	for _, i := range []int{1, 2} {
		_ = c.nodes[i].cmd.Process.Signal(syscall.SIGCONT)
	}
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("node 1 without quorum: %v, want unavailable", err)
	}
	t.Logf("node 1 refused to decide by its old auth view %v after the quorum went", time.Since(stopped).Round(time.Millisecond))

	// SIGHUP reopens the audit log: moved away, it is written anew. (The
	// kill above may have moved the shard's leadership, and the leader
	// writes the line: every node's file is moved.)
	for i, n := range c.nodes {
		if err := os.Rename(audits[i], audits[i]+".1"); err != nil {
			t.Fatal(err)
		}
		if err := n.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	written := func() bool {
		for _, a := range audits {
			if len(auditLines(t, a, func(m map[string]any) bool { return m["resource"] == "orders/after-hup" })) > 0 {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(15 * time.Second)
	for n := 0; !written(); n++ {
		if time.Now().After(deadline) {
			t.Fatal("no audit line in a reopened file after SIGHUP")
		}
		ctx, cancel := rpcCtx()
		_, _ = c.nodes[0].locks.Acquire(ctx, connect.NewRequest(&wardenv1.AcquireRequest{Resource: "orders/after-hup", RequestId: fmt.Sprint("h", n)}))
		cancel()
		time.Sleep(100 * time.Millisecond)
	}
}
