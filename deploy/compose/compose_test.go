// Package compose tests deploy/compose/compose.yaml, which this machine
// cannot run (no container engine): its structure, and that what it
// asks of wardend and warden works.
package compose

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/warden-dev/warden/auth"
	"github.com/warden-dev/warden/cmd/wardend/flags"
	"github.com/warden-dev/warden/deploy/deploytest"
)

// service is the part of a compose service the test reads.
type service struct {
	Image      string
	Entrypoint []string
	Command    []string
	Hostname   string
	Ports      []string
	Volumes    []string
	DependsOn  map[string]struct{ Condition string } `yaml:"depends_on"`
}

// The compose file starts three nodes in three zones, each with its own
// data volume and port, after two init services that write the TLS
// material and the admin token with warden itself. Run here as the file
// runs them (the init commands with the warden binary, the certs volume
// a directory), the TLS material has every file the nodes' flags name,
// each node's certificates name its host, auth.json loads with the
// token, and every node's flags parse with wardend's own definitions,
// with --initial-members naming each node as it advertises itself.
func TestCompose(t *testing.T) {
	deploytest.ClearEnv(t)
	b, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Services map[string]service
		Volumes  map[string]any
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}

	// The init services, run as the file runs them: /data is the certs
	// volume.
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/warden")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	certs := t.TempDir()
	for _, name := range []string{"init-tls", "init-token"} {
		s := file.Services[name]
		if !slices.Equal(s.Entrypoint, []string{"/usr/local/bin/warden"}) || !slices.Contains(s.Volumes, "certs:/data") {
			t.Fatalf("%s: %+v", name, s)
		}
		var args []string
		for _, a := range s.Command {
			args = append(args, strings.ReplaceAll(a, "/data", certs))
		}
		if out, err := exec.Command(filepath.Join(bin, "warden"), args...).CombinedOutput(); err != nil {
			t.Fatalf("%s: warden %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	if file.Services["init-token"].DependsOn["init-tls"].Condition != "service_completed_successfully" {
		t.Error("init-token must wait for init-tls")
	}
	inCerts := func(p string) string { return filepath.Join(certs, strings.TrimPrefix(p, "/certs/")) }
	bootstrap, err := os.ReadFile("auth.json")
	if err != nil {
		t.Fatal(err)
	}
	st, err := auth.ParseBootstrap(bootstrap, 0, func(f string) (string, error) {
		b, err := os.ReadFile(inCerts(f))
		return strings.TrimSpace(string(b)), err
	})
	if err != nil || len(st.GetTokens()) != 1 {
		t.Fatalf("auth.json with the token init-token wrote: %v %v", st, err)
	}

	type member struct{ raft, listen string }
	members := map[uint64]member{}
	zones, ports := map[string]bool{}, map[string]bool{}
	var initial string
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("node%d", i)
		s, ok := file.Services[name]
		if !ok {
			t.Fatalf("no service %s", name)
		}
		if s.Hostname != name || s.DependsOn["init-token"].Condition != "service_completed_successfully" || len(s.Ports) != 1 ||
			!slices.Contains(s.Volumes, fmt.Sprintf("data%d:/data", i)) || !slices.Contains(s.Volumes, "certs:/certs:ro") || !slices.Contains(s.Volumes, "./auth.json:/etc/warden/auth.json:ro") {
			t.Errorf("%s: %+v", name, s)
		}
		if _, ok := file.Volumes[fmt.Sprintf("data%d", i)]; !ok {
			t.Errorf("volume data%d is not declared", i)
		}
		ports[s.Ports[0]] = true
		var c flags.CLI
		k, err := flags.Parser(&c, "test")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := k.Parse(s.Command); err != nil {
			t.Fatalf("%s: wardend refuses its flags: %v", name, err)
		}
		if c.NodeID == 0 || c.Zone == "" || c.Insecure || c.AuthBootstrap != "/etc/warden/auth.json" || !strings.HasPrefix(c.DataDir, "/data/") {
			t.Errorf("%s: flags %+v", name, c)
		}
		zones[c.Zone] = true
		members[c.NodeID] = member{c.RaftAdvertise, c.Advertise}
		if initial != "" && c.InitialMembers != initial {
			t.Errorf("%s: --initial-members differs", name)
		}
		initial = c.InitialMembers
		for _, f := range []string{c.TLSCert, c.TLSKey, c.TLSClientCA, c.PeerCA, c.PeerCert, c.PeerKey} {
			if _, err := os.Stat(inCerts(f)); err != nil {
				t.Errorf("%s: %s is not among what init-tls wrote: %v", name, f, err)
			}
		}
		for _, f := range []string{c.TLSCert, c.PeerCert} {
			if hosts := certHosts(t, inCerts(f)); !slices.Contains(hosts, name) {
				t.Errorf("%s: %s names %v, not the node's host", name, f, hosts)
			}
		}
	}
	if len(zones) != 3 || len(ports) != 3 || len(members) != 3 {
		t.Errorf("zones %v, ports %v, nodes %v: want three of each", zones, ports, members)
	}
	var want []string
	for id := uint64(1); id <= 3; id++ {
		want = append(want, fmt.Sprintf("%d=%s=%s", id, members[id].raft, members[id].listen))
	}
	if initial != strings.Join(want, ",") {
		t.Errorf("--initial-members %q, want %q", initial, strings.Join(want, ","))
	}
}

// certHosts returns the DNS names a PEM certificate file names.
func certHosts(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s holds no PEM", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.DNSNames
}
