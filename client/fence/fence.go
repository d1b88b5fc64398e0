// Package fence protects a resource from writers whose lock has already
// passed to someone else.
//
// A lease decides when someone else may be granted the lock; a fencing
// token decides whether an old holder's work is still accepted. A client
// paused past its lease (a GC pause, a stalled VM, a partition) wakes up
// believing it still holds the lock; only the protected resource can stop
// its late write, by remembering the highest token it has accepted and
// refusing lower ones (Kleppmann, "How to do distributed locking", 2016).
//
// A Guard does that check atomically, per resource name. Equal tokens are
// accepted, so one holder may write many times; a lower token is refused
// with a *StaleTokenError and counted in warden_fencing_rejections_total (see RegisterMetrics).
//
// Two Guards are provided: Memory, for a resource that lives in one
// process, and SQL, which keeps the highest token in a PostgreSQL table
// and must be checked in the same transaction as the write it protects.
// When the protected rows can carry the token themselves, the same rule is
// one conditional statement:
//
//	UPDATE orders SET ..., fence_token = $1 WHERE id = $2 AND fence_token <= $1
//
// and zero rows updated means the writer's token is stale.
package fence

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrStaleToken is matched (errors.Is) by every *StaleTokenError.
var ErrStaleToken = errors.New("fence: stale fencing token")

// ErrTokenRange: a token of 2^63 or more cannot be stored in a signed
// BIGINT. Warden never issues one.
var ErrTokenRange = errors.New("fence: fencing token does not fit a signed 64-bit integer")

// StaleTokenError refuses a write: its token is lower than the highest the
// resource has accepted. The writer's lease has ended; it must stop.
type StaleTokenError struct {
	Resource string
	Token    uint64
	// Highest is the highest token accepted so far, when the guard knows
	// it (0 otherwise).
	Highest uint64
}

func (e *StaleTokenError) Error() string {
	if e.Highest == 0 {
		return fmt.Sprintf("fence: %s refused token %d: a higher token was accepted", e.Resource, e.Token)
	}
	return fmt.Sprintf("fence: %s refused token %d: token %d was accepted", e.Resource, e.Token, e.Highest)
}

// Is makes errors.Is(err, ErrStaleToken) true.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// rejections counts refused writes; nothing serves it unless the caller
// registers it (RegisterMetrics).
var rejections = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "warden_fencing_rejections_total",
	Help: "Writes refused by a fence because their fencing token was lower than the highest accepted.",
}, []string{"guard"})

// RegisterMetrics adds the fence's metric, warden_fencing_rejections_total
// by guard, to reg (prometheus.DefaultRegisterer to serve it with the
// process's others). The fence counts whether or not it is registered;
// importing the package registers nothing.
func RegisterMetrics(reg prometheus.Registerer) error { return reg.Register(rejections) }

func reject(guard, resource string, token, highest uint64) error {
	rejections.WithLabelValues(guard).Inc()
	return &StaleTokenError{Resource: resource, Token: token, Highest: highest}
}

// Memory is a Guard for resources that live in one process. The zero
// value is ready to use; it is safe for concurrent use.
type Memory struct {
	mu      sync.Mutex
	highest map[string]uint64
}

// Check accepts token for resource if it is at least the highest accepted
// so far, and remembers it. A lower token gets a *StaleTokenError. The
// check and the update are one atomic step; the caller's write must
// happen under the same guarantee (hold its own lock across Check and the
// write, or use Do).
func (m *Memory) Check(resource string, token uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.checkLocked(resource, token)
}

func (m *Memory) checkLocked(resource string, token uint64) error {
	if token > math.MaxInt64 {
		return ErrTokenRange
	}
	if h := m.highest[resource]; token < h {
		return reject("memory", resource, token, h)
	}
	if m.highest == nil {
		m.highest = map[string]uint64{}
	}
	m.highest[resource] = token
	return nil
}

// Do runs write only if token passes the check, atomically with it: no
// write with a lower token can start while write runs. It returns the
// check's error or write's.
func (m *Memory) Do(resource string, token uint64, write func() error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(resource, token); err != nil {
		return err
	}
	return write()
}
