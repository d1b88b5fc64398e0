package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warden-dev/warden/client"
)

// Exit statuses of warden lock run besides the command's own, after
// timeout(1)'s and env(1)'s.
const (
	runLeaseLost     = 124 // the lease could not be kept: the command was stopped
	runFailed        = 125 // lock run failed before starting the command
	runNotExecutable = 126
	runNotFound      = 127
)

type lockRunCmd struct {
	Resource     string        `arg:"" help:"Resource to lock."`
	Command      []string      `arg:"" passthrough:"" help:"The command to run while the lock is held, with its arguments, after --."`
	TTL          time.Duration `name:"ttl" default:"30s" help:"Lease TTL; the lease is renewed every third of it while the command runs."`
	Wait         time.Duration `help:"How long to wait in the lock's queue when it is held (0: fail at once, status 125)."`
	Holder       string        `help:"Free text recorded as the holder (default: this host and process)."`
	Tenant       string        `help:"Tenant the wait counts against."`
	SafetyMargin time.Duration `name:"safety-margin" help:"How long before the lease's local deadline the command is stopped when renewals fail (default: the SDK's, TTL/10 and at least 100ms)."`
	Grace        time.Duration `help:"How long the command has after SIGTERM to exit before SIGKILL, once the lease is lost; must fit in --safety-margin, so the command is dead before the server could grant the lock to another (default: half the margin)."`
	// PassCredentials keeps the caller's Warden credentials in the
	// command's environment (credentialEnv), which lock run removes by
	// default: the command, and whatever it starts, would act as the
	// caller.
	PassCredentials bool `name:"pass-credentials" help:"Leave WARDEN_TOKEN, WARDEN_TOKEN_FILE, WARDEN_CERT and WARDEN_KEY in the command's environment (by default they are removed: the command would act as you)."`
}

// credentialEnv are the environment variables that hold or name the
// caller's Warden credentials, which lock run's command does not get
// unless --pass-credentials.
var credentialEnv = []string{"WARDEN_TOKEN", "WARDEN_TOKEN_FILE", "WARDEN_CERT", "WARDEN_KEY"}

// childEnv is the environment of lock run's command: environ (the
// caller's), without its Warden credentials unless pass, and with
// WARDEN_RESOURCE and WARDEN_FENCING_TOKEN.
func childEnv(environ []string, pass bool, resource string, token uint64) []string {
	env := make([]string, 0, len(environ)+2)
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !pass && slices.Contains(credentialEnv, name) {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "WARDEN_RESOURCE="+resource, "WARDEN_FENCING_TOKEN="+strconv.FormatUint(token, 10))
}

// margins returns the safety margin and the grace lock run uses: the
// SDK's default margin unless given, and half of it unless given; a
// grace beyond the margin is refused.
func (l *lockRunCmd) margins() (margin, grace time.Duration, err error) {
	margin = l.SafetyMargin
	if margin == 0 {
		margin = max(l.TTL/10, 100*time.Millisecond)
	}
	grace = l.Grace
	if grace == 0 {
		grace = margin / 2
	}
	if grace > margin || margin >= l.TTL {
		return 0, 0, fmt.Errorf("--grace %v must fit in the safety margin %v (and the margin in --ttl %v): the command must be dead before the lease's local deadline; lower --grace or raise --safety-margin", grace, margin, l.TTL)
	}
	return margin, grace, nil
}

// Run acquires the lock, runs the command while renewing the lease, and
// ends with the command's status; when the lease can no longer be
// renewed in time (Lease.Done, a safety margin before the local
// deadline) it stops the command (SIGTERM to its process group, SIGKILL
// after --grace) and ends with 124. The command's environment gets
// WARDEN_RESOURCE and WARDEN_FENCING_TOKEN, never the lease id (a
// bearer secret every process it starts would see), nor the caller's
// credentials unless --pass-credentials (childEnv). SIGINT and SIGTERM
// are passed on to the command.
func (l *lockRunCmd) Run(g *globals) error {
	failed := func(err error) error {
		return &exitError{status: runFailed, err: fmt.Errorf("lock run %s: %w", l.Resource, err)}
	}
	margin, grace, err := l.margins()
	if err != nil {
		return failed(err)
	}
	if len(l.Command) > 0 && l.Command[0] == "--" { // kong passes the separator on
		l.Command = l.Command[1:]
	}
	if len(l.Command) == 0 {
		return failed(errors.New("no command given (warden lock run RESOURCE -- CMD ARGS…)"))
	}
	path, err := exec.LookPath(l.Command[0])
	switch {
	case errors.Is(err, exec.ErrNotFound):
		return &exitError{status: runNotFound, err: fmt.Errorf("lock run: %w", err)}
	case err != nil:
		return &exitError{status: runNotExecutable, err: fmt.Errorf("lock run: %w", err)}
	}
	c, err := g.sdk()
	if err != nil {
		return failed(err)
	}
	holder := l.Holder
	if holder == "" {
		host, _ := os.Hostname()
		holder = fmt.Sprintf("warden lock run on %s, pid %d", host, os.Getpid())
	}
	lockCtx, cancel := context.WithTimeout(g.root, l.Wait+g.Timeout)
	lease, err := c.Lock(lockCtx, l.Resource, client.LockOptions{TTL: l.TTL, Wait: l.Wait, Holder: holder, Tenant: l.Tenant, SafetyMargin: margin})
	cancel()
	if err != nil {
		_ = c.Close(context.Background())
		return failed(err)
	}
	defer func() {
		if lease.Err() != nil {
			// Lost, or uncertain with the nodes out of reach: a release
			// would wait on them, and the lease ends at its TTL anyway.
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), g.Timeout)
		defer cancel()
		if err := lease.Unlock(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "warden: lock run %s: release: %v (the lease ends at its TTL)\n", l.Resource, err)
		}
		_ = c.Close(ctx)
	}()

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	cmd := exec.Command(path, l.Command[1:]...)
	cmd.Args[0] = l.Command[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = childEnv(os.Environ(), l.PassCredentials, l.Resource, lease.Token())
	// Its own process group: what it starts is stopped with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return &exitError{status: runNotExecutable, err: fmt.Errorf("lock run: %w", err)}
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	group := func(s syscall.Signal) { _ = syscall.Kill(-cmd.Process.Pid, s) }
	for {
		select {
		case err := <-exited:
			return childStatus(err)
		case s := <-sigs:
			group(s.(syscall.Signal))
		case <-lease.Done():
			group(syscall.SIGTERM)
			kill := time.AfterFunc(grace, func() { group(syscall.SIGKILL) })
			<-exited
			kill.Stop()
			return &exitError{status: runLeaseLost, err: fmt.Errorf("lock run %s: the lease could not be kept (%v): the command was stopped before its local deadline", l.Resource, lease.Err())}
		}
	}
}

// childStatus is the exit of warden lock run after the command ended
// with err (exec.Cmd.Wait's): its status, or 128 + the signal that
// killed it, as shells report it.
func childStatus(err error) error {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		if err != nil {
			return &exitError{status: runFailed, err: err}
		}
		return nil
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return &exitError{status: 128 + int(ws.Signal())}
	}
	return &exitError{status: ee.ExitCode()}
}
