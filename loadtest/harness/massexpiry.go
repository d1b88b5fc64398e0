package harness

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// massExpiry takes the fleet's leases on resources of their own and
// never renews them. Then, for a sample of 1,000 of them (every one, for
// a smaller fleet), it acquires the resource again (without waiting) from
// the moment its lease's TTL has passed, every 20 ms until granted: how
// late each was free says how far expiry fell behind. Last, one pass over
// the whole fleet checks that every lease has expired. It reports the
// sample's lateness (which includes the target's own clock-skew margin,
// 500 ms for Warden). The fleet's calls are not recorded with the
// profile's.
func massExpiry(ctx context.Context, t Target, cfg MassExpiryConfig, run string) (string, error) {
	cfg = cfg.withDefaults()
	resource := func(i int) string { return fmt.Sprintf("mass-expiry/%s/%06d", run, i) }
	forEach := func(n int, f func(i int) error) error {
		next := atomic.Int64{}
		var wg sync.WaitGroup
		errs := make(chan error, cfg.Workers)
		for range cfg.Workers {
			wg.Go(func() {
				for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
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
	// retake acquires resource i once it is free (its lease has expired),
	// releases it, and returns when it was granted.
	retake := func(i int) (time.Time, error) {
		for ctx.Err() == nil {
			l, err := t.Acquire(ctx, resource(i), cfg.TTL, 0)
			if err == nil {
				at := time.Now()
				if err := t.Release(ctx, l); err != nil && !retryable(err) && !errors.Is(err, ErrLost) {
					return at, fmt.Errorf("mass-expiry: release %s: %w", resource(i), err)
				}
				return at, nil
			}
			if !errors.Is(err, ErrHeld) && !retryable(err) {
				return time.Time{}, fmt.Errorf("mass-expiry: acquire %s again: %w", resource(i), err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return time.Time{}, ctx.Err()
	}
	expires := make([]time.Time, cfg.Leases) // no earlier than the target's expiry
	start := time.Now()
	if err := forEach(cfg.Leases, func(i int) error {
		for ctx.Err() == nil {
			_, err := t.Acquire(ctx, resource(i), cfg.TTL, 0)
			if err == nil {
				expires[i] = time.Now().Add(cfg.TTL)
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
	every := max(1, cfg.Leases/1000)
	late := make([]time.Duration, (cfg.Leases+every-1)/every)
	if err := forEach(len(late), func(k int) error {
		i := k * every
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(expires[i])):
		}
		at, err := retake(i)
		late[k] = at.Sub(expires[i])
		return err
	}); err != nil {
		return "", err
	}
	if err := forEach(cfg.Leases, func(i int) error {
		if i%every == 0 {
			return nil // sampled: already taken again
		}
		_, err := retake(i)
		return err
	}); err != nil {
		return "", err
	}
	slices.Sort(late)
	return fmt.Sprintf("%d leases of %v taken in %.1f s; %d of them free %.2f s (median), %.2f s (p99), %.2f s (max) after their expiry",
		cfg.Leases, cfg.TTL, taking.Seconds(), len(late), late[len(late)/2].Seconds(), late[len(late)*99/100].Seconds(), late[len(late)-1].Seconds()), nil
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
