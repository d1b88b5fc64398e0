// Package deploytest holds what the deployment artifacts' tests share
// (deploy/...): skipping what this machine cannot run, loudly, and a
// clean WARDEN_ environment for parsing flags.
package deploytest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Need skips the test, saying why, when ok is false; under CI
// (CI=true) it fails instead, since .ci/run installs what the deploy
// tests need.
func Need(t testing.TB, ok bool, why string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI must be able to run this: %s", why)
	}
	t.Skipf("skipped: %s", why)
}

// Tool returns the path of the command tool, as Need would have it
// (why says how to install it).
func Tool(t testing.TB, tool, why string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	Need(t, err == nil, tool+" is not installed ("+why+")")
	return p
}

// ClearEnv unsets every WARDEN_ variable for the test (restored after
// it): flags parsed with wardend's definitions read them.
func ClearEnv(t *testing.T) {
	t.Helper()
	for _, e := range os.Environ() {
		if name, _, _ := strings.Cut(e, "="); strings.HasPrefix(name, "WARDEN_") {
			t.Setenv(name, "")
			os.Unsetenv(name)
		}
	}
}
