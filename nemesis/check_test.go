//go:build linux

package nemesis

import (
	"fmt"
	"sort"
	"time"
)

// The checkers read a history of calls, each with its invoke and
// completion time on this process's clock, and report every violation
// the history proves. The nodes' clocks are this host's clock, plus the
// --debug-clock-offset a node may run with; margin bounds the difference
// between any node's clock and this process's readings (the largest
// offset given, plus slack for the reads), so a rule is reported broken
// only when it is broken on every clock the nodes could have had.

// violation is one broken rule, at the time of the call that proves it.
type violation struct {
	rule string
	at   time.Time
	msg  string
}

func (v violation) String() string { return v.rule + ": " + v.msg }

// checkConfig is what the checkers assume of the cluster.
type checkConfig struct {
	skew   time.Duration // the shards' max_clock_skew
	margin time.Duration // see above
}

// lease is what the history says of one lease.
type lease struct {
	id, res string
	grant   op        // the first acknowledged Acquire that answered it
	token   uint64    // its fencing token
	expires time.Time // the latest expires_at acknowledged (grant or renewals)
	// releaseFrom is the invoke time of the first Release of it, whatever
	// its answer (a Release whose answer was lost may have taken effect);
	// zero when none was tried.
	releaseFrom time.Time
	// releasedAt is the completion of the first Release that answered
	// released: true (zero when none did).
	releasedAt time.Time
	renews     []op // acknowledged renewals
}

// endsBy reports whether the lease may have ended (by a release or its
// expiry on some node's clock, plus extra) before t.
func (l *lease) endsBy(t time.Time, extra, margin time.Duration) bool {
	if !l.releaseFrom.IsZero() && l.releaseFrom.Before(t) {
		return true
	}
	return !t.Before(l.expires.Add(extra - margin))
}

// leases groups the history's acknowledged grants, per resource in token
// order, with their renewals and releases.
func leases(ops []op) map[string][]*lease {
	byID := map[string]*lease{}
	for _, o := range ops {
		if o.kind == "acquire" && o.outcome == okOutcome {
			if l, ok := byID[o.lease]; !ok || o.done.Before(l.grant.done) {
				byID[o.lease] = &lease{id: o.lease, res: o.res, grant: o, token: o.token, expires: o.expires}
			}
		}
	}
	for _, o := range ops {
		l := byID[o.lease]
		if l == nil {
			continue
		}
		switch {
		case o.kind == "acquire" && o.outcome == okOutcome && o.expires.After(l.expires):
			l.expires = o.expires
		case o.kind == "renew" && o.outcome == okOutcome:
			l.renews = append(l.renews, o)
			if o.expires.After(l.expires) {
				l.expires = o.expires
			}
		case o.kind == "release":
			if l.releaseFrom.IsZero() || o.invoke.Before(l.releaseFrom) {
				l.releaseFrom = o.invoke
			}
			if o.outcome == okOutcome && o.released && (l.releasedAt.IsZero() || o.done.Before(l.releasedAt)) {
				l.releasedAt = o.done
			}
		}
	}
	out := map[string][]*lease{}
	for _, l := range byID {
		out[l.res] = append(out[l.res], l)
	}
	for _, ls := range out {
		sort.Slice(ls, func(a, b int) bool { return ls[a].token < ls[b].token })
	}
	return out
}

// checkLeases holds the history to the lock rules (DESIGN.md §1):
//
//   - one holder: a grant g2 with a higher token than g1's must not
//     complete before g1 may have ended. g1 may have ended once a Release
//     of it was invoked (its answer may be lost), or once some node's
//     clock passed its latest acknowledged expires_at plus max_clock_skew
//     (rule 6: only then is the lock grantable to someone else): on this
//     process's clock, expires_at + skew − margin. A renewal of g1
//     acknowledged after g2 was granted is caught the same way: its
//     expires_at lies a TTL past g2's grant.
//   - tokens: two leases have distinct tokens, and a grant that completed
//     before another was invoked has the lower token.
//   - visibility: a Describe invoked after a grant completed, that
//     completed while the lease was certainly current (before expires_at
//     − margin, no Release of it invoked), shows it held with its token;
//     and no Describe shows a token lower than one granted before it was
//     invoked.
//   - releases: after a Release answered released: true, no Describe
//     invoked later shows that lease's token held, and no renewal of it
//     invoked later succeeds. (released: false is taken as "unknown": a
//     Release retried inside the server across a leader change may
//     answer false though it took effect.)
func checkLeases(ops []op, cfg checkConfig) []violation {
	var out []violation
	all := leases(ops)
	for res, ls := range all {
		for j, g2 := range ls {
			for _, g1 := range ls[:j] {
				if g1.token == g2.token {
					out = append(out, violation{"tokens", g2.grant.done, fmt.Sprintf("%s: leases %.8s and %.8s share token %d", res, g1.id, g2.id, g1.token)})
					continue
				}
				if !g1.endsBy(g2.grant.done, cfg.skew, cfg.margin) {
					out = append(out, violation{"one holder", g2.grant.done, fmt.Sprintf(
						"%s: token %d granted at %s (node %d) while token %d (lease %.8s, expires_at %s, no release tried) was current",
						res, g2.token, stamp(g2.grant.done), g2.grant.node+1, g1.token, g1.id, stamp(g1.expires))})
				}
			}
			for _, g1 := range ls {
				if g1.grant.done.Before(g2.grant.invoke) && g1.token > g2.token {
					out = append(out, violation{"tokens", g2.grant.done, fmt.Sprintf("%s: token %d granted after token %d had been", res, g2.token, g1.token)})
				}
			}
			if !g2.releasedAt.IsZero() {
				for _, r := range g2.renews {
					if r.invoke.After(g2.releasedAt) {
						out = append(out, violation{"releases", r.done, fmt.Sprintf("%s: lease %.8s (token %d) renewed after its release was acknowledged", res, g2.id, g2.token)})
					}
				}
			}
		}
	}
	for _, d := range ops {
		if d.kind != "describe" || d.outcome != okOutcome {
			continue
		}
		for _, g := range all[d.res] {
			if !g.grant.done.Before(d.invoke) {
				continue
			}
			switch {
			case d.token < g.token:
				out = append(out, violation{"visibility", d.done, fmt.Sprintf("%s: Describe at %s (node %d) shows token %d, below token %d granted before", d.res, stamp(d.done), d.node+1, d.token, g.token)})
			case !g.endsBy(d.done, 0, cfg.margin) && (!d.held || d.token != g.token):
				out = append(out, violation{"visibility", d.done, fmt.Sprintf("%s: Describe at %s (node %d) shows held=%v token %d while lease %.8s (token %d, expires_at %s) was current",
					d.res, stamp(d.done), d.node+1, d.held, d.token, g.id, g.token, stamp(g.expires))})
			case !g.releasedAt.IsZero() && d.invoke.After(g.releasedAt) && d.held && d.token == g.token:
				out = append(out, violation{"releases", d.done, fmt.Sprintf("%s: Describe at %s (node %d) shows token %d held after its release was acknowledged", d.res, stamp(d.done), d.node+1, g.token)})
			}
		}
	}
	return out
}

// window is a time during which the nodes of minority are cut off from
// the majority.
type window struct {
	from, to time.Time
	minority map[int]bool
}

// checkMinority holds the history to rule 4: a node cut off from the
// majority grants, renews and releases nothing. A call to such a node
// invoked after the cut began and answered before it healed must not
// succeed.
func checkMinority(ops []op, ws []window) []violation {
	var out []violation
	for _, w := range ws {
		for _, o := range ops {
			if !w.minority[o.node] || o.invoke.Before(w.from) || !o.done.Before(w.to) || o.outcome != okOutcome {
				continue
			}
			if o.kind == "acquire" || o.kind == "renew" || o.kind == "release" && o.released {
				out = append(out, violation{"minority", o.done, fmt.Sprintf("%s %s succeeded at %s on node %d, cut off from the majority since %s",
					o.kind, o.res, stamp(o.done), o.node+1, stamp(w.from))})
			}
		}
	}
	return out
}

// stamp is t as the logs print it.
func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }
