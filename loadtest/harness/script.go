package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// RunScript runs `bash script args...` with the current environment plus
// env ("KEY=VALUE" entries, which win over inherited ones), and waits for
// it; ctx ending kills it. Targets use it to drive the scripts that kill
// and restart their servers (Faulter). When the script fails, the error
// names the script and args and wraps the exit error, followed by the
// script's combined stdout and stderr with surrounding space trimmed. An
// empty script is an error that says so, without running anything.
func RunScript(ctx context.Context, script string, env []string, args ...string) error {
	if script == "" {
		return errors.New("no script to run (empty script path)")
	}
	cmd := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(append([]string{script}, args...), " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
