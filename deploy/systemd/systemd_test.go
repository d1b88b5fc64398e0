// Package systemd tests the unit files of deploy/systemd.
package systemd

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/warden-dev/warden/cmd/wardend/flags"
	"github.com/warden-dev/warden/deploy/deploytest"
)

var units = []string{"wardend.service", "warden-backup.service", "warden-backup.timer"}

// The units pass systemd-analyze verify in a root that has them in
// /etc/systemd/system, the real binaries in /usr/local/bin where they
// point, and the host's own units: no unknown key, no missing command,
// nothing printed. wardend.service's sandboxing rates OK (exposure 2 or
// less) by systemd-analyze security, and its hardening is what
// docs/operations.md promises.
func TestUnitsVerify(t *testing.T) {
	_, err := exec.LookPath("systemd-analyze")
	deploytest.Need(t, err == nil, "systemd-analyze is not installed (Debian's systemd)")
	system := "/usr/lib/systemd/system"
	if _, err := os.Stat(filepath.Join(system, "sysinit.target")); err != nil {
		system = "/lib/systemd/system"
	}
	_, err = os.Stat(filepath.Join(system, "sysinit.target"))
	deploytest.Need(t, err == nil, "no systemd units on this machine to verify against")

	root := t.TempDir()
	for _, d := range []string{"etc/systemd/system", "usr/local/bin", "bin", "usr/lib/systemd", "etc/warden"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range units {
		copyFile(t, u, filepath.Join(root, "etc/systemd/system", u), 0o644)
	}
	copyFile(t, "backup.env", filepath.Join(root, "etc/warden/backup.env"), 0o600)
	kill, err := exec.LookPath("kill")
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, kill, filepath.Join(root, "bin/kill"), 0o755)
	if out, err := exec.Command("cp", "-a", system, filepath.Join(root, "usr/lib/systemd/system")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(root, "usr/local/bin")+"/", "./cmd/wardend", "./cmd/warden")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	out, err := exec.Command("systemd-analyze", append([]string{"verify", "--root=" + root}, units...)...).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, _ = exec.Command("systemd-analyze", "security", "--offline=true", "--root="+root, "wardend.service").CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for wardend.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security printed no exposure level:\n%s", out)
	}
	if level, _ := strconv.ParseFloat(string(m[1]), 64); level > 2 {
		t.Fatalf("wardend.service's exposure level is %.1f, above 2:\n%s", level, out)
	}
	t.Logf("wardend.service: systemd-analyze security exposure %s", m[1])

	keys := unitKeys(t, "wardend.service")
	for key, want := range map[string]string{
		"User": "warden", "StateDirectory": "warden", "ProtectSystem": "strict", "NoNewPrivileges": "true",
		"PrivateTmp": "true", "CapabilityBoundingSet": "", "ExecReload": "/bin/kill -HUP $MAINPID",
		"ExecStart": "/usr/local/bin/wardend --config /etc/warden/wardend.yaml",
	} {
		if got, ok := keys[key]; !ok || got != want {
			t.Errorf("wardend.service %s=%q, want %q", key, got, want)
		}
	}
}

// unitKeys reads a unit's key=value lines (the last of a repeated key).
func unitKeys(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			out[k] = v
		}
	}
	return out
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}

// The example config and environment are wardend's: the YAML file parses
// with wardend's own flag definitions into a complete node 1, and every
// variable the environment file names (commented out or not) is a flag's.
func TestExampleConfig(t *testing.T) {
	deploytest.ClearEnv(t)
	var c flags.CLI
	k, err := flags.Parser(&c, "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Parse([]string{"--config", "wardend.yaml"}); err != nil {
		t.Fatalf("wardend.yaml: %v", err)
	}
	if c.NodeID != 1 || c.Zone != "az1" || c.DataDir != "/var/lib/warden" || c.Advertise == "" || c.RaftAdvertise == "" || c.PeerCert == "" || c.InitialMembers == "" {
		t.Fatalf("wardend.yaml parsed to %+v", c)
	}
	envs := map[string]bool{}
	for _, f := range k.Model.Flags {
		for _, e := range f.Envs {
			envs[e] = true
		}
	}
	b, err := os.ReadFile("wardend.env")
	if err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`(?m)^#?(WARDEN_[A-Z_]+)=`).FindAllStringSubmatch(string(b), -1)
	if len(names) == 0 {
		t.Fatal("wardend.env names no variable")
	}
	for _, n := range names {
		if !envs[n[1]] {
			t.Errorf("wardend.env: %s is no wardend flag's variable", n[1])
		}
	}
}
