package harness

import (
	"fmt"
	"sync"
	"time"
)

// Safety counts the violations the Checker saw. Each must be zero.
type Safety struct {
	// DoubleGrants counts grants of a lock answered while, by the
	// harness's own record, another lease on it was certainly current:
	// its grant answered, its release not yet sent, and within TTL of the
	// send time of its last acknowledged grant or renewal.
	DoubleGrants int64 `json:"double_grants"`
	// TokenRegressions counts grants whose fencing token was not strictly
	// greater than every token seen before on the resource.
	TokenRegressions int64 `json:"token_regressions"`
	// LostAcknowledgedLeases counts renewals and releases answered "not
	// current" for a lease that was certainly current until after the
	// answer arrived (so the service handled them while it was current).
	LostAcknowledgedLeases int64 `json:"lost_acknowledged_leases"`
	// Examples describes the first few violations.
	Examples []string `json:"examples,omitempty"`
}

// Checker watches every grant, renewal and release the workload sees and
// counts safety violations online (DESIGN.md rules 1, 2 and 4). Its view
// is conservative: a lease is "certainly current" from its grant's answer
// until send time + TTL of its last acknowledged grant or renewal, which
// every correct service honours (the service starts the TTL no earlier
// than it received the request). Clocks are one machine's, so no skew
// enters. It is safe for concurrent use.
type Checker struct {
	mu     sync.Mutex
	locks  map[string]*lockView
	safety Safety
}

type lockView struct {
	maxToken uint64
	holder   *leaseView
}

type leaseView struct {
	token        uint64
	acked        time.Time // when the grant's answer arrived
	certainUntil time.Time
	releasing    time.Time // when its release was sent; zero before
}

// NewChecker returns an empty checker.
func NewChecker() *Checker { return &Checker{locks: map[string]*lockView{}} }

const maxExamples = 10

func (c *Checker) violation(format string, args ...any) {
	if len(c.safety.Examples) < maxExamples {
		c.safety.Examples = append(c.safety.Examples, fmt.Sprintf(format, args...))
	}
}

// Granted records a grant of l whose request was sent at sent and answered
// at acked.
func (c *Checker) Granted(l Lease, sent, acked time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.locks[l.Resource]
	if v == nil {
		v = &lockView{}
		c.locks[l.Resource] = v
	}
	if l.Token <= v.maxToken {
		c.safety.TokenRegressions++
		c.violation("%s: token %d granted after token %d", l.Resource, l.Token, v.maxToken)
	}
	// Both leases were certainly current at once if the new grant was
	// answered before the old lease's certain interval ended.
	if h := v.holder; h != nil && (h.releasing.IsZero() || acked.Before(h.releasing)) && acked.Before(h.certainUntil) {
		c.safety.DoubleGrants++
		c.violation("%s: token %d granted at %s while token %d was current until %s",
			l.Resource, l.Token, acked.Format(time.StampMicro), h.token, h.certainUntil.Format(time.StampMicro))
	}
	v.maxToken = max(v.maxToken, l.Token)
	v.holder = &leaseView{token: l.Token, acked: acked, certainUntil: sent.Add(l.TTL)}
}

func (c *Checker) current(l Lease) *leaseView {
	if v := c.locks[l.Resource]; v != nil && v.holder != nil && v.holder.token == l.Token {
		return v.holder
	}
	return nil
}

// Renewed records a renewal of l sent at sent and answered at acked: nil
// err extends what the checker knows; ErrLost is a violation when l was
// certainly current until after acked. (A renewal sent in time but
// handled after the lease ran out, as an overloaded service may, is
// rightly answered lost.)
func (c *Checker) Renewed(l Lease, sent, acked time.Time, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.current(l)
	if h == nil {
		return
	}
	switch {
	case err == nil:
		if u := sent.Add(l.TTL); u.After(h.certainUntil) {
			h.certainUntil = u
		}
	case ErrorCode(err) == "lost" && h.releasing.IsZero() && acked.Before(h.certainUntil):
		c.safety.LostAcknowledgedLeases++
		c.violation("%s: renewal of token %d answered lost at %s; current until %s",
			l.Resource, l.Token, acked.Format(time.StampMicro), h.certainUntil.Format(time.StampMicro))
	}
}

// Releasing records that a release of l is sent at at: from then on a
// grant to someone else is legitimate.
func (c *Checker) Releasing(l Lease, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := c.current(l); h != nil && h.releasing.IsZero() {
		h.releasing = at
	}
}

// Released records the answer, at acked, to a release of l. ErrLost for a
// lease that was certainly current until after acked is a violation.
func (c *Checker) Released(l Lease, acked time.Time, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.current(l)
	if h == nil || ErrorCode(err) != "lost" {
		return
	}
	if acked.Before(h.certainUntil) {
		c.safety.LostAcknowledgedLeases++
		c.violation("%s: release of token %d answered lost at %s; current until %s",
			l.Resource, l.Token, acked.Format(time.StampMicro), h.certainUntil.Format(time.StampMicro))
	}
}

// Safety returns the counts so far.
func (c *Checker) Safety() Safety {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.safety
	s.Examples = append([]string(nil), s.Examples...)
	return s
}
