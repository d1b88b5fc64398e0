package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/client"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/tlsconfig"
)

// clusterPKI is a secure process cluster's throwaway TLS material: a
// client CA (which signs the nodes' client-API certificates and the
// clients'), a distinct peer CA (the nodes' peer certificates), and the
// files of each node.
type clusterPKI struct {
	clientCA, peerCA *tlsconfig.CA
	dir              string
	roots            *x509.CertPool // the client CA, as clients trust it
}

func newClusterPKI(t *testing.T) *clusterPKI {
	t.Helper()
	p := &clusterPKI{dir: t.TempDir(), roots: x509.NewCertPool()}
	var err error
	if p.clientCA, err = tlsconfig.NewCA("warden test client CA", time.Hour); err != nil {
		t.Fatal(err)
	}
	if p.peerCA, err = tlsconfig.NewCA("warden test peer CA", time.Hour); err != nil {
		t.Fatal(err)
	}
	p.roots.AppendCertsFromPEM(p.clientCA.PEM)
	p.write(t, "client-ca.pem", p.clientCA.PEM)
	p.write(t, "peer-ca.pem", p.peerCA.PEM)
	return p
}

func (p *clusterPKI) write(t *testing.T, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue writes a certificate and key ca signs for spec as NAME.pem and
// NAME-key.pem, and returns their paths.
func (p *clusterPKI) issue(t *testing.T, ca *tlsconfig.CA, name string, spec tlsconfig.CertSpec) (cert, key string) {
	t.Helper()
	c, k, err := ca.Issue(spec)
	if err != nil {
		t.Fatal(err)
	}
	key = p.write(t, name+"-key.pem", k)
	return p.write(t, name+".pem", c), key
}

// pair loads a certificate issue wrote.
func pair(t *testing.T, cert, key string) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// flags issues node n's certificates (the client API's for its listen
// host, the peer one naming its id and its Raft host) and returns its TLS
// flags.
func (p *clusterPKI) flags(t *testing.T, n *node) []string {
	t.Helper()
	host, _, _ := net.SplitHostPort(n.listen)
	apiCert, apiKey := p.issue(t, p.clientCA, fmt.Sprintf("node-%d-api", n.id), tlsconfig.CertSpec{CommonName: fmt.Sprintf("node %d", n.id), Names: []string{host}, Server: true})
	raftHost, _, _ := net.SplitHostPort(n.raft)
	peerCert, peerKey := p.issue(t, p.peerCA, fmt.Sprintf("node-%d-peer", n.id), tlsconfig.CertSpec{CommonName: fmt.Sprintf("node %d", n.id), Names: []string{tlsconfig.NodeName(n.id), raftHost}, Server: true, Client: true})
	return []string{"--tls-cert", apiCert, "--tls-key", apiKey, "--tls-client-ca", filepath.Join(p.dir, "client-ca.pem"),
		"--peer-ca", filepath.Join(p.dir, "peer-ca.pem"), "--peer-cert", peerCert, "--peer-key", peerKey}
}

// newTLSCluster is a three-node cluster (not started) whose nodes serve
// TLS on the client API and mutual TLS between them, with certificates
// from a fresh PKI; each node's clients call over https, options opts
// added (a bearer token, say).
func newTLSCluster(t *testing.T, opts ...connect.ClientOption) (*procCluster, *clusterPKI) {
	t.Helper()
	p := newClusterPKI(t)
	c := newProcCluster(t)
	c.secure = true
	for i, n := range c.nodes {
		c.extra[i] = p.flags(t, n)
		hc := httpsClient(p.roots, nil, "")
		url := "https://" + n.listen
		n.locks = wardenv1connect.NewLockServiceClient(hc, url, opts...)
		n.admin = wardenv1connect.NewAdminServiceClient(hc, url, opts...)
		n.quotaAPI = wardenv1connect.NewQuotaServiceClient(hc, url, opts...)
		n.web = hc
	}
	return c, p
}

// httpsClient is an HTTP/2 client over TLS trusting roots, presenting
// cert if it is set.
func httpsClient(roots *x509.CertPool, cert *tls.Certificate, serverName string) *http.Client {
	cfg := &tls.Config{RootCAs: roots, ServerName: serverName}
	if cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	t := &http.Transport{TLSClientConfig: cfg}
	t.Protocols = new(http.Protocols)
	t.Protocols.SetHTTP2(true)
	return &http.Client{Transport: t, Timeout: 15 * time.Second}
}

// Three real processes serving TLS on the client API, mutual TLS with
// the peer certificates on the node API and on Raft: calls forwarded
// between nodes work; a client without TLS, one trusting another CA, a
// client certificate on the node API or the Raft port, a foreign CA's
// node certificate, and a spoofed forwarding header are all refused or
// ignored; /metrics needs no client certificate; a rewritten client-API
// certificate is served after SIGHUP, with leases from before intact.
func TestClusterTLS(t *testing.T) {
	t.Parallel()
	c, p := newTLSCluster(t)
	c.boot()

	// Acquires through every node: two of them do not lead the shard and
	// forward to the one that does, over the peer link.
	lead := c.leaderIndex("tls/a")
	held := map[int]*wardenv1.AcquireResponse{}
	for i, n := range c.nodes {
		resp, err := n.acquire(fmt.Sprintf("tls/%d", i), fmt.Sprintf("q%d", i), time.Minute, 0)
		if err != nil {
			t.Fatalf("Acquire via node %d (node %d leads): %v", i+1, lead+1, err)
		}
		held[i] = resp
	}

	// The CLI over TLS, with the CA and a client certificate, and the SDK
	// with a TLS config: served, forwarded where need be.
	cliPEM, cliKey := p.issue(t, p.clientCA, "cli", tlsconfig.CertSpec{CommonName: "cli", Client: true})
	out, err := exec.Command(cliBinary, "--addr", "https://"+c.nodes[(lead+1)%3].listen, "--cacert", filepath.Join(p.dir, "client-ca.pem"),
		"--cert", cliPEM, "--key", cliKey, "lock", "acquire", "tls/cli", "--ttl", "30s").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "fencing_token") {
		t.Fatalf("warden lock acquire over TLS: %v\n%s", err, out)
	}
	sdk, err := client.NewWithConfig(client.Config{Endpoints: []string{"https://" + c.nodes[(lead+2)%3].listen}, TLS: &tls.Config{RootCAs: p.roots}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := rpcCtx()
	l, err := sdk.Lock(ctx, "tls/sdk", client.LockOptions{TTL: 30 * time.Second})
	cancel()
	if err != nil {
		t.Fatalf("the SDK's Lock over TLS: %v", err)
	}
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatalf("the SDK's Unlock over TLS: %v", err)
	}
	_ = sdk.Close(context.Background())

	// Refused: a client that speaks cleartext to the TLS port, and one that
	// does not trust the client CA.
	plain := wardenv1connect.NewLockServiceClient(http.DefaultClient, "http://"+c.nodes[0].listen)
	if _, err := plain.Describe(context.Background(), connect.NewRequest(&wardenv1.DescribeRequest{Resource: "tls/0"})); err == nil {
		t.Fatal("a cleartext client was served by a TLS node")
	}
	other, err := tlsconfig.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherRoots := x509.NewCertPool()
	otherRoots.AppendCertsFromPEM(other.PEM)
	stranger := wardenv1connect.NewLockServiceClient(httpsClient(otherRoots, nil, ""), "https://"+c.nodes[0].listen)
	if _, err := stranger.Describe(context.Background(), connect.NewRequest(&wardenv1.DescribeRequest{Resource: "tls/0"})); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("a client trusting another CA: %v, want unknown authority", err)
	}

	// A client certificate (client CA) on the node API: refused, even
	// with the cluster secret, which a TLS cluster does not accept.
	clientPEM, clientKey := p.issue(t, p.clientCA, "client", tlsconfig.CertSpec{CommonName: "client", Names: []string{tlsconfig.NodeName(9)}, Client: true})
	clientCert := pair(t, clientPEM, clientKey)
	withSecret := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Warden-Cluster-Secret", "test-secret-0123456789")
			return next(ctx, req)
		}
	}))
	asClient := placementv1connect.NewNodeServiceClient(httpsClient(p.roots, &clientCert, ""), "https://"+c.nodes[0].listen, withSecret)
	if _, err := asClient.ReadMeta(context.Background(), connect.NewRequest(&placementv1.ReadMetaRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("NodeService.ReadMeta with a client certificate and the secret: %v, want unauthenticated", err)
	}
	// The same certificate on a peer handshake, and a foreign CA's node
	// certificate: refused in the handshake.
	foreignPEM, foreignKey := p.issue(t, other, "foreign-node", tlsconfig.CertSpec{CommonName: "node 4", Names: []string{tlsconfig.NodeName(4), "127.0.0.1"}, Server: true, Client: true})
	for name, cert := range map[string]tls.Certificate{"client CA": clientCert, "foreign CA": pair(t, foreignPEM, foreignKey)} {
		nodeAPI := placementv1connect.NewNodeServiceClient(peerClient(p, cert), "https://"+c.nodes[0].listen)
		if _, err := nodeAPI.ReadMeta(context.Background(), connect.NewRequest(&placementv1.ReadMetaRequest{})); err == nil {
			t.Errorf("NodeService on a peer handshake with a %s certificate was served", name)
		}
		// The Raft port takes only the peer CA's certificates.
		if err := raftHandshake(c.nodes[0].raft, cert); err == nil || !strings.Contains(err.Error(), "remote error: tls:") {
			t.Errorf("the Raft port took a %s certificate: %v, want the server's TLS alert", name, err)
		}
	}
	// A peer certificate of a node the map does not know (one about to
	// join) may read the placement state and register itself, and
	// nothing else.
	unknownPEM, unknownKey := p.issue(t, p.peerCA, "node-9-peer", tlsconfig.CertSpec{CommonName: "node 9", Names: []string{tlsconfig.NodeName(9), "127.0.0.1"}, Server: true, Client: true})
	unknown := placementv1connect.NewNodeServiceClient(peerClient(p, pair(t, unknownPEM, unknownKey)), "https://"+c.nodes[0].listen)
	if _, err := unknown.ReadMeta(context.Background(), connect.NewRequest(&placementv1.ReadMetaRequest{})); err != nil {
		t.Fatalf("ReadMeta by a node about to join: %v", err)
	}
	if _, err := unknown.Read(context.Background(), connect.NewRequest(&placementv1.ReadRequest{ShardId: 1})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("NodeService.Read by a node the map does not know: %v, want permission_denied", err)
	}
	other5 := &placementv1.Command{Command: &placementv1.Command_RegisterNode{RegisterNode: &placementv1.RegisterNodeCmd{Node: &placementv1.Node{Id: 5, Zone: "az1"}}}}
	if _, err := unknown.ProposeMeta(context.Background(), connect.NewRequest(&placementv1.ProposeMetaRequest{Command: other5})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("a node about to join registering another id: %v, want permission_denied", err)
	}
	// A real fourth node joins over TLS (registering itself, then known),
	// and a call through it is forwarded to the leader.
	raft4, listen4 := c.freeAddrs()
	four := &node{id: 4, dir: filepath.Join(t.TempDir(), "node-4"), raft: raft4, listen: listen4, zone: "az1"}
	hc4 := httpsClient(p.roots, nil, "")
	four.locks = wardenv1connect.NewLockServiceClient(hc4, "https://"+listen4)
	four.admin = wardenv1connect.NewAdminServiceClient(hc4, "https://"+listen4)
	c.nodes = append(c.nodes, four)
	c.extra[3] = p.flags(t, four)
	c.start(3)
	c.waitServing(3)
	if _, err := four.acquire("tls/via-4", "j1", time.Minute, 0); err != nil {
		t.Fatalf("Acquire through the node that joined over TLS: %v", err)
	}
	// A fifth node whose certificates come from a foreign CA tries to
	// join: its peer handshakes are refused (node 1 counts them; it logs
	// them at DEBUG only), and it never enters the map.
	const refused = "warden_tls_handshake_failures_total"
	refusedBefore, _ := c.nodes[0].metric(refused)
	raft5, listen5 := c.freeAddrs()
	five := &node{id: 5, dir: filepath.Join(t.TempDir(), "node-5"), raft: raft5, listen: listen5, zone: "az2"}
	c.nodes = append(c.nodes, five)
	c.extra[4] = newClusterPKI(t).flags(t, five)
	c.start(4)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if n, _ := c.nodes[0].metric(refused); n > refusedBefore {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 1 counted no refused handshake of the foreign node:\n%s", c.nodes[0].log.Tail(20))
		}
	}
	lctx, lcancel := rpcCtx()
	nodes, err := c.nodes[0].admin.ListNodes(lctx, connect.NewRequest(&wardenv1.ListNodesRequest{}))
	lcancel()
	if err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes.Msg.GetNodes() {
		if nd.GetId() == 5 {
			t.Fatal("the node with a foreign CA's certificates is in the map")
		}
	}
	c.kill(4)
	c.nodes = c.nodes[:4]
	// Premise: it takes node 2's peer certificate (the connection stays
	// open, waiting for Raft's messages).
	if err := raftHandshake(c.nodes[0].raft, pair(t, filepath.Join(p.dir, "node-2-peer.pem"), filepath.Join(p.dir, "node-2-peer-key.pem"))); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the Raft port with node 2's peer certificate: %v, want an open connection", err)
	}

	// A client's forwarding header is stripped. A Snapshot forwarded by a
	// node covers only the receiving node's replicas (the sender asks each
	// node for its own); from a client, claiming to be forwarded, it still
	// covers all three.
	for _, hops := range []string{"1", "-1"} {
		req := connect.NewRequest(&wardenv1.SnapshotRequest{ShardId: 1})
		req.Header().Set("Warden-Forwarded", hops)
		ctx, cancel := rpcCtx()
		resp, err := c.nodes[0].admin.Snapshot(ctx, req)
		cancel()
		if err != nil || len(resp.Msg.GetSnapshots()) != 3 {
			t.Fatalf("Snapshot with Warden-Forwarded: %s from a client: %v, %d replicas; want the header ignored and all 3", hops, err, len(resp.Msg.GetSnapshots()))
		}
	}

	// Probes need no client certificate: /metrics over TLS, and it says
	// the node is not insecure.
	resp, err := httpsClient(p.roots, nil, "").Get("https://" + c.nodes[0].listen + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "\nwarden_insecure 0\n") {
		t.Fatalf("/metrics over TLS: status %d, no warden_insecure 0", resp.StatusCode)
	}

	// Rotation: node 1's client-API certificate rewritten and SIGHUP: new
	// handshakes get the new one, and the leases from before renew.
	n := c.nodes[0]
	serialOf := func() string {
		conn, err := tls.Dial("tcp", n.listen, &tls.Config{RootCAs: p.roots})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := serialOf()
	host, _, _ := net.SplitHostPort(n.listen)
	p.issue(t, p.clientCA, "node-1-api", tlsconfig.CertSpec{CommonName: "node 1 rotated", Names: []string{host}, Server: true})
	_ = n.cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for serialOf() == before {
		if time.Now().After(deadline) {
			t.Fatalf("node 1 still presents serial %s 10 s after a new certificate and SIGHUP", before)
		}
		time.Sleep(50 * time.Millisecond) // the reload is not observable from here
	}
	for i, l := range held {
		ctx, cancel := rpcCtx()
		_, err := c.nodes[i].locks.Renew(ctx, connect.NewRequest(&wardenv1.RenewRequest{Resource: fmt.Sprintf("tls/%d", i), LeaseId: l.GetLeaseId()}))
		cancel()
		if err != nil {
			t.Fatalf("renewing lease %d after the rotation: %v", i, err)
		}
	}
}

// peerClient is an HTTP client making a node's (peer) handshake with
// cert.
func peerClient(p *clusterPKI, cert tls.Certificate) *http.Client {
	peerRoots := x509.NewCertPool()
	peerRoots.AppendCertsFromPEM(p.peerCA.PEM)
	hc := httpsClient(peerRoots, &cert, tlsconfig.PeerServerName)
	hc.Transport.(*http.Transport).TLSClientConfig.InsecureSkipVerify = true // the server is not what is tested
	return hc
}

// raftHandshake makes a TLS connection to a Raft port with cert and
// reads from it for a second: a TLS 1.3 server's refusal of the client
// certificate arrives at the first read, and a connection it accepted
// stays open with nothing to read (os.ErrDeadlineExceeded).
func raftHandshake(addr string, cert tls.Certificate) error {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}})
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	var b [1]byte
	_, err = conn.Read(b[:])
	return err
}

// A production node without TLS starts only with --insecure and the
// cluster secret; TLS needs the peer material too.
func TestInsecureIsExplicit(t *testing.T) {
	t.Parallel()
	base := []string{"--node-id", "1", "--zone", "az1", "--raft-addr", "127.0.0.1:1", "--initial-members", "1=127.0.0.1:1=127.0.0.1:2", "--data-dir", t.TempDir()}
	for _, tc := range []struct {
		extra []string
		want  string
	}{
		{nil, "a node serves TLS"},
		{[]string{"--insecure"}, "--insecure needs --cluster-secret-file"},
		{[]string{"--tls-cert", "a.pem", "--tls-key", "a-key.pem"}, "--peer-ca"},
		{[]string{"--insecure", "--tls-cert", "a.pem"}, "exclude each other"},
	} {
		out, err := exec.Command(binary, append(base, tc.extra...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("wardend %v: %v\n%s\nwant a refusal naming %q", tc.extra, err, out, tc.want)
		}
	}
}

// raftSerial is the serial number of the certificate a Raft port
// presents to a handshake with cert.
func raftSerial(t *testing.T, addr string, cert tls.Certificate) string {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatalf("handshake with the Raft port %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// Dragonboat reads the Raft certificates once, at start: they are
// rotated by a rolling restart (docs/security.md). Each node in turn gets
// new peer and client-API certificates and is restarted; its Raft port
// then presents the new one, the cluster keeps its quorum throughout,
// and a lease taken before renews after the last restart.
func TestRaftCertRotation(t *testing.T) {
	t.Parallel()
	c, p := newTLSCluster(t)
	c.boot()
	held, err := c.nodes[0].acquire("rotate/held", "r1", 10*time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	peer := pair(t, filepath.Join(p.dir, "node-1-peer.pem"), filepath.Join(p.dir, "node-1-peer-key.pem"))
	for i, n := range c.nodes {
		before := raftSerial(t, n.raft, peer)
		c.extra[i] = p.flags(t, n) // new certificates under the same names
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		if err := <-n.exited; err != nil {
			t.Fatalf("node %d stopping: %v", i+1, err)
		}
		n.cmd = nil
		c.start(i)
		c.waitServing(i)
		if after := raftSerial(t, n.raft, peer); after == before {
			t.Fatalf("node %d's Raft port presents serial %s after the restart, as before", i+1, after)
		}
		// The others still talk to it: a write through it commits.
		if _, err := n.acquire(fmt.Sprintf("rotate/%d", i), fmt.Sprintf("w%d", i), time.Minute, 0); err != nil {
			t.Fatalf("Acquire via node %d after its rotation: %v", i+1, err)
		}
		if i == 0 {
			peer = pair(t, filepath.Join(p.dir, "node-1-peer.pem"), filepath.Join(p.dir, "node-1-peer-key.pem"))
		}
	}
	ctx, cancel := rpcCtx()
	defer cancel()
	if _, err := c.nodes[2].locks.Renew(ctx, connect.NewRequest(&wardenv1.RenewRequest{Resource: "rotate/held", LeaseId: held.GetLeaseId()})); err != nil {
		t.Fatalf("renewing the lease from before the rotation: %v", err)
	}
}
