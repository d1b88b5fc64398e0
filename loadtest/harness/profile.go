package harness

import (
	"fmt"
	"time"
)

// Profile is a workload. Rates are per second of wall time; the steady
// phase runs them as independent Poisson arrival streams (open loop).
type Profile struct {
	// Name is "reference", "contended" or "quota".
	Name string `json:"name"`
	// Scale is the factor applied to the reference figures.
	Scale float64 `json:"scale"`
	// HeldLocks is how many uncontended locks are held at once (renewed
	// every RenewEvery); Resources is how many names they are drawn from.
	HeldLocks int `json:"held_locks"`
	Resources int `json:"resources"`
	// AcquireRate and ReleaseRate are the uncontended acquires and
	// releases per second.
	AcquireRate float64 `json:"acquire_rate"`
	ReleaseRate float64 `json:"release_rate"`
	// RenewEvery is the renewal period of a held lock, with ±RenewJitter
	// (a fraction) of uniform jitter; LeaseTTL the lease TTL asked for.
	RenewEvery  time.Duration `json:"renew_every"`
	RenewJitter float64       `json:"renew_jitter"`
	LeaseTTL    time.Duration `json:"lease_ttl"`
	// HotResources are contended locks; ContendedRate acquires per second
	// queue on them (up to WaitTimeout) and hold each grant for HoldTime.
	HotResources  int           `json:"hot_resources"`
	ContendedRate float64       `json:"contended_rate"`
	HoldTime      time.Duration `json:"hold_time"`
	WaitTimeout   time.Duration `json:"wait_timeout"`
	// QuotaRate reservations per second are spread over QuotaPools pools
	// of QuotaTenants tenants; each is committed (CommitShare of them) or
	// released after a hold drawn uniformly from [0, HoldTime).
	QuotaRate    float64 `json:"quota_rate"`
	QuotaPools   int     `json:"quota_pools"`
	QuotaTenants int     `json:"quota_tenants"`
	CommitShare  float64 `json:"commit_share"`
}

// Reference is DESIGN.md's reference workload at the given scale: 20,000
// held locks over 100,000 resources, each renewed every 10 s ± 10 %, with
// 2,000 acquires and 2,000 releases per second: about 6,000 state changes
// per second at scale 1.
func Reference(scale float64) Profile {
	return Profile{
		Name:        "reference",
		Scale:       scale,
		HeldLocks:   int(20000 * scale),
		Resources:   int(100000 * scale),
		AcquireRate: 2000 * scale,
		ReleaseRate: 2000 * scale,
		RenewEvery:  10 * time.Second,
		RenewJitter: 0.1,
		LeaseTTL:    30 * time.Second,
	}
}

// Contended is a quarter of the reference workload in the background plus
// 500 × scale acquires per second queueing on 50 × scale hot resources,
// each grant held for 10 ms: every hot lock always has waiters.
func Contended(scale float64) Profile {
	p := Reference(scale / 4)
	p.Name, p.Scale = "contended", scale
	p.HotResources = max(1, int(50*scale))
	p.ContendedRate = 500 * scale
	p.HoldTime = 10 * time.Millisecond
	p.WaitTimeout = 10 * time.Second
	return p
}

// Quota is a quarter of the reference workload in the background plus
// 1,000 × scale reservations per second over 10 pools of 20 tenants, 70 %
// committed and 30 % released within 100 ms, under limits high enough that
// they refuse nothing: the profile measures the reservation path.
func Quota(scale float64) Profile {
	p := Reference(scale / 4)
	p.Name, p.Scale = "quota", scale
	p.QuotaRate = 1000 * scale
	p.QuotaPools = 10
	p.QuotaTenants = 20
	p.CommitShare = 0.7
	p.HoldTime = 100 * time.Millisecond
	return p
}

// ProfileByName returns the named profile at scale.
func ProfileByName(name string, scale float64) (Profile, error) {
	if scale <= 0 {
		return Profile{}, fmt.Errorf("scale: must be positive, got %v", scale)
	}
	switch name {
	case "reference":
		return Reference(scale), nil
	case "contended":
		return Contended(scale), nil
	case "quota":
		return Quota(scale), nil
	}
	return Profile{}, fmt.Errorf("profile: unknown %q (reference, contended, quota)", name)
}

// Rescaled returns the same profile at another scale.
func (p Profile) Rescaled(scale float64) Profile {
	q, _ := ProfileByName(p.Name, scale) // p.Name came from ProfileByName
	return q
}
