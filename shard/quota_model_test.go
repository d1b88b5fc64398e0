package shard

import (
	"fmt"
	"maps"
	"math/big"
	"os"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/warden-dev/warden/keyspace"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// qModel is the reference model of one quota tree: limits, reservations
// and corrections, from which every level's usage is recomputed from
// scratch (the state machine keeps running counters instead).
type qModel struct {
	limits  map[string]*shardv1.SetLimitCmd
	res     map[string]*mRes // by key NUL reservation id
	correct map[string]int64 // key → total correction
	reports map[string]int64 // report id → drift
}

type mRes struct {
	key, id        string
	amount, ttl    int64
	expires        int64
	state          shardv1.ReservationState
	committed      int64
	remainingReply int64
}

// usage returns level's committed and live reserved usage at now.
func (m *qModel) usage(level string, now int64) (committed, reserved int64) {
	for _, r := range m.res {
		if !Under(r.key, level) {
			continue
		}
		switch {
		case r.state == shardv1.ReservationState_RESERVATION_STATE_COMMITTED:
			committed += r.committed
		case r.state == shardv1.ReservationState_RESERVATION_STATE_OPEN && now < r.expires:
			reserved += r.amount
		}
	}
	for k, c := range m.correct {
		if Under(k, level) {
			committed += c
		}
	}
	return committed, reserved
}

// TestQuotaMatchesModel runs random SetLimit, Reserve (with retries and
// changed parameters), Commit (whole and partial), Release, reclaim
// passes, usage reports and time steps against a replica and the model,
// and checks every result and every level's counters, and DESIGN.md rule
// 7: no successful Reserve leaves a limited level on its path over its
// limit.
func TestQuotaMatchesModel(t *testing.T) {
	keys := []string{"p", "p/a", "p/b", "p/a/x", "p/a/y", "p/b/z"}
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp("", "warden-quota-model-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		rep := openReplica(rt, dir, FirstShard)
		defer func() { rep.sm.Close() }()
		m := &qModel{limits: map[string]*shardv1.SetLimitCmd{}, res: map[string]*mRes{}, correct: map[string]int64{}, reports: map[string]int64{}}
		now := t0
		cfg := DefaultConfig()
		prop := func(env *shardv1.Envelope) *shardv1.Result { return rep.propose(now, env) }
		for step := range rapid.IntRange(1, 120).Draw(rt, "steps") {
			key := rapid.SampledFrom(keys).Draw(rt, "key")
			id := fmt.Sprintf("r%d", rapid.IntRange(0, 12).Draw(rt, "id"))
			switch rapid.IntRange(0, 9).Draw(rt, "op") {
			case 0, 1: // SetLimit
				c := &shardv1.SetLimitCmd{Key: key, Limit: rapid.Int64Range(0, 60).Draw(rt, "limit"), Weight: uint32(rapid.IntRange(1, 3).Draw(rt, "weight"))}
				if res := prop(&shardv1.Envelope{Command: &shardv1.Envelope_SetLimit{SetLimit: c}}); res.GetCode() != shardv1.Code_CODE_OK {
					rt.Fatalf("set limit: %v", res)
				}
				m.limits[key] = c
			case 2, 3, 4: // Reserve
				amount := rapid.Int64Range(1, 25).Draw(rt, "amount")
				ttl := int64(rapid.IntRange(1, 10).Draw(rt, "ttl s")) * second
				res := prop(&shardv1.Envelope{Command: &shardv1.Envelope_Reserve{Reserve: &shardv1.ReserveCmd{Key: key, Amount: amount, ReservationId: id, TtlNanos: ttl}}})
				if old := m.res[key+"\x00"+id]; old != nil {
					switch {
					case old.amount != amount || old.ttl != ttl:
						if res.GetCode() != shardv1.Code_CODE_INVALID_ARGUMENT {
							rt.Fatalf("step %d: reserve %s with changed parameters: %v", step, id, res)
						}
					case !res.GetQuota().GetReplayed() || res.GetQuota().GetRemaining() != old.remainingReply:
						rt.Fatalf("step %d: retry of %s: %v, want the original answer (remaining %d)", step, id, res, old.remainingReply)
					}
					continue
				}
				if m.heldElsewhere(key, id) { // ids are unique per pool (envelope version 10)
					if res.GetCode() != shardv1.Code_CODE_INVALID_ARGUMENT || res.GetField() != "reservation_id" {
						rt.Fatalf("step %d: reserve %s on %s, which another key of the pool holds: %v", step, id, key, res)
					}
					continue
				}
				want, remaining := m.decide(key, amount, now, cfg)
				if res.GetCode() != want {
					rt.Fatalf("step %d: reserve %s %d on %s: %v %s, model says %v (%s)", step, id, amount, key, res.GetCode(), res.GetReason(), want, m.explain(key, now))
				}
				if want == shardv1.Code_CODE_OK {
					if res.GetQuota().GetRemaining() != remaining {
						rt.Fatalf("step %d: reserve %s: remaining %d, model says %d", step, id, res.GetQuota().GetRemaining(), remaining)
					}
					m.res[key+"\x00"+id] = &mRes{key: key, id: id, amount: amount, ttl: ttl, expires: now + ttl, state: shardv1.ReservationState_RESERVATION_STATE_OPEN, remainingReply: remaining}
					for _, l := range Levels(key) { // rule 7
						if lim := m.limits[l]; lim != nil {
							if c, r := m.usage(l, now); c+r > lim.GetLimit() && r > 0 {
								rt.Fatalf("step %d: reserve took %s to %d over its limit %d", step, l, c+r, lim.GetLimit())
							}
						}
					}
				}
			case 5: // Commit
				r := m.pick(rt)
				if r == nil {
					continue
				}
				id = r.id
				part := rapid.Int64Range(0, r.amount).Draw(rt, "commit amount")
				res := prop(&shardv1.Envelope{Command: &shardv1.Envelope_Commit{Commit: &shardv1.CommitCmd{Key: r.key, ReservationId: id, Amount: part}}})
				switch {
				case r.state == shardv1.ReservationState_RESERVATION_STATE_COMMITTED:
					if res.GetCode() != shardv1.Code_CODE_OK || res.GetQuota().GetReservation().GetCommitted() != r.committed {
						rt.Fatalf("step %d: second commit of %s: %v", step, id, res)
					}
				case r.state != shardv1.ReservationState_RESERVATION_STATE_OPEN || now >= r.expires:
					if res.GetCode() != shardv1.Code_CODE_FAILED_PRECONDITION {
						rt.Fatalf("step %d: commit of ended %s: %v", step, id, res)
					}
				default:
					if res.GetCode() != shardv1.Code_CODE_OK {
						rt.Fatalf("step %d: commit of %s: %v", step, id, res)
					}
					if part == 0 {
						part = r.amount
					}
					r.state, r.committed = shardv1.ReservationState_RESERVATION_STATE_COMMITTED, part
				}
			case 6: // Release
				r := m.pick(rt)
				if r == nil {
					continue
				}
				id = r.id
				res := prop(&shardv1.Envelope{Command: &shardv1.Envelope_ReleaseReservation{ReleaseReservation: &shardv1.ReleaseReservationCmd{Key: r.key, ReservationId: id}}})
				live := r.state == shardv1.ReservationState_RESERVATION_STATE_OPEN && now < r.expires
				switch {
				case r.state == shardv1.ReservationState_RESERVATION_STATE_COMMITTED:
					if res.GetCode() != shardv1.Code_CODE_FAILED_PRECONDITION {
						rt.Fatalf("step %d: release of committed %s: %v", step, id, res)
					}
				case res.GetCode() != shardv1.Code_CODE_OK || res.GetReleased() != live:
					rt.Fatalf("step %d: release of %s (live %v): %v", step, id, live, res)
				case live:
					r.state = shardv1.ReservationState_RESERVATION_STATE_RELEASED
				}
			case 7: // the leader's reclaimer
				scan := rep.query(now, &shardv1.Query{Query: &shardv1.Query_Reclaimable{Reclaimable: &shardv1.ScanQuery{Limit: 100}}}).GetReclaim()
				if res := prop(&shardv1.Envelope{Command: &shardv1.Envelope_Reclaim{Reclaim: scan}}); res.GetCode() != shardv1.Code_CODE_OK {
					rt.Fatalf("reclaim: %v", res)
				}
				for _, r := range m.res {
					if r.state == shardv1.ReservationState_RESERVATION_STATE_OPEN && now >= r.expires {
						r.state = shardv1.ReservationState_RESERVATION_STATE_EXPIRED
					}
				}
			case 8: // ReportUsage with correction
				rid := fmt.Sprintf("c%d", rapid.IntRange(0, 4).Draw(rt, "report"))
				observed := rapid.Int64Range(0, 40).Draw(rt, "observed")
				// Observed against the current totals (Query's ledger_seq).
				seq := rep.query(now, &shardv1.Query{Query: &shardv1.Query_Quota{Quota: &shardv1.QuotaQuery{Key: key}}}).GetLedgerSeq()
				res := prop(&shardv1.Envelope{Command: &shardv1.Envelope_ReportUsage{ReportUsage: &shardv1.ReportUsageCmd{Key: key, Observed: observed, ReportId: rid + "-" + key, Correct: true, ObservedSeq: &seq}}})
				if d, ok := m.reports[rid+"-"+key]; ok {
					if res.GetCode() == shardv1.Code_CODE_OK && res.GetQuota().GetDrift() != d {
						rt.Fatalf("step %d: replayed report: %v, want drift %d", step, res, d)
					}
					continue
				}
				limited, below := false, int64(0)
				for _, l := range Levels(key) {
					limited = limited || m.limits[l] != nil
				}
				for _, k := range keys {
					if len(Levels(k)) == len(Levels(key))+1 && Under(k, key) {
						c, _ := m.usage(k, now)
						below += c
					}
				}
				switch {
				case !limited:
					if res.GetCode() != shardv1.Code_CODE_FAILED_PRECONDITION {
						rt.Fatalf("step %d: correction on %s with no limit on its path: %v", step, key, res)
					}
					continue
				case observed < below:
					if res.GetCode() != shardv1.Code_CODE_INVALID_ARGUMENT {
						rt.Fatalf("step %d: correction of %s to %d below its sub-levels' %d: %v", step, key, observed, below, res)
					}
					continue
				}
				own, _ := m.usage(key, now)
				if res.GetCode() != shardv1.Code_CODE_OK || res.GetQuota().GetDrift() != observed-own {
					rt.Fatalf("step %d: report %s on %s: %v, model drift %d", step, rid, key, res, observed-own)
				}
				m.reports[rid+"-"+key] = observed - own
				m.correct[key] += observed - own
			case 9:
				now += rapid.Int64Range(0, 3*second).Draw(rt, "advance")
			}
			// Every level's counters against the model.
			for _, l := range rep.query(now, &shardv1.Query{Query: &shardv1.Query_Quota{Quota: &shardv1.QuotaQuery{Key: "p/a/x"}}}).GetLevels() {
				c, r := m.usage(l.GetRecord().GetKey(), now)
				if l.GetRecord().GetCommitted() != c || l.GetReserved() != r {
					rt.Fatalf("step %d: %s has committed %d reserved %d; model says %d, %d", step, l.GetRecord().GetKey(), l.GetRecord().GetCommitted(), l.GetReserved(), c, r)
				}
			}
		}
	})
}

// decide is the model's Reserve: every limited level on the path, root
// first, must have room, and above the fairness threshold a limited child
// may not pass its weighted share. It returns the code and the remaining
// room at the tightest level.
func (m *qModel) decide(key string, amount, now int64, cfg *shardv1.ShardConfig) (shardv1.Code, int64) {
	levels := Levels(key)
	limited := false
	remaining := MaxQuotaAmount
	for i, l := range levels {
		lim := m.limits[l]
		if lim == nil {
			continue
		}
		limited = true
		c, r := m.usage(l, now)
		after := c + r + amount
		if after > lim.GetLimit() {
			return shardv1.Code_CODE_RESOURCE_EXHAUSTED, 0
		}
		remaining = min(remaining, lim.GetLimit()-after)
		if i+1 < len(levels) && m.limits[levels[i+1]] != nil && after*100 > lim.GetLimit()*int64(cfg.GetFairnessThresholdPercent()) {
			var kids []*shardv1.QuotaRecord
			for k, kl := range m.limits {
				if len(Levels(k)) == i+2 && Under(k, l) {
					kids = append(kids, &shardv1.QuotaRecord{Key: k, Limit: kl.GetLimit(), Weight: kl.GetWeight(), HasLimit: true})
				}
			}
			share := modelShare(lim.GetLimit(), kids, levels[i+1])
			cc, cr := m.usage(levels[i+1], now)
			if cc+cr+amount > share {
				return shardv1.Code_CODE_RESOURCE_EXHAUSTED, 0
			}
		}
	}
	if !limited {
		return shardv1.Code_CODE_FAILED_PRECONDITION, 0
	}
	return shardv1.Code_CODE_OK, remaining
}

// modelShare is the reference for the state machine's max-min fair
// share (waterShares), computed another way: the water level λ in exact
// rationals, found by fixed-point iteration (λ = what is left after the
// capped kids / the others' weights; cap every kid whose limit is at or
// below weight × λ; repeat until none is newly capped), then floors, and
// the leftover units one at a time in key order to the uncapped kids.
func modelShare(limit int64, kids []*shardv1.QuotaRecord, child string) int64 {
	slices.SortFunc(kids, func(a, b *shardv1.QuotaRecord) int { return strings.Compare(a.GetKey(), b.GetKey()) })
	w := func(k *shardv1.QuotaRecord) int64 { return int64(max(k.GetWeight(), 1)) }
	capped := map[string]bool{}
	var lambda *big.Rat
	for {
		left, weights := big.NewRat(limit, 1), int64(0)
		for _, k := range kids {
			if capped[k.GetKey()] {
				left.Sub(left, big.NewRat(k.GetLimit(), 1))
			} else {
				weights += w(k)
			}
		}
		if weights == 0 {
			break // every kid is capped at its own limit
		}
		lambda = new(big.Rat).Quo(left, big.NewRat(weights, 1))
		more := false
		for _, k := range kids {
			if !capped[k.GetKey()] && big.NewRat(k.GetLimit(), 1).Cmp(new(big.Rat).Mul(lambda, big.NewRat(w(k), 1))) <= 0 {
				capped[k.GetKey()], more = true, true
			}
		}
		if !more {
			break
		}
	}
	shares := map[string]int64{}
	var sum int64
	for _, k := range kids {
		if capped[k.GetKey()] {
			shares[k.GetKey()] = k.GetLimit()
			continue
		}
		x := new(big.Rat).Mul(lambda, big.NewRat(w(k), 1))
		shares[k.GetKey()] = new(big.Int).Quo(x.Num(), x.Denom()).Int64()
		sum += shares[k.GetKey()]
	}
	if lambda != nil {
		left := limit
		for _, k := range kids {
			if capped[k.GetKey()] {
				left -= k.GetLimit()
			}
		}
		for _, k := range kids {
			if sum < left && !capped[k.GetKey()] {
				shares[k.GetKey()]++
				sum++
			}
		}
	}
	return shares[child]
}

// heldElsewhere reports whether a key of key's pool other than key holds
// a reservation with id (the model forgets none).
func (m *qModel) heldElsewhere(key, id string) bool {
	for _, r := range m.res {
		if r.id == id && r.key != key && keyspace.Pool(r.key) == keyspace.Pool(key) {
			return true
		}
	}
	return false
}

// pick draws one of the reservations made so far, or nil.
func (m *qModel) pick(rt *rapid.T) *mRes {
	if len(m.res) == 0 {
		return nil
	}
	ids := slices.Sorted(maps.Keys(m.res))
	return m.res[rapid.SampledFrom(ids).Draw(rt, "reservation")]
}

func (m *qModel) explain(key string, now int64) string {
	s := ""
	for _, l := range Levels(key) {
		c, r := m.usage(l, now)
		s += fmt.Sprintf("%s: limit %v committed %d reserved %d; ", l, m.limits[l], c, r)
	}
	return s
}

// The state machine's max-min shares agree with the reference on random
// sibling sets, small limits (where floors and leftovers decide) and
// limits near the maximum (where products pass 64 bits), and the issue's
// examples come out as stated.
func TestWaterSharesAgreeWithModel(t *testing.T) {
	for _, c := range []struct {
		limit   int64
		limits  []int64
		weights []uint32
		want    []int64
	}{
		{10, []int64{2, 10}, []uint32{1, 1}, []int64{2, 8}},
		{20, []int64{2, 10, 20}, []uint32{1, 1, 2}, []int64{2, 6, 12}},
		{100, []int64{100, 100}, []uint32{1, 3}, []int64{25, 75}},
		{10, []int64{3, 3}, []uint32{1, 1}, []int64{3, 3}}, // limits below the parent's
		{10, []int64{10, 10, 10}, []uint32{1, 1, 1}, []int64{4, 3, 3}},
	} {
		var kids []*shardv1.QuotaRecord
		for i, l := range c.limits {
			kids = append(kids, &shardv1.QuotaRecord{Key: fmt.Sprintf("p/%c", 'a'+i), Limit: l, Weight: c.weights[i], HasLimit: true})
		}
		if got := waterShares(c.limit, kids); !slices.Equal(got, c.want) {
			t.Errorf("parent %d, limits %v, weights %v: shares %v, want %v", c.limit, c.limits, c.weights, got, c.want)
		}
	}
	rapid.Check(t, func(rt *rapid.T) {
		huge := rapid.Bool().Draw(rt, "huge")
		top := int64(30)
		if huge {
			top = MaxQuotaAmount
		}
		limit := rapid.Int64Range(0, top).Draw(rt, "limit")
		n := rapid.IntRange(1, 6).Draw(rt, "kids")
		var kids []*shardv1.QuotaRecord
		for i := range n {
			kids = append(kids, &shardv1.QuotaRecord{Key: fmt.Sprintf("p/%d", i), HasLimit: true,
				Limit:  rapid.Int64Range(0, top).Draw(rt, "kid limit"),
				Weight: rapid.Uint32Range(1, MaxQuotaWeight).Draw(rt, "weight")})
		}
		got := waterShares(limit, kids)
		var sum, own int64
		for i, k := range kids {
			if want := modelShare(limit, slices.Clone(kids), k.GetKey()); got[i] != want {
				rt.Fatalf("%s: share %d, model %d (parent %d, kids %v)", k.GetKey(), got[i], want, limit, kids)
			}
			if got[i] > k.GetLimit() || got[i] < 0 {
				rt.Fatalf("%s: share %d outside [0, %d]", k.GetKey(), got[i], k.GetLimit())
			}
			sum += got[i]
			own += k.GetLimit()
		}
		if sum != min(limit, own) {
			rt.Fatalf("shares add up to %d, want min(parent %d, Σ own limits %d)", sum, limit, own)
		}
	})
}
