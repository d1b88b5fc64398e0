package harness

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// MassExpiry is the fault kind the harness injects itself, on any target
// (case L21 of shared/cases/locks.md, after ZOOKEEPER-1669): a fleet
// takes MassExpiryConfig.Leases leases at once and is cut off, so they
// all expire together while the profile's clients go on.
const MassExpiry = "mass-expiry"

// MassExpiryConfig sizes the mass-expiry fault.
type MassExpiryConfig struct {
	// Leases is the fleet's lease count (default 20,000, the case's).
	Leases int
	// TTL is their lease TTL (default 10 s: long enough for the fleet to
	// take them all before the first expires, so they expire together).
	TTL time.Duration
	// Workers is the fleet's concurrency (default 64).
	Workers int
}

func (c MassExpiryConfig) withDefaults() MassExpiryConfig {
	if c.Leases == 0 {
		c.Leases = 20_000
	}
	if c.TTL == 0 {
		c.TTL = 10 * time.Second
	}
	if c.Workers == 0 {
		c.Workers = 64
	}
	return c
}

// massExpiry takes the fleet's leases on resources of their own, never
// renews them, and once the last one's TTL has passed, acquires each
// resource again (without waiting) until every one is granted: the
// moment the last is granted is when the last lease had expired, as far
// as a client can see. It returns how long after the last lease's expiry
// that was. The fleet's calls are not recorded with the profile's.
func massExpiry(ctx context.Context, t Target, cfg MassExpiryConfig, run string) (string, error) {
	cfg = cfg.withDefaults()
	resource := func(i int) string { return fmt.Sprintf("mass-expiry/%s/%06d", run, i) }
	var last atomic.Int64 // Unix ns of the last grant
	forEach := func(f func(i int) error) error {
		next := atomic.Int64{}
		var wg sync.WaitGroup
		errs := make(chan error, cfg.Workers)
		for range cfg.Workers {
			wg.Go(func() {
				for i := int(next.Add(1)) - 1; i < cfg.Leases; i = int(next.Add(1)) - 1 {
					if err := f(i); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		return <-errs // the first, if any
	}
	start := time.Now()
	if err := forEach(func(i int) error {
		for ctx.Err() == nil {
			_, err := t.Acquire(ctx, resource(i), cfg.TTL, 0)
			if err == nil {
				last.Store(max(last.Load(), time.Now().UnixNano()))
				return nil
			}
			if !retryable(err) {
				return fmt.Errorf("mass-expiry: acquire %s: %w", resource(i), err)
			}
		}
		return ctx.Err()
	}); err != nil {
		return "", err
	}
	taking := time.Since(start)
	expiry := time.Unix(0, last.Load()).Add(cfg.TTL)
	select {
	case <-ctx.Done():
		return "", ctx.Err()
	case <-time.After(time.Until(expiry)):
	}
	var freed atomic.Int64 // Unix ns of the last resource found free
	if err := forEach(func(i int) error {
		for ctx.Err() == nil {
			l, err := t.Acquire(ctx, resource(i), cfg.TTL, 0)
			if err == nil {
				freed.Store(max(freed.Load(), time.Now().UnixNano()))
				if err := t.Release(ctx, l); err != nil && !retryable(err) && !errors.Is(err, ErrLost) {
					return fmt.Errorf("mass-expiry: release %s: %w", resource(i), err)
				}
				return nil
			}
			if !errors.Is(err, ErrHeld) && !retryable(err) {
				return fmt.Errorf("mass-expiry: acquire %s again: %w", resource(i), err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return ctx.Err()
	}); err != nil {
		return "", err
	}
	after := time.Unix(0, freed.Load()).Sub(expiry)
	return fmt.Sprintf("%d leases of %v taken in %.1f s; the last was free %.2f s after the last one's expiry", cfg.Leases, cfg.TTL, taking.Seconds(), after.Seconds()), nil
}

// retryable reports whether err is an answer a client retries: the
// target unavailable, or a call that ran out of time.
func retryable(err error) bool {
	var c Coder
	if errors.As(err, &c) {
		return c.Code() == "unavailable" || c.Code() == "deadline_exceeded"
	}
	return errors.Is(err, context.DeadlineExceeded)
}
