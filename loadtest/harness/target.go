// Package harness drives a lock service with an open-loop workload,
// records latencies in HDR histograms, checks every response for safety
// violations and writes the report. A Target adapts one service (Warden,
// etcd, ZooKeeper) to the workload's three operations.
package harness

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrHeld is returned by Target.Acquire when the lock is held by someone
// else and the call did not wait (or its wait ran out).
var ErrHeld = errors.New("lock held")

// ErrLost is returned by Target.Renew and Target.Release when the lease is
// no longer current: it expired, or the service says another holder has it.
var ErrLost = errors.New("lease lost")

// Lease is a granted lock as the harness tracks it.
type Lease struct {
	// Resource is the lock's name.
	Resource string
	// Token is the fencing token the service issued with the grant: it
	// must be strictly greater than every earlier grant's on Resource.
	Token uint64
	// TTL is the lease TTL the service granted (for ZooKeeper, the session
	// timeout).
	TTL time.Duration
	// Handle is the target's own reference (a lease id, a node path).
	Handle any
}

// HandleOf returns l's Handle as the target's own type H, or an error
// naming the target when the lease carries another type or a nil one
// (a lease from another target, or made up).
func HandleOf[H comparable](target string, l Lease) (H, error) {
	var zero H
	h, ok := l.Handle.(H)
	if !ok || h == zero {
		return zero, fmt.Errorf("%s: lease for %q has no %s handle", target, l.Resource, target)
	}
	return h, nil
}

// Costs says how many replicated writes (consensus commits in the
// service's own log) each successful operation costs a target, so that
// report figures compare like with like. Note explains what each side pays.
type Costs struct {
	Acquire, Renew, Release float64
	// Quota is the writes of each reserve, commit and reservation release.
	Quota float64
	Note  string
}

// Target is a lock service under load. Its methods are called from many
// goroutines at once. Every error other than ErrHeld and ErrLost is
// reported by its Code.
type Target interface {
	// Name is the target's short name for reports ("warden", "etcd").
	Name() string
	// Acquire takes the lock on resource with the given lease TTL. With
	// wait 0 it fails fast with ErrHeld when the lock is held; otherwise
	// it queues for up to wait.
	Acquire(ctx context.Context, resource string, ttl, wait time.Duration) (Lease, error)
	// Renew extends the lease by its TTL; ErrLost when it is not current.
	Renew(ctx context.Context, l Lease) error
	// Release ends the lease; ErrLost when it was not current any more.
	Release(ctx context.Context, l Lease) error
	// Costs reports the target's writes per operation.
	Costs() Costs
	// Close releases the target's connections.
	Close() error
}

// Coder is implemented by errors that carry a short code for the report
// ("unavailable", "deadline_exceeded"). Other errors are counted under
// "other", or "deadline_exceeded" when they wrap context.DeadlineExceeded.
type Coder interface {
	Code() string
}

// CodedError is an error reported under Kind, a short code such as
// "unavailable" or "deadline_exceeded" (it implements Coder).
type CodedError struct {
	Kind string
	Err  error
}

func (e CodedError) Error() string { return e.Kind + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e CodedError) Unwrap() error { return e.Err }

// Code implements Coder.
func (e CodedError) Code() string { return e.Kind }

// FaultKinds are the faults a Faulter may know, and MassExpiry, which the
// harness injects itself.
var FaultKinds = []string{"kill", "kill-leader", "restart", "snapshot", "transfer-leader", "backup", MassExpiry}

// Faulter is implemented by targets that can inject faults into the real
// processes behind them. Kinds: "kill" (SIGKILL one replica that is not
// the leader), "kill-leader", "restart" (start what was killed),
// "snapshot" (force a snapshot and log compaction on every replica),
// "transfer-leader", "backup" (take a whole backup, online).
type Faulter interface {
	Fault(ctx context.Context, kind string) error
}

// Measurer is implemented by a Faulter whose faults of some kinds
// measure what they did (a backup: its size and how long it took):
// Measure injects the fault as Fault does and returns the measure, for
// the report's detail.
type Measurer interface {
	Measure(ctx context.Context, kind string) (string, error)
}

// ErrExhausted is returned by QuotaTarget.Reserve when a limit refuses the
// reservation: an answer, not a failure.
var ErrExhausted = errors.New("quota exhausted")

// QuotaTarget is implemented by targets with quota reservations.
type QuotaTarget interface {
	// SetupQuota sets limits on pools × tenants keys named pool/tenant:
	// each pool's limit is poolLimit and each tenant's tenantLimit.
	SetupQuota(ctx context.Context, pools, tenants int, poolLimit, tenantLimit int64) error
	// Reserve reserves amount units of key for ttl; ErrExhausted when a
	// limit refuses it. The handle is passed to Commit or Release.
	Reserve(ctx context.Context, key string, amount int64, ttl time.Duration) (any, error)
	// Commit commits the whole reservation.
	Commit(ctx context.Context, reservation any) error
	// ReleaseReservation returns the reservation's units.
	ReleaseReservation(ctx context.Context, reservation any) error
}
