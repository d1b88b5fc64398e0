//go:build linux

package nemesis

import (
	"context"
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

	"github.com/warden-dev/warden/internal/logbuf"
	"github.com/warden-dev/warden/internal/proctest"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// binary is the wardend the suite runs, built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nemesis-bin-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "wardend")
	if out, err := exec.Command("go", "build", "-o", binary, "../cmd/wardend").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building wardend: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Ports every node binds in its own namespace.
const (
	listenPort = "7070"
	raftPort   = "7071"
)

// node is one wardend process in its namespace.
type node struct {
	id     uint64
	ns     string // its network namespace
	host   string // its address there
	dir    string
	cmd    *exec.Cmd
	log    *logbuf.Buffer
	exited chan error
	// offset is the --debug-clock-offset it runs with.
	offset time.Duration
	locks  wardenv1connect.LockServiceClient
	quota  wardenv1connect.QuotaServiceClient
	admin  wardenv1connect.AdminServiceClient
	web    *http.Client
}

// cluster is three wardend processes, each in its own namespace, that
// reach each other only through the proxy.
type cluster struct {
	t       *testing.T
	net     *netlab
	proxy   *proxy
	nodes   []*node
	members string
	secret  string
	// ports[i] are the proxy's ports that lead to node i (Raft, API).
	ports [][]string
	// diskNode is the node whose data directory is a tmpfs of
	// diskTmpfsSize (the disk-full fault), -1 for none.
	diskNode int
}

// startCluster lays out the namespaces and the proxy, starts three nodes
// and waits until each serves. Node diskNode (if not -1) keeps its data
// directory on a tmpfs of diskTmpfsSize.
func startCluster(t *testing.T, seed uint64, diskNode int) *cluster {
	t.Helper()
	l := newNetlab(t, 3)
	c := &cluster{t: t, net: l, proxy: newProxy(l.gateway, l.hosts, seed), secret: filepath.Join(t.TempDir(), "secret"), diskNode: diskNode}
	t.Cleanup(c.proxy.close)
	if err := os.WriteFile(c.secret, []byte("nemesis-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var members []string
	for i, host := range l.hosts {
		raftAdv, err := c.proxy.listen(i, "raft", net.JoinHostPort(host, raftPort))
		if err != nil {
			t.Fatal(err)
		}
		apiAdv, err := c.proxy.listen(i, "api", net.JoinHostPort(host, listenPort))
		if err != nil {
			t.Fatal(err)
		}
		c.ports = append(c.ports, []string{portOf(t, raftAdv), portOf(t, apiAdv)})
		// The clients call a node's bound address directly; a long
		// wait or a paused node must not exhaust the connections.
		web := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext}}
		base := "http://" + net.JoinHostPort(host, listenPort)
		n := &node{id: uint64(i + 1), ns: l.netns(i), host: host, dir: filepath.Join(t.TempDir(), fmt.Sprintf("node-%d", i+1)), web: web,
			locks: wardenv1connect.NewLockServiceClient(web, base), quota: wardenv1connect.NewQuotaServiceClient(web, base),
			admin: wardenv1connect.NewAdminServiceClient(web, base)}
		if i == diskNode {
			// Unmounted by its cleanup, after the one below stops
			// the processes (cleanups run last first).
			proctest.MountTmpfs(t, n.dir, diskTmpfsSize)
		}
		c.nodes = append(c.nodes, n)
		members = append(members, fmt.Sprintf("%d=%s=%s", n.id, raftAdv, apiAdv))
	}
	c.members = strings.Join(members, ",")
	t.Cleanup(func() {
		for i, n := range c.nodes {
			if n.cmd != nil {
				c.kill(i)
			}
			if t.Failed() {
				t.Logf("node %d log (last lines):\n%s", i+1, n.log.Tail(30))
			}
		}
	})
	for i := range c.nodes {
		c.start(i, true)
	}
	for i := range c.nodes {
		c.waitServing(i)
	}
	return c
}

// start starts node i in its namespace (first: on a new data
// directory). It binds its namespace's address and advertises the
// proxy's.
func (c *cluster) start(i int, first bool) {
	c.t.Helper()
	n := c.nodes[i]
	n.log, n.exited = &logbuf.Buffer{}, make(chan error, 1)
	adv := strings.Split(strings.Split(c.members, ",")[i], "=")
	args := []string{"netns", "exec", n.ns, binary, "--node-id", fmt.Sprint(n.id), "--zone", fmt.Sprintf("az%d", i+1),
		"--raft-addr", net.JoinHostPort(n.host, raftPort), "--listen", net.JoinHostPort(n.host, listenPort),
		"--raft-advertise-addr", adv[1], "--advertise-addr", adv[2],
		"--data-dir", n.dir, "--disk-reserve", diskReserveFlag, "--insecure", "--cluster-secret-file", c.secret, "--initial-members", c.members}
	if first {
		args = append(args, "--initial-cluster-state", "new")
	}
	if n.offset != 0 {
		args = append(args, "--debug-clock-offset", n.offset.String())
	}
	// ip netns exec execs wardend in place: the process is wardend's.
	n.cmd = exec.Command("ip", args...)
	n.cmd.Env = cleanEnv()
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	if err := n.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	cmd, exited := n.cmd, n.exited
	go func() { exited <- cmd.Wait() }()
}

// cleanEnv is this process's environment without WARDEN_ variables,
// which wardend would read as flags.
func cleanEnv() []string {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "WARDEN_") {
			env = append(env, e)
		}
	}
	return env
}

// kill SIGKILLs node i (resuming it first if stopped) and waits for it
// to exit.
func (c *cluster) kill(i int) {
	n := c.nodes[i]
	_ = n.cmd.Process.Signal(syscall.SIGCONT)
	_ = n.cmd.Process.Kill()
	<-n.exited
	n.cmd = nil
}

// signal sends sig to node i.
func (c *cluster) signal(i int, sig syscall.Signal) {
	c.t.Helper()
	if err := c.nodes[i].cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("signal %v to node %d: %v", sig, i+1, err)
	}
}

// waitServing waits until node i answers a Describe (its router has a
// map and the shard a leader).
func (c *cluster) waitServing(i int) {
	c.t.Helper()
	if err := proctest.WaitServing(c.nodes[i].locks, c.nodes[i].exited, 90*time.Second); err != nil {
		c.t.Fatalf("node %d %v:\n%s", i+1, err, c.nodes[i].log.Tail(40))
	}
}

// dataLeader is the index of the node leading the data shard, as a node
// among from sees it, or -1 when none of them knows one.
func (c *cluster) dataLeader(from ...int) int {
	for _, i := range from {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := c.nodes[i].admin.ListShards(ctx, connect.NewRequest(&wardenv1.ListShardsRequest{}))
		cancel()
		if err != nil || len(resp.Msg.GetShards()) == 0 {
			continue
		}
		if id := resp.Msg.GetShards()[0].GetLeaderNodeId(); id >= 1 && id <= uint64(len(c.nodes)) {
			return int(id - 1)
		}
	}
	return -1
}

// leadData moves the data shard's lead to node i and waits until node
// i sees itself lead it.
func (c *cluster) leadData(i int) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for c.dataLeader(i) != i {
		if time.Now().After(deadline) {
			c.t.Fatalf("node %d does not take the data shard's lead", i+1)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = c.nodes[i].admin.TransferLeader(ctx, connect.NewRequest(&wardenv1.TransferLeaderRequest{ShardId: 1, NodeId: uint64(i + 1)}))
		cancel()
	}
}

// waitDiskLow waits until node i finds its data directory below its
// reserve: /readyz answers 503 naming --disk-reserve (the node reads its
// free space every second).
func (c *cluster) waitDiskLow(i int) {
	c.t.Helper()
	n := c.nodes[i]
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := n.web.Get("http://" + net.JoinHostPort(n.host, listenPort) + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(body), "--disk-reserve") {
				return
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node %d does not report its data directory below its reserve on /readyz (last: %v)", i+1, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitDataLeader waits until one of the nodes knows the data shard's
// leader and returns it.
func (c *cluster) waitDataLeader() int {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if l := c.dataLeader(0, 1, 2); l >= 0 {
			return l
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatal("no node knows the data shard's leader")
	return -1
}

// portOf is the port of addr (host:port).
func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// silence cuts the pairs silently (netlab.silence): each node of a pair
// drops its packets through the proxy ports that lead to the other. With
// no pairs it heals every silent cut.
func (c *cluster) silence(pairs ...[2]int) {
	c.t.Helper()
	ports := make([][]string, len(c.nodes))
	for _, p := range pairs {
		ports[p[0]] = append(ports[p[0]], c.ports[p[1]]...)
		ports[p[1]] = append(ports[p[1]], c.ports[p[0]]...)
	}
	for i := range c.nodes {
		c.net.silence(i, ports[i])
	}
}
