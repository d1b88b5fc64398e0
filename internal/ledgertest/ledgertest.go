// Package ledgertest rebuilds a quota pool's totals from its ledger
// (ListLedger's checkpoints and events), for tests that hold the service
// to DESIGN.md rule 7 and to "counters equal the ledger".
package ledgertest

import (
	"testing"
	"time"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/shard"
)

// Replay is a pool's usage rebuilt from its ledger. Keys of its maps are
// levels (limits, committed) or a reservation's key NUL its id.
type Replay struct {
	Limits    map[string]int64
	Committed map[string]int64
	// Reserves and Commits count each reservation's RESERVE and COMMIT
	// events.
	Reserves, Commits map[string]int
	open              map[string]*wardenv1.LedgerEvent // key NUL id → its RESERVE, until it ends
}

// New replays events after checkpoints, failing t on a gap in the
// sequence and, at every RESERVE, when a limited level on its path would
// go over its limit (a reservation past its expiry no longer counts, as
// for the shard).
func New(t testing.TB, events []*wardenv1.LedgerEvent, checkpoints ...*wardenv1.LedgerCheckpoint) *Replay {
	t.Helper()
	l := &Replay{Limits: map[string]int64{}, Committed: map[string]int64{}, open: map[string]*wardenv1.LedgerEvent{},
		Reserves: map[string]int{}, Commits: map[string]int{}}
	var first uint64 // the last compacted seq
	for _, k := range checkpoints {
		if k.GetHasLimit() {
			l.Limits[k.GetKey()] = k.GetLimit()
		}
		l.addCommitted(k.GetKey(), k.GetCommitted())
		first = max(first, k.GetThroughSeq())
	}
	for i, e := range events {
		if e.GetSeq() != first+uint64(i+1) {
			t.Fatalf("ledger gap: event %d after the checkpoints has seq %d", i+1, e.GetSeq())
		}
		id := ID(e.GetKey(), e.GetReservationId())
		switch e.GetKind() {
		case shard.LedgerSetLimit:
			l.Limits[e.GetKey()] = e.GetLimit()
		case shard.LedgerReserve:
			l.Reserves[id]++
			l.open[id] = e
			for _, lv := range shard.Levels(e.GetKey()) {
				lim, ok := l.Limits[lv]
				if use := l.Committed[lv] + l.Reserved(lv, e.GetAt().AsTime()); ok && use > lim {
					t.Fatalf("ledger event %d (reserve %d on %s) took %s to %d, over its limit %d", e.GetSeq(), e.GetAmount(), e.GetKey(), lv, use, lim)
				}
			}
		case shard.LedgerCommit:
			l.Commits[id]++
			delete(l.open, id)
			l.addCommitted(e.GetKey(), e.GetAmount())
		case shard.LedgerRelease, shard.LedgerExpire:
			delete(l.open, id)
		case shard.LedgerCorrection:
			l.addCommitted(e.GetKey(), e.GetAmount())
		}
	}
	return l
}

// ID names a reservation in Reserves and Commits.
func ID(key, reservationID string) string { return key + "\x00" + reservationID }

func (l *Replay) addCommitted(key string, n int64) {
	for _, lv := range shard.Levels(key) {
		l.Committed[lv] += n
	}
}

// Reserved is the live reserved usage under level at time at.
func (l *Replay) Reserved(level string, at time.Time) int64 {
	var n int64
	for _, r := range l.open {
		if shard.Under(r.GetKey(), level) && at.Before(r.GetExpiresAt().AsTime()) {
			n += r.GetAmount()
		}
	}
	return n
}
