package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/client"
	"github.com/warden-dev/warden/internal/logbuf"
	"github.com/warden-dev/warden/internal/proctest"
	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/server"
)

// A three-process cluster on loopback: each node a real wardend in its
// own zone with its own data directory, as deploy/local runs them.

type node struct {
	id           uint64
	zone         string
	dir          string
	raft, listen string
	cmd          *exec.Cmd
	up           atomic.Bool // running: read by traffic goroutines
	started      bool        // start has run once: later starts are restarts
	log          *logbuf.Buffer
	exited       chan error
	locks        wardenv1connect.LockServiceClient
	admin        wardenv1connect.AdminServiceClient
	// nodeAPI, if set, is how node() reaches a TLS cluster's node API
	// (with a peer certificate); without it, cleartext with the secret.
	nodeAPI placementv1connect.NodeServiceClient
	// web, if set, reads a TLS node's /metrics; without it, cleartext.
	web *http.Client
	// quotaAPI, if set, is quota()'s client (a TLS cluster's).
	quotaAPI wardenv1connect.QuotaServiceClient
}

type procCluster struct {
	t       *testing.T
	nodes   []*node
	members string
	secret  string // path of the cluster secret file
	// extra holds more flags for node i.
	extra map[int][]string
	// bins holds another wardend binary for node i (an older build, for
	// mixed-version tests).
	bins map[int]string
	// secure: the nodes get TLS flags in extra, not --insecure.
	secure bool
	// short: a forced removal may have left shards with two replicas.
	short bool
}

// startProcCluster starts three nodes; extra, if given, adds flags to
// node i (0-based).
func startProcCluster(t *testing.T, extra ...map[int][]string) *procCluster {
	t.Helper()
	c := newProcCluster(t, extra...)
	c.boot()
	return c
}

// processHost is the loopback address this test process's nodes listen
// on: 127.P.Q.1 from its process id, where Linux answers for all of
// 127.0.0.0/8. A node restarted after a SIGKILL binds its old ports
// again, and in the meantime a test in another package running beside
// this one (they pick free ports on 127.0.0.1 at random) could take them;
// on a host of its own nobody else binds. Where the address does not
// answer (another kernel), 127.0.0.1.
var processHost = sync.OnceValue(func() string {
	pid := os.Getpid()
	host := fmt.Sprintf("127.%d.%d.1", pid>>8&0xff, pid&0xff)
	if l, err := net.Listen("tcp", net.JoinHostPort(host, "0")); err == nil {
		l.Close()
		return host
	}
	return "127.0.0.1"
})

// handedOut holds every address freeAddr has returned in this process.
// The cluster tests run two at a time (t.Parallel): a node a test killed
// has released its ports, and it binds them again when restarted, so no
// other test may be handed them meanwhile.
var handedOut struct {
	sync.Mutex
	addrs map[string]bool
}

// freeAddr returns an address on processHost whose port was free a moment
// ago and that no earlier call in this process returned.
func freeAddr(t *testing.T) string {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for {
		a, err := server.FreeAddrOn(processHost())
		if err != nil {
			t.Fatal(err)
		}
		if !handedOut.addrs[a] {
			if handedOut.addrs == nil {
				handedOut.addrs = map[string]bool{}
			}
			handedOut.addrs[a] = true
			return a
		}
	}
}

// freeAddrs returns two addresses for a new node (freeAddr never hands
// out one twice).
func (c *procCluster) freeAddrs() (raft, listen string) {
	return freeAddr(c.t), freeAddr(c.t)
}

// newProcCluster lays out three nodes (addresses, data directories,
// clients) without starting them; boot starts them.
func newProcCluster(t *testing.T, extra ...map[int][]string) *procCluster {
	t.Helper()
	c := &procCluster{t: t, secret: filepath.Join(t.TempDir(), "cluster-secret")}
	if err := os.WriteFile(c.secret, []byte("test-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.extra = map[int][]string{}
	if len(extra) > 0 && extra[0] != nil {
		c.extra = extra[0]
	}
	var members []string
	for i := range 3 {
		raft, listen := c.freeAddrs()
		n := &node{id: uint64(i + 1), dir: filepath.Join(t.TempDir(), fmt.Sprintf("node-%d", i+1)), raft: raft, listen: listen, zone: fmt.Sprintf("az%d", i+1)}
		n.locks = wardenv1connect.NewLockServiceClient(http.DefaultClient, "http://"+listen)
		n.admin = wardenv1connect.NewAdminServiceClient(http.DefaultClient, "http://"+listen)
		c.nodes = append(c.nodes, n)
		members = append(members, fmt.Sprintf("%d=%s=%s", n.id, raft, listen))
	}
	c.members = strings.Join(members, ",")
	return c
}

// boot starts every node, waits until each serves, and stops them all
// when the test ends.
func (c *procCluster) boot() {
	t := c.t
	t.Helper()
	for i := range c.nodes {
		c.start(i)
	}
	for i := range c.nodes {
		c.waitServing(i)
	}
	t.Cleanup(func() {
		for i, n := range c.nodes {
			if n.cmd != nil {
				_ = n.cmd.Process.Signal(syscall.SIGCONT)
				_ = n.cmd.Process.Kill()
				<-n.exited
				if t.Failed() {
					t.Logf("node %d log:\n%s", i+1, n.log.Tail(40))
				}
			}
		}
	})
}

// start starts node i's process (again) on its data directory.
func (c *procCluster) start(i int) {
	c.t.Helper()
	n := c.nodes[i]
	n.log, n.exited = &logbuf.Buffer{}, make(chan error, 1)
	args := []string{"--node-id", fmt.Sprint(n.id), "--zone", n.zone, "--raft-addr", n.raft, "--listen", n.listen, "--data-dir", n.dir,
		"--cluster-secret-file", c.secret}
	if !c.secure && knowsFlag(c.binOf(i), "--insecure") { // older builds served cleartext without it
		args = append(args, "--insecure")
	}
	if n.id <= 3 {
		args = append(args, "--initial-members", c.members)
		if !n.started && knowsFlag(c.binOf(i), "--initial-cluster-state") {
			// As deploy/local/cluster.sh does: only the first start
			// creates the data directory.
			args = append(args, "--initial-cluster-state", "new")
		}
	} else {
		for _, m := range c.nodes[:3] {
			args = append(args, "--join", m.listen)
		}
	}
	n.started = true
	n.cmd = exec.Command(c.binOf(i), append(args, c.extra[i]...)...)
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	if err := n.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	cmd, exited := n.cmd, n.exited // the next start replaces both
	go func() { exited <- cmd.Wait() }()
	n.up.Store(true)
}

// binOf is the wardend binary node i runs.
func (c *procCluster) binOf(i int) string {
	if c.bins[i] != "" {
		return c.bins[i]
	}
	return binary
}

// knowsFlag reports whether the wardend binary bin has flag (an older
// build may not).
func knowsFlag(bin, flag string) bool {
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	return strings.Contains(string(out), flag)
}

// join adds a node in zone with --join (the first three nodes' Connect
// addresses) and returns its index.
func (c *procCluster) join(zone string) int {
	c.t.Helper()
	raft, listen := c.freeAddrs()
	i := len(c.nodes)
	n := &node{id: uint64(i + 1), dir: filepath.Join(c.t.TempDir(), fmt.Sprintf("node-%d", i+1)), raft: raft, listen: listen, zone: zone}
	n.locks = wardenv1connect.NewLockServiceClient(http.DefaultClient, "http://"+listen)
	n.admin = wardenv1connect.NewAdminServiceClient(http.DefaultClient, "http://"+listen)
	c.nodes = append(c.nodes, n)
	c.start(i)
	c.waitServing(i)
	return i
}

// kill SIGKILLs node i and waits for it to exit.
func (c *procCluster) kill(i int) {
	c.t.Helper()
	n := c.nodes[i]
	n.up.Store(false)
	_ = n.cmd.Process.Kill()
	<-n.exited
	n.cmd = nil
}

// waitServing waits until node i answers a Describe (its router has a map
// and the shard a leader, wherever it is).
func (c *procCluster) waitServing(i int) {
	c.t.Helper()
	if err := proctest.WaitServing(c.nodes[i].locks, c.nodes[i].exited, 60*time.Second); err != nil {
		c.t.Fatalf("node %d %v:\n%s", i+1, err, c.nodes[i].log.Tail(40))
	}
}

// any returns a running node's clients, picked at random.
func (c *procCluster) any() *node {
	for {
		if n := c.nodes[rand.IntN(len(c.nodes))]; n.up.Load() {
			return n
		}
	}
}

func rpcCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 15*time.Second)
}

func (n *node) acquire(resource, requestID string, ttl, wait time.Duration) (*wardenv1.AcquireResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second+wait)
	defer cancel()
	req := &wardenv1.AcquireRequest{Resource: resource, RequestId: requestID, LeaseTtl: durationpb.New(ttl)}
	if wait > 0 {
		req.WaitTimeout = durationpb.New(wait)
	}
	resp, err := n.locks.Acquire(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (n *node) renew(resource, leaseID string) error {
	ctx, cancel := rpcCtx()
	defer cancel()
	_, err := n.locks.Renew(ctx, connect.NewRequest(&wardenv1.RenewRequest{Resource: resource, LeaseId: leaseID}))
	return err
}

// release releases leaseID's lease on resource; ok is whether the unlock
// took effect: released, or already_released, which a Release the router
// sent again after an unanswered attempt answers (DESIGN.md §1 rule 3).
func (n *node) release(resource, leaseID string) (ok bool, err error) {
	ctx, cancel := rpcCtx()
	defer cancel()
	resp, err := n.locks.Release(ctx, connect.NewRequest(&wardenv1.ReleaseRequest{Resource: resource, LeaseId: leaseID}))
	if err != nil {
		return false, err
	}
	return resp.Msg.GetReleased() || resp.Msg.GetAlreadyReleased(), nil
}

func (n *node) describe(resource string) (*wardenv1.DescribeResponse, error) {
	ctx, cancel := rpcCtx()
	defer cancel()
	resp, err := n.locks.Describe(ctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: resource}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (n *node) shards() (*wardenv1.ListShardsResponse, error) {
	ctx, cancel := rpcCtx()
	defer cancel()
	resp, err := n.admin.ListShards(ctx, connect.NewRequest(&wardenv1.ListShardsRequest{}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// node returns the node's NodeService client, with the cluster secret.
func (n *node) node() placementv1connect.NodeServiceClient {
	if n.nodeAPI != nil {
		return n.nodeAPI
	}
	return placementv1connect.NewNodeServiceClient(http.DefaultClient, "http://"+n.listen, connect.WithInterceptors(
		connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Warden-Cluster-Secret", "test-secret-0123456789")
				return next(ctx, req)
			}
		})))
}

// holdMany acquires n resources named prefix-i through random nodes, in
// parallel (retrying with the same request id while the cluster answers
// unavailable), and returns the leases.
func (c *procCluster) holdMany(prefix string, n int, ttl time.Duration) map[string]*wardenv1.AcquireResponse {
	c.t.Helper()
	var mu sync.Mutex
	leases := map[string]*wardenv1.AcquireResponse{}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	work := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range work {
				r := fmt.Sprintf("%s-%d", prefix, i)
				var a *wardenv1.AcquireResponse
				err := retryUnavailable(func() (err error) {
					a, err = c.any().acquire(r, "hold-"+r, ttl, 0)
					return err
				})
				if err != nil {
					errs <- fmt.Errorf("acquire %s: %w", r, err)
					continue
				}
				mu.Lock()
				leases[r] = a
				mu.Unlock()
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		c.t.Fatal(err)
	}
	return leases
}

// checkLeases checks that every lease is still held with its token and
// renews, through random nodes.
func (c *procCluster) checkLeases(leases map[string]*wardenv1.AcquireResponse) {
	c.t.Helper()
	c.waitClockReadings()
	for r, a := range leases {
		n := c.any()
		var d *wardenv1.DescribeResponse
		err := retryUnavailable(func() (err error) {
			d, err = n.describe(r)
			return err
		})
		if err != nil {
			c.t.Fatalf("describe %s via node %d: %v", r, n.id, err)
		}
		if !d.GetHeld() || d.GetFencingToken() != a.GetFencingToken() {
			c.t.Fatalf("%s: %v, want held with token %#x", r, d, a.GetFencingToken())
		}
		if err := retryUnavailable(func() error { return n.renew(r, a.GetLeaseId()) }); err != nil {
			c.t.Fatalf("renew %s via node %d: %v", r, n.id, err)
		}
	}
	// All of them at once, through every running node: a RenewBatch splits
	// by shard and forwards the renewals of shards led elsewhere.
	for _, n := range c.nodes {
		if !n.up.Load() {
			continue
		}
		// A batch whose deadline passes on the way (here, while it is
		// forwarded) fails alone: the node keeps serving.
		_ = n.renewBatch(leases, time.Millisecond)
		if err := retryUnavailable(func() error { return n.renewBatch(leases, 15*time.Second) }); err != nil {
			c.t.Fatalf("RenewBatch via node %d: %v", n.id, err)
		}
	}
	// A Batch through every running node acquires every held lock again
	// under a new request id: each is refused (aborted), wherever its
	// shard is led (rule 1).
	for _, n := range c.nodes {
		if !n.up.Load() {
			continue
		}
		if err := retryUnavailable(func() error { return n.acquireHeld(leases) }); err != nil {
			c.t.Fatalf("Batch via node %d: %v", n.id, err)
		}
	}
	// Every node runs this binary and says so in its clock readings, so
	// the leaders renewed in RenewBatch commands and proposed the Batch's
	// ops in BatchCmds, not one lease or op at a time. (A node restarted
	// while another is down has not read that one's version, and rightly
	// proposes neither.)
	renewals, commands := 0.0, 0.0
	for _, n := range c.nodes {
		if !n.up.Load() {
			return
		}
	}
	for _, n := range c.nodes {
		if n.up.Load() {
			v, _ := n.metric(`warden_rpc_outcomes_total{method="RenewBatch.renewal",outcome="ok"}`)
			renewals += v
			v, _ = n.metric(`warden_batch_command_ops_count`)
			commands += v
		}
	}
	if renewals == 0 {
		c.t.Fatal("no renewal went through a RenewBatch command")
	}
	if commands == 0 {
		c.t.Fatal("no Batch op went through a BatchCmd")
	}
}

// waitClockReadings waits until every running node has read the clock
// (and so the binary's command version) of every other running node: a
// router proposes RenewBatch and Batch commands only then, which
// checkLeases requires.
func (c *procCluster) waitClockReadings() {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.nodes {
		for _, peer := range c.nodes {
			for n != peer && n.up.Load() && peer.up.Load() {
				if _, ok := n.metric(fmt.Sprintf(`warden_clock_offset_seconds{peer="%d"}`, peer.id)); ok {
					break
				}
				if time.Now().After(deadline) {
					c.t.Fatalf("node %d has not read node %d's clock", n.id, peer.id)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
}

// metric reads one sample of the node's /metrics, with ok unset when
// the node does not export it.
func (n *node) metric(sample string) (v float64, ok bool) {
	get := func() (*http.Response, error) { return http.Get("http://" + n.listen + "/metrics") }
	if n.web != nil {
		get = func() (*http.Response, error) { return n.web.Get("https://" + n.listen + "/metrics") }
	}
	resp, err := get()
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if s, ok := strings.CutPrefix(line, sample+" "); ok {
			v, err := strconv.ParseFloat(s, 64)
			return v, err == nil
		}
	}
	return 0, false
}

// renewBatch renews every lease in one RenewBatch within timeout. It
// answers the first failed renewal as an error of its code (Unavailable
// for retryUnavailable).
func (n *node) renewBatch(leases map[string]*wardenv1.AcquireResponse, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req := &wardenv1.RenewBatchRequest{}
	for r, a := range leases {
		req.Renewals = append(req.Renewals, &wardenv1.RenewRequest{Resource: r, LeaseId: a.GetLeaseId()})
	}
	resp, err := n.locks.RenewBatch(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	if len(resp.Msg.GetOutcomes()) != len(req.Renewals) {
		return fmt.Errorf("%d outcomes for %d renewals", len(resp.Msg.GetOutcomes()), len(req.Renewals))
	}
	for i, o := range resp.Msg.GetOutcomes() {
		if o.GetCode() == "" {
			continue
		}
		var code connect.Code
		if err := code.UnmarshalText([]byte(o.GetCode())); err != nil {
			return fmt.Errorf("%s: outcome code %q: %v", req.Renewals[i].GetResource(), o.GetCode(), err)
		}
		return connect.NewError(code, fmt.Errorf("%s: %s", req.Renewals[i].GetResource(), o.GetMessage()))
	}
	return nil
}

// batchSeq makes the request ids of acquireHeld unique.
var batchSeq atomic.Int64

// acquireHeld tries to acquire every held lock again in one Batch, and
// answers an error unless each op is refused as held (Unavailable for
// retryUnavailable when one could not be tried).
func (n *node) acquireHeld(leases map[string]*wardenv1.AcquireResponse) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req := &wardenv1.BatchRequest{}
	for r := range leases {
		req.Ops = append(req.Ops, &wardenv1.BatchOp{Op: &wardenv1.BatchOp_Acquire{Acquire: &wardenv1.AcquireRequest{
			Resource: r, RequestId: fmt.Sprintf("again-%d", batchSeq.Add(1))}}})
	}
	resp, err := n.locks.Batch(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	if len(resp.Msg.GetOutcomes()) != len(req.Ops) {
		return fmt.Errorf("%d outcomes for %d ops", len(resp.Msg.GetOutcomes()), len(req.Ops))
	}
	for i, o := range resp.Msg.GetOutcomes() {
		switch o.GetCode() {
		case "aborted":
		case "unavailable":
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s: %s", req.Ops[i].GetAcquire().GetResource(), o.GetMessage()))
		default:
			return fmt.Errorf("acquiring held %s again answered %q %q %v", req.Ops[i].GetAcquire().GetResource(), o.GetCode(), o.GetMessage(), o.GetAcquire())
		}
	}
	return nil
}

// retryUnavailable runs f until its error is not client.Retryable
// (Unavailable while leadership settles after a restart, or a connection
// broken by a node's death mid-call), for up to 15 s.
func retryUnavailable(f func() error) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := f()
		if !client.Retryable(err) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkNextTokens releases every lease and acquires the resource again:
// the new token must be above the lease's.
func (c *procCluster) checkNextTokens(leases map[string]*wardenv1.AcquireResponse) {
	c.t.Helper()
	for r, a := range leases {
		n := c.any()
		var ok, retried bool
		err := retryUnavailable(func() (err error) {
			ok, err = n.release(r, a.GetLeaseId())
			retried = retried || err != nil
			return err
		})
		if err != nil || !ok && !retried { // a retry finds it released already
			c.t.Fatalf("release %s: %v %v", r, ok, err)
		}
		var next *wardenv1.AcquireResponse
		err = retryUnavailable(func() (err error) {
			next, err = n.acquire(r, "next-"+r, time.Minute, 0)
			return err
		})
		if err != nil || next.GetFencingToken() <= a.GetFencingToken() {
			c.t.Fatalf("%s: next token %v (%v), last %#x", r, next, err, a.GetFencingToken())
		}
	}
}

// checkShards checks that the shards' ranges cover the hash space exactly
// once, each active shard with replicas in three zones (or two, after a
// forced removal: short), never two in one zone, and returns them.
func (c *procCluster) checkShards() []*wardenv1.ShardInfo {
	c.t.Helper()
	// Right after a restart a node's placement replica may not serve
	// reads yet (dropped as not ready, or timed out): ListShards answers
	// Unavailable, and a client retries.
	var resp *wardenv1.ListShardsResponse
	err := retryUnavailable(func() (err error) {
		resp, err = c.any().shards()
		return err
	})
	if err != nil {
		c.t.Fatal(err)
	}
	var active []*wardenv1.ShardInfo
	for _, s := range resp.GetShards() {
		if s.GetState() != "active" {
			c.t.Fatalf("shard %d is %s with no operator running: %v", s.GetId(), s.GetState(), resp)
		}
		zones := map[string]bool{}
		for _, r := range s.GetReplicas() {
			zones[r.GetZone()] = true
		}
		if len(zones) != len(s.GetReplicas()) || (len(zones) != 3 && !(c.short && len(zones) == 2)) {
			c.t.Fatalf("shard %d has %d replicas in %d zones: %v", s.GetId(), len(s.GetReplicas()), len(zones), s)
		}
		active = append(active, s)
	}
	next, covered := uint64(0), false
	for i := range active {
		found := false
		for _, s := range active {
			if s.GetRangeStart() == next {
				next, found = s.GetRangeEnd(), true
				break
			}
		}
		if !found {
			c.t.Fatalf("no shard starts at %#x: %v", next, resp)
		}
		if next == 0 {
			covered = i == len(active)-1 // and no range left over
			break
		}
	}
	if !covered {
		c.t.Fatalf("the ranges do not cover the hash space exactly once: %v", resp)
	}
	return active
}
