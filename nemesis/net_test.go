//go:build linux

package nemesis

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The test's network: one network namespace per node, each joined to a
// bridge in the root namespace by a veth pair, on a private /24 that no
// interface of the host uses. The root namespace holds the bridge's
// address; the proxy and the workload's clients live there. Nothing is
// routed anywhere else: the namespaces have no default route.
//
// Every name carries this test process's pid (wn<pid>-<i> for the
// namespaces, wn<pid>br for the bridge, wn<pid>h<i> for the veth ends),
// so two runs never collide, and a run that was killed before its
// cleanup leaves names whose pid is gone, which the next run removes.

// netlab is the namespaces and bridge of one run.
type netlab struct {
	t       *testing.T
	tag     string   // wn<pid>
	gateway string   // the bridge's address in the root namespace
	hosts   []string // node i's address, in namespace netns(i)
}

// ipCmd runs ip with args and fails the test on an error.
func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// netns is node i's namespace (0-based i).
func (l *netlab) netns(i int) string { return fmt.Sprintf("%s-%d", l.tag, i+1) }

// newNetlab creates n namespaces and the bridge joining them, and
// removes them when the test ends.
func newNetlab(t *testing.T, n int) *netlab {
	t.Helper()
	removeStale(t)
	l := &netlab{t: t, tag: fmt.Sprintf("wn%d", os.Getpid())}
	subnet := freeSubnet(t)
	l.gateway = subnet + ".1"
	bridge := l.tag + "br"
	t.Cleanup(func() { l.remove() })
	ipCmd(t, "link", "add", bridge, "type", "bridge")
	ipCmd(t, "addr", "add", l.gateway+"/24", "dev", bridge)
	ipCmd(t, "link", "set", bridge, "up")
	for i := range n {
		ns, host, peer := l.netns(i), fmt.Sprintf("%sh%d", l.tag, i+1), fmt.Sprintf("%sn%d", l.tag, i+1)
		addr := fmt.Sprintf("%s.%d", subnet, 11+i)
		ipCmd(t, "netns", "add", ns)
		ipCmd(t, "link", "add", host, "type", "veth", "peer", "name", peer)
		ipCmd(t, "link", "set", host, "master", bridge, "up")
		ipCmd(t, "link", "set", peer, "netns", ns)
		ipCmd(t, "-n", ns, "addr", "add", addr+"/24", "dev", peer)
		ipCmd(t, "-n", ns, "link", "set", peer, "up")
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
		l.hosts = append(l.hosts, addr)
	}
	return l
}

// remove deletes the run's namespaces (which takes their veth ends
// with them) and its bridge; what is already gone is no error.
func (l *netlab) remove() {
	for i := range l.hosts {
		_ = exec.Command("ip", "netns", "del", l.netns(i)).Run()
	}
	_ = exec.Command("ip", "link", "del", l.tag+"br").Run()
}

var (
	staleNetns  = regexp.MustCompile(`^wn(\d+)-\d+$`)
	staleBridge = regexp.MustCompile(`^\d+: wn(\d+)br[@:]`)
)

// removeStale deletes the namespaces and bridges of earlier runs whose
// process is gone (a run killed before its cleanup).
func removeStale(t *testing.T) {
	t.Helper()
	gone := func(pid string) bool {
		n, err := strconv.Atoi(pid)
		if err != nil || n == os.Getpid() {
			return false
		}
		_, err = os.Stat(fmt.Sprintf("/proc/%d", n))
		return os.IsNotExist(err)
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(line, " ")
		if m := staleNetns.FindStringSubmatch(name); m != nil && gone(m[1]) {
			t.Logf("removing namespace %s of an earlier run", name)
			_ = exec.Command("ip", "netns", "del", name).Run()
		}
	}
	out, _ = exec.Command("ip", "-o", "link", "show", "type", "bridge").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if m := staleBridge.FindStringSubmatch(line); m != nil && gone(m[1]) {
			t.Logf("removing bridge wn%sbr of an earlier run", m[1])
			_ = exec.Command("ip", "link", "del", "wn"+m[1]+"br").Run()
		}
	}
}

// freeSubnet picks 10.77.X (a /24) that no address of the root
// namespace is in.
func freeSubnet(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "-4", "-o", "addr", "show").Output()
	if err != nil {
		t.Fatalf("ip addr show: %v", err)
	}
	for x := 1 + os.Getpid()%200; x < 255; x++ {
		s := fmt.Sprintf("10.77.%d", x)
		if !strings.Contains(string(out), " "+s+".") {
			return s
		}
	}
	t.Fatal("no free 10.77.X.0/24 subnet")
	return ""
}

// silentTable is the nftables table of a namespace's silent cuts.
const silentTable = "wnsilent"

// silence makes node i's packets to and from the proxy ports in ports
// (the ports that lead to the nodes it is cut from) vanish, in its own
// namespace: its connections through them go silent, as in a real
// partition (no reset, no close; TCP retransmits with growing backoff
// and a dial's SYNs go unanswered), where a proxy cut closes them. An
// empty ports clears node i's silent cuts.
func (l *netlab) silence(i int, ports []string) {
	l.t.Helper()
	_ = exec.Command("ip", "netns", "exec", l.netns(i), "nft", "delete", "table", "inet", silentTable).Run()
	if len(ports) == 0 {
		return
	}
	set := strings.Join(ports, ", ")
	script := fmt.Sprintf(`table inet %s {
	chain out { type filter hook output priority 0; ip daddr %s tcp dport { %s } drop; }
	chain in { type filter hook input priority 0; ip saddr %s tcp sport { %s } drop; }
}
`, silentTable, l.gateway, set, l.gateway, set)
	cmd := exec.Command("ip", "netns", "exec", l.netns(i), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		l.t.Fatalf("nft in %s: %v\n%s", l.netns(i), err, out)
	}
}
