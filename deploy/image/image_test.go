// Package image tests the container image that make image builds from
// the repository's Containerfile.
package image

import (
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warden-dev/warden/deploy/deploytest"
)

func run(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// freePort returns a loopback port free now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// make image builds an OCI image offline (FROM scratch, with buildah)
// that holds the two static binaries, the passwd and group files and
// an empty /data owned by warden (65532), nothing else (no shell, no
// libraries); its config runs wardend as 65532 with /data a volume.
// Mounted and entered with chroot as that user, wardend --version runs,
// and a dev cluster starts from /data and answers /readyz.
func TestImage(t *testing.T) {
	_, err := exec.LookPath("buildah")
	deploytest.Need(t, err == nil, "buildah is not installed (Debian's buildah builds the FROM scratch image offline)")
	deploytest.Need(t, os.Geteuid() == 0, "not root: buildah's storage and chroot need it")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tag := fmt.Sprintf("localhost/warden-test:%d", os.Getpid())
	run(t, root, "make", "image", "IMAGE="+tag)
	t.Cleanup(func() { _ = exec.Command("buildah", "rmi", "-f", tag).Run() })

	var cfg struct {
		OCIv1 struct {
			Config struct {
				User       string
				Entrypoint []string
				Volumes    map[string]struct{}
			}
		}
	}
	if err := json.Unmarshal([]byte(run(t, root, "buildah", "inspect", "--type", "image", tag)), &cfg); err != nil {
		t.Fatal(err)
	}
	c := cfg.OCIv1.Config
	if _, vol := c.Volumes["/data"]; c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/wardend"}) || !vol {
		t.Fatalf("image config: user %q, entrypoint %v, volumes %v", c.User, c.Entrypoint, c.Volumes)
	}

	ctr := run(t, root, "buildah", "from", "--pull-never", tag)
	t.Cleanup(func() { _ = exec.Command("buildah", "rm", ctr).Run() })
	mnt := run(t, root, "buildah", "mount", ctr)
	t.Cleanup(func() { _ = exec.Command("buildah", "umount", ctr).Run() })

	var files []string
	err = filepath.WalkDir(mnt, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(mnt, p)
		files = append(files, "/"+rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	if want := []string{"/etc/group", "/etc/passwd", "/usr/local/bin/warden", "/usr/local/bin/wardend"}; !slices.Equal(files, want) {
		t.Fatalf("the image holds %v, want only %v", files, want)
	}
	for _, b := range []string{"wardend", "warden"} {
		f, err := elf.Open(filepath.Join(mnt, "usr/local/bin", b))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("%s is dynamically linked (%v): it needs a library the image does not have", b, p.Type)
			}
		}
		f.Close()
	}
	if owner := run(t, root, "stat", "-c", "%u:%g", filepath.Join(mnt, "data")); owner != "65532:65532" {
		t.Fatalf("/data is owned by %s, want 65532:65532", owner)
	}

	as := "--userspec=65532:65532"
	if v := run(t, root, "chroot", as, mnt, "/usr/local/bin/wardend", "--version"); !strings.HasPrefix(v, "wardend ") {
		t.Fatalf("wardend --version printed %q", v)
	}
	addr := freePort(t)
	dev := exec.Command("chroot", as, mnt, "/usr/local/bin/wardend", "--dev", "--data-dir", "/data/dev", "--listen", addr)
	log, err := os.CreateTemp(t.TempDir(), "wardend-*.log")
	if err != nil {
		t.Fatal(err)
	}
	dev.Stdout, dev.Stderr = log, log
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dev.Process.Kill(); _ = dev.Wait() })
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Logf("a dev cluster in the image's root, as 65532: /readyz %s", body)
				break
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(log.Name())
			t.Fatalf("the dev cluster in the image never turned ready: %v\n%s", err, b)
		}
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", dev.Process.Pid))
	if err != nil || !strings.Contains(string(status), "Uid:\t65532\t65532\t65532\t65532") {
		t.Fatalf("wardend does not run as 65532: %v\n%s", err, status)
	}
	if owner := run(t, root, "stat", "-c", "%u", filepath.Join(mnt, "data/dev/dev-cluster.json")); owner != "65532" {
		t.Fatalf("the dev cluster's files are owned by %s", owner)
	}
}
