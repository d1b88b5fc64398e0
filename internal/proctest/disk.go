package proctest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// MountTmpfs mounts a tmpfs of size (mount's size= option, "160m") on
// dir, created if need be, and unmounts it when the test ends (after
// the processes using it are stopped, if their cleanup is registered
// later).
// It skips the test when the process cannot mount (not root; CI runs as
// root).
func MountTmpfs(t testing.TB, dir, size string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a size-limited tmpfs as a node's data directory needs root (CI runs as root)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("mounting a tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
}

// FillTo writes the file path so that about left bytes stay free on its
// filesystem (path's own blocks included, if it exists).
func FillTo(t testing.TB, path string, left uint64) {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Dir(path), &st); err != nil {
		t.Fatal(err)
	}
	free := st.Bavail * uint64(st.Bsize)
	if fi, err := os.Stat(path); err == nil {
		free += uint64(fi.Size())
	}
	if free <= left {
		t.Fatalf("%s has %d bytes free, not more than the %d to leave", filepath.Dir(path), free, left)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(free-left)); err != nil {
		t.Fatal(err)
	}
}
