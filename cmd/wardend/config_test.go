package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// parse parses args with wardend's parser, with the environment env set
// (WARDEN_… variables of the process are cleared first).
func parse(t *testing.T, env map[string]string, args ...string) (*cli, error) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "WARDEN_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	var c cli
	k, err := parser(&c)
	if err != nil {
		t.Fatal(err)
	}
	_, err = k.Parse(args)
	return &c, err
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "wardend.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every flag reads from the config file and from a WARDEN_… variable;
// the environment wins over the file and the command line over both.
// --insecure and the debug flags have neither source, and a file key that
// is not a flag is refused naming it.
func TestConfigSources(t *testing.T) {
	file := writeConfig(t, `
node-id: 1
zone: az1
raft-addr: 10.0.1.5:7100
listen: 0.0.0.0:7070
advertise-addr: node1.example:7070
join: [node2.example:7070, node3.example:7070]
shutdown-wait: 3s
log-level: debug
data-dir: /var/lib/warden
cors-allowed-origins: [https://dash.example, "http://localhost:*"]
`)
	c, err := parse(t, nil, "--config", file)
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeID != 1 || c.Zone != "az1" || c.Advertise != "node1.example:7070" || len(c.Join) != 2 || c.Join[1] != "node3.example:7070" ||
		c.ShutdownWait != 3*time.Second || c.LogLevel.String() != "DEBUG" || c.DataDir != "/var/lib/warden" {
		t.Fatalf("from the file: %+v", c)
	}
	if len(c.CORSOrigins) != 2 || c.CORSOrigins[1] != "http://localhost:*" {
		t.Fatalf("cors-allowed-origins from the file: %q", c.CORSOrigins)
	}
	c, err = parse(t, map[string]string{"WARDEN_CORS_ALLOWED_ORIGINS": "https://a.example,https://b.example"})
	if err != nil || len(c.CORSOrigins) != 2 || c.CORSOrigins[1] != "https://b.example" {
		t.Fatalf("WARDEN_CORS_ALLOWED_ORIGINS: %q, %v", c.CORSOrigins, err)
	}
	c, err = parse(t, map[string]string{"WARDEN_ZONE": "az2", "WARDEN_NODE_ID": "2"}, "--config", file, "--node-id", "3")
	if err != nil {
		t.Fatal(err)
	}
	if c.Zone != "az2" || c.NodeID != 3 {
		t.Fatalf("zone %q (want the environment's az2), node id %d (want the command line's 3)", c.Zone, c.NodeID)
	}
	c, err = parse(t, map[string]string{"WARDEN_INSECURE": "true", "WARDEN_DEBUG_CLOCK_OFFSET": "1s"})
	if err != nil || c.Insecure || c.ClockOffset != 0 {
		t.Fatalf("--insecure %v, --debug-clock-offset %v from the environment (%v): want neither", c.Insecure, c.ClockOffset, err)
	}
	for body, want := range map[string]string{
		"insecure: true\n":         `"insecure" can only be given on the command line`,
		"debug-clock-offset: 1s\n": `"debug-clock-offset" can only be given on the command line`,
		"node_id: 1\n":             `"node_id" is not a wardend flag`,
		"node-id: [1, 2]\n":        "node-id",
		"listen: [unclosed\n":      "--config",
	} {
		if _, err := parse(t, nil, "--config", writeConfig(t, body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: %v, want an error naming %q", body, err, want)
		}
	}
}

// The advertised addresses: a bind on every interface needs one, and
// one must name a host and a port; without them the bound one is
// advertised. --data-dir is required for a production node.
func TestAdvertisedAddresses(t *testing.T) {
	base := []string{"--node-id", "1", "--zone", "az1", "--initial-members", "1=10.0.0.1:7100=10.0.0.1:7070", "--insecure", "--cluster-secret-file", writeConfig(t, "0123456789abcdef0123")}
	for _, tc := range []struct {
		args       []string
		want       string // error text, or "" for a config
		raft, list string
	}{
		{[]string{"--raft-addr", "10.0.0.1:7100", "--listen", "10.0.0.1:7070", "--data-dir", "d"}, "", "10.0.0.1:7100", "10.0.0.1:7070"},
		{[]string{"--raft-addr", "0.0.0.0:7100", "--raft-advertise-addr", "n1.example:7100", "--listen", "[::]:7070", "--advertise-addr", "n1.example:7070", "--data-dir", "d"}, "", "n1.example:7100", "n1.example:7070"},
		{[]string{"--raft-addr", "0.0.0.0:7100", "--listen", "10.0.0.1:7070", "--data-dir", "d"}, "--raft-addr 0.0.0.0:7100 binds every interface: give --raft-advertise-addr", "", ""},
		{[]string{"--raft-addr", "10.0.0.1:7100", "--listen", ":7070", "--data-dir", "d"}, "--listen :7070 binds every interface: give --advertise-addr", "", ""},
		{[]string{"--raft-addr", "10.0.0.1:7100", "--listen", "0.0.0.0:7070", "--advertise-addr", "0.0.0.0:7070", "--data-dir", "d"}, "cannot reach an unspecified host", "", ""},
		{[]string{"--raft-addr", "10.0.0.1:7100", "--listen", "10.0.0.1:7070", "--advertise-addr", "n1.example", "--data-dir", "d"}, "want host:port", "", ""},
		{[]string{"--raft-addr", "10.0.0.1:7100", "--listen", "10.0.0.1:7070"}, "--data-dir is required", "", ""},
	} {
		c, err := parse(t, nil, append(base, tc.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		cfg, err := clusterConfig(*c)
		switch {
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.want == "" && (cfg.Nodes[0].RaftAddr != tc.raft || cfg.ListenAddr != tc.list || cfg.Nodes[0].RaftListenAddr != c.RaftAddr):
			t.Errorf("%v: advertises raft %s, listen %s (binds raft %s), want %s and %s", tc.args, cfg.Nodes[0].RaftAddr, cfg.ListenAddr, cfg.Nodes[0].RaftListenAddr, tc.raft, tc.list)
		}
	}
}

// wildcardFree reports whether addr's port can be bound on every
// interface right now.
func wildcardFree(addr string) bool {
	_, port, _ := net.SplitHostPort(addr)
	l, err := net.Listen("tcp", "0.0.0.0:"+port)
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// A node that binds every interface (--listen and --raft-addr on
// 0.0.0.0) serves a three-process cluster through the addresses it
// advertises, which ListNodes shows with each node's version.
func TestClusterAdvertisedAddresses(t *testing.T) {
	// Node 3's ports were picked free on this process's loopback
	// address, but it binds them on every interface, where a process
	// beside this one (another package's test, on another loopback
	// address) may hold them: CI failed once on "address already in
	// use". Lay the cluster out again until both are free everywhere.
	c := newProcCluster(t)
	for attempt := 0; !wildcardFree(c.nodes[2].listen) || !wildcardFree(c.nodes[2].raft); attempt++ {
		if attempt == 20 {
			t.Fatalf("no ports free on every interface in 20 layouts")
		}
		c = newProcCluster(t)
	}
	n := c.nodes[2]
	_, listenPort, _ := net.SplitHostPort(n.listen)
	_, raftPort, _ := net.SplitHostPort(n.raft)
	c.extra[2] = []string{"--listen", "0.0.0.0:" + listenPort, "--advertise-addr", n.listen,
		"--raft-addr", "0.0.0.0:" + raftPort, "--raft-advertise-addr", n.raft}
	c.boot()
	for i, nd := range c.nodes {
		if _, err := nd.acquire(fmt.Sprintf("adv/%d", i), fmt.Sprintf("a%d", i), time.Minute, 0); err != nil {
			t.Fatalf("Acquire via node %d: %v", i+1, err)
		}
	}
	ctx, cancel := rpcCtx()
	defer cancel()
	resp, err := c.nodes[0].admin.ListNodes(ctx, connect.NewRequest(&wardenv1.ListNodesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, nd := range resp.Msg.GetNodes() {
		if nd.GetId() == 3 && (nd.GetListenAddr() != n.listen || nd.GetRaftAddr() != n.raft) {
			t.Errorf("node 3 registered listen %s, raft %s; want the advertised %s, %s", nd.GetListenAddr(), nd.GetRaftAddr(), n.listen, n.raft)
		}
		if !strings.HasPrefix(nd.GetVersion(), "dev") {
			t.Errorf("node %d's version %q, want the build's", nd.GetId(), nd.GetVersion())
		}
	}
}

// Whatever a config file holds, parsing refuses it or accepts it; it
// never panics, and never sets --insecure.
func FuzzConfigFile(f *testing.F) {
	f.Add("node-id: 1\nzone: az1\njoin: [a:1, b:2]\n")
	f.Add("insecure: true\n")
	f.Add("shutdown-wait: [1, {a: b}]\n")
	f.Add("- a\n- b\n")
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, body string) {
		p := filepath.Join(dir, "fuzz.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		var c cli
		k, err := parser(&c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := k.Parse([]string{"--config", p}); err == nil && c.Insecure {
			t.Fatalf("a config file set --insecure: %q", body)
		}
	})
}
