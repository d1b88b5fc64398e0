package shard

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// TestScripts runs the scenario files in testdata/*.txt against a
// replica. They are datadriven files (github.com/cockroachdb/datadriven,
// as the router's interaction tests): each step is a directive, with its
// output under "----"; run with -rewrite to regenerate the outputs after
// a deliberate change, and review the diff. The steps:
//
//	now 2.5s                               set the proposer's clock (from t0)
//	acquire RES REQ [ttl=D] [wait=D] [holder=H] [tenant=T] [lease=L]
//	cancel RES REQ [attempt=L]              abandon a waiting acquire (attempt: its lease name)
//	drop RES SEQ DEADLINE                   the leader drops a timed-out waiter
//	renew RES L
//	release RES L
//	revoke RES TOKEN                       an operator ends the lease with that token (a revision, in the record's epoch)
//	expire RES L EXP                       EXP: the expiry the leader saw, or "seen"
//	forget [dedup=RES/REQ,...] [idle=RES,...] [res=KEY:ID,...]
//	set skew=D window=D min_ttl=D max_ttl=D default_ttl=D
//	describe RES                           the stored record
//	events                                 the lock events applied since the last events step
//	scan expired|forgettable|timed_out
//	limit KEY N [weight=W]                 SetLimit
//	reserve KEY AMOUNT ID [ttl=D]
//	commit KEY ID [amount=N]
//	unreserve KEY ID                        release a reservation
//	reclaim                                 the leader's reclaimer: every expired reservation
//	report KEY OBSERVED ID [correct]
//	query KEY                               each level of the path
//	ledger KEY                              the subtree's ledger events
//	compact                                 the leader's ledger retention pass
//	checkpoints KEY                         the subtree's ledger checkpoints
//
// Lease names (L) stand for 16-byte lease ids. Durations are Go
// durations from t0. A new case is a new directive, not new code.
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt") // not testdata/rapid
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			s := &script{t: t, rep: newReplica(t), now: t0, expires: map[string]int64{}}
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				s.t = t
				fields := []string{d.Cmd}
				for _, a := range d.CmdArgs {
					fields = append(fields, a.String())
				}
				if out := s.step(fields); out != "" {
					return out + "\n"
				}
				return ""
			})
		})
	}
}

const t0 = int64(1_700_000_000) * second

type script struct {
	t       *testing.T
	rep     *replica
	now     int64
	expires map[string]int64 // lease name → last expiry seen
	seen    int              // lock events printed so far
}

func (s *script) dur(v string) int64 {
	d, err := time.ParseDuration(v)
	if err != nil {
		s.t.Fatalf("bad duration %q", v)
	}
	return int64(d)
}

// at prints an absolute time as a duration from t0.
func at(ns int64) string { return time.Duration(ns - t0).String() }

func leaseID(name string) []byte {
	id := make([]byte, LeaseIDBytes)
	copy(id, name)
	return id
}

func leaseName(id []byte) string { return strings.TrimRight(string(id), "\x00") }

func kv(args []string) map[string]string {
	m := map[string]string{}
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok {
			m[k] = v
		}
	}
	return m
}

func (s *script) step(f []string) string {
	switch f[0] {
	case "now":
		s.now = t0 + s.dur(f[1])
		return ""
	case "version": // envelope version of the proposals that follow (0: the newest)
		v, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			s.t.Fatalf("bad version %q", f[1])
		}
		s.rep.version = uint32(v)
		return ""
	case "acquire":
		o := kv(f[3:])
		var ttl int64
		if v, ok := o["ttl"]; ok {
			ttl = s.dur(v)
		}
		name := o["lease"]
		if name == "" {
			name = f[2]
		}
		env := acquireCmd(f[1], f[2], ttl, o["holder"], leaseID(name))
		if v, ok := o["wait"]; ok {
			env.GetAcquire().WaitTimeoutNanos = s.dur(v)
		}
		env.GetAcquire().Tenant = o["tenant"]
		env.GetAcquire().Principal = o["principal"]
		res := s.rep.propose(s.now, env)
		if res.GetCode() == shardv1.Code_CODE_OK {
			s.expires[leaseName(res.GetLease().GetLeaseId())] = res.GetLease().GetExpiresAtUnixNano()
		}
		return out(f[0], res)
	case "renew":
		res := s.rep.propose(s.now, renewCmd(f[1], leaseID(f[2])))
		if res.GetCode() == shardv1.Code_CODE_OK {
			s.expires[f[2]] = res.GetLease().GetExpiresAtUnixNano()
		}
		return out(f[0], res)
	case "release":
		return out(f[0], s.rep.propose(s.now, releaseCmd(f[1], leaseID(f[2]))))
	case "revoke":
		n, _ := strconv.ParseUint(f[2], 10, 64)
		epoch := uint64(1)
		if l := s.rep.query(s.now, &shardv1.Query{Query: &shardv1.Query_Describe{Describe: &shardv1.DescribeQuery{Resource: f[1]}}}).GetLock(); l != nil {
			epoch, _ = SplitToken(l.GetFencingToken())
		}
		token := Token(epoch, n)
		if n == 0 {
			token = 0
		}
		return out(f[0], s.rep.propose(s.now, &shardv1.Envelope{Command: &shardv1.Envelope_Revoke{Revoke: &shardv1.RevokeCmd{Resource: f[1], FencingToken: token}}}))
	case "expire":
		exp := s.expires[f[2]]
		if f[3] != "seen" {
			exp = t0 + s.dur(f[3])
		}
		return out(f[0], s.rep.propose(s.now, expireCmd(&shardv1.ExpireItem{Resource: f[1], LeaseId: leaseID(f[2]), ExpiresAtUnixNano: exp})))
	case "cancel":
		c := &shardv1.CancelWaitCmd{Resource: f[1], RequestId: f[2]}
		if a := kv(f[3:])["attempt"]; a != "" {
			c.AttemptId = leaseID(a)
		}
		return out(f[0], s.rep.propose(s.now, &shardv1.Envelope{Command: &shardv1.Envelope_CancelWait{CancelWait: c}}))
	case "drop":
		seq, _ := strconv.ParseUint(f[2], 10, 64)
		return out(f[0], s.rep.propose(s.now, &shardv1.Envelope{Command: &shardv1.Envelope_DropWaiters{DropWaiters: &shardv1.DropWaitersCmd{Items: []*shardv1.WaiterRef{
			{Resource: f[1], Seq: seq, DeadlineUnixNano: t0 + s.dur(f[3])}}}}}))
	case "forget":
		c := &shardv1.ForgetCmd{}
		o := kv(f[1:])
		for _, d := range splitList(o["dedup"]) {
			r, q, _ := strings.Cut(d, "/")
			c.Dedup = append(c.Dedup, &shardv1.DedupRef{Resource: r, RequestId: q})
		}
		c.IdleLocks = splitList(o["idle"])
		for _, r := range splitList(o["res"]) {
			k, id, _ := strings.Cut(r, ":")
			c.Reservations = append(c.Reservations, &shardv1.ReservationRef{Key: k, ReservationId: id})
		}
		return out(f[0], s.rep.propose(s.now, forgetCmd(c)))
	case "set":
		c := &shardv1.SetConfigCmd{}
		for k, v := range kv(f[1:]) {
			if n, err := strconv.ParseUint(v, 10, 32); err == nil {
				n32 := uint32(n)
				switch k {
				case "waiters":
					c.MaxWaitersPerResource = &n32
				case "tenant_waiters":
					c.MaxWaitersPerTenant = &n32
				}
				continue
			}
			d := s.dur(v)
			switch k {
			case "skew":
				c.MaxClockSkewNanos = &d
			case "window":
				c.DedupWindowNanos = &d
			case "min_ttl":
				c.MinLeaseTtlNanos = &d
			case "max_ttl":
				c.MaxLeaseTtlNanos = &d
			case "default_ttl":
				c.DefaultLeaseTtlNanos = &d
			case "max_wait":
				c.MaxWaitTimeoutNanos = &d
			case "retention":
				c.LedgerRetentionNanos = &d
			}
		}
		return out(f[0], s.rep.propose(s.now, setConfigCmd(c)))
	case "limit":
		n, _ := strconv.ParseInt(f[2], 10, 64)
		c := &shardv1.SetLimitCmd{Key: f[1], Limit: n}
		if w, err := strconv.ParseUint(kv(f[3:])["weight"], 10, 32); err == nil {
			c.Weight = uint32(w)
		}
		return out(f[0], s.rep.propose(s.now, &shardv1.Envelope{Command: &shardv1.Envelope_SetLimit{SetLimit: c}}))
	case "reserve":
		n, _ := strconv.ParseInt(f[2], 10, 64)
		c := &shardv1.ReserveCmd{Key: f[1], Amount: n, ReservationId: f[3]}
		if v, ok := kv(f[4:])["ttl"]; ok {
			c.TtlNanos = s.dur(v)
		}
		return out(f[0], s.rep.propose(s.now, &shardv1.Envelope{Command: &shardv1.Envelope_Reserve{Reserve: c}}))
	case "commit":
		c := &shardv1.CommitCmd{Key: f[1], ReservationId: f[2]}
		if v, ok := kv(f[3:])["amount"]; ok {
			c.Amount, _ = strconv.ParseInt(v, 10, 64)
		}
		return out(f[0], s.rep.propose(s.now, &shardv1.Envelope{Command: &shardv1.Envelope_Commit{Commit: c}}))
	case "unreserve":
		return out("release", s.rep.propose(s.now, &shardv1.Envelope{Command: &shardv1.Envelope_ReleaseReservation{
			ReleaseReservation: &shardv1.ReleaseReservationCmd{Key: f[1], ReservationId: f[2]}}}))
	case "compact":
		scan := s.rep.query(s.now, &shardv1.Query{Query: &shardv1.Query_Compactable{Compactable: &shardv1.ScanQuery{Limit: 100}}}).GetCompact()
		return out(f[0], s.rep.propose(s.now, &shardv1.Envelope{Command: &shardv1.Envelope_CompactLedger{CompactLedger: scan}}))
	case "checkpoints":
		var parts []string
		for _, k := range s.rep.query(s.now, &shardv1.Query{Query: &shardv1.Query_Ledger{Ledger: &shardv1.LedgerQuery{Key: f[1], Limit: 1}}}).GetCheckpoints() {
			parts = append(parts, fmt.Sprintf("%s@%d:limit=%d,committed=%d", k.GetKey(), k.GetThroughSeq(), k.GetLimit(), k.GetCommitted()))
		}
		return "[" + strings.Join(parts, " ") + "]"
	case "reclaim":
		scan := s.rep.query(s.now, &shardv1.Query{Query: &shardv1.Query_Reclaimable{Reclaimable: &shardv1.ScanQuery{Limit: 100}}}).GetReclaim()
		return out(f[0], s.rep.propose(s.now, &shardv1.Envelope{Command: &shardv1.Envelope_Reclaim{Reclaim: scan}}))
	case "report": // report KEY OBSERVED REPORT_ID [correct] [seq=N|seq=now]
		n, _ := strconv.ParseInt(f[2], 10, 64)
		c := &shardv1.ReportUsageCmd{Key: f[1], Observed: n, ReportId: f[3], Correct: slices.Contains(f[4:], "correct")}
		switch v, ok := kv(f[4:])["seq"]; {
		case v == "now":
			seq := s.rep.query(s.now, &shardv1.Query{Query: &shardv1.Query_Quota{Quota: &shardv1.QuotaQuery{Key: f[1]}}}).GetLedgerSeq()
			c.ObservedSeq = &seq
		case ok:
			seq, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				s.t.Fatalf("bad seq %q", v)
			}
			c.ObservedSeq = &seq
		}
		return out(f[0], s.rep.propose(s.now, &shardv1.Envelope{Command: &shardv1.Envelope_ReportUsage{ReportUsage: c}}))
	case "seq": // the pool's ledger sequence, as Query answers it
		return strconv.FormatUint(s.rep.query(s.now, &shardv1.Query{Query: &shardv1.Query_Quota{Quota: &shardv1.QuotaQuery{Key: f[1]}}}).GetLedgerSeq(), 10)
	case "query":
		var parts []string
		for _, l := range s.rep.query(s.now, &shardv1.Query{Query: &shardv1.Query_Quota{Quota: &shardv1.QuotaQuery{Key: f[1]}}}).GetLevels() {
			q := l.GetRecord()
			lim := "-"
			if q.GetHasLimit() {
				lim = strconv.FormatInt(q.GetLimit(), 10)
			}
			p := fmt.Sprintf("%s:limit=%s,committed=%d,reserved=%d", q.GetKey(), lim, q.GetCommitted(), l.GetReserved())
			if l.GetExpiredPending() > 0 {
				p += fmt.Sprintf(",expired_pending=%d", l.GetExpiredPending())
			}
			if q.GetHasLimit() {
				p += fmt.Sprintf(",remaining=%d", l.GetRemaining())
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, " ")
	case "ledger":
		var parts []string
		for _, e := range s.rep.query(s.now, &shardv1.Query{Query: &shardv1.Query_Ledger{Ledger: &shardv1.LedgerQuery{Key: f[1], Limit: 100}}}).GetLedger() {
			p := fmt.Sprintf("%d:%s:%s", e.GetSeq(), e.GetKind(), e.GetKey())
			if e.GetReservationId() != "" {
				p += ":" + e.GetReservationId()
			}
			if e.GetKind() == "SET_LIMIT" {
				p += fmt.Sprintf(":%d", e.GetLimit())
			} else {
				p += fmt.Sprintf(":%d", e.GetAmount())
			}
			parts = append(parts, p)
		}
		return "[" + strings.Join(parts, " ") + "]"
	case "events":
		var out []string
		for _, e := range s.rep.events[s.seen:] {
			out = append(out, fmt.Sprintf("%d.%d %s %s holder=%s token=%d expires=%s at=%s",
				e.Index, e.Seq, e.Kind, e.Resource, e.Holder, rev(e.FencingToken), at(e.ExpiresAtUnixNano), at(e.AtUnixNano)))
		}
		s.seen = len(s.rep.events)
		return strings.Join(out, "\n")
	case "describe":
		l := s.rep.query(s.now, &shardv1.Query{Query: &shardv1.Query_Describe{Describe: &shardv1.DescribeQuery{Resource: f[1]}}}).GetLock()
		switch {
		case l == nil:
			return "none"
		case l.GetHeld():
			return fmt.Sprintf("held lease=%s token=%d expires=%s%s", leaseName(l.GetLeaseId()), rev(l.GetFencingToken()), at(l.GetExpiresAtUnixNano()), waiters(l))
		}
		return fmt.Sprintf("free token=%d ended=%s%s", rev(l.GetFencingToken()), at(l.GetEndedAtUnixNano()), waiters(l))
	case "scan":
		q := &shardv1.Query{}
		if f[1] == "expired" {
			q.Query = &shardv1.Query_Expired{Expired: &shardv1.ScanQuery{Limit: 100}}
			var out []string
			for _, it := range s.rep.query(s.now, q).GetExpire().GetItems() {
				out = append(out, it.GetResource()+":"+leaseName(it.GetLeaseId()))
			}
			return "[" + strings.Join(out, " ") + "]"
		}
		if f[1] == "timed_out" {
			q.Query = &shardv1.Query_TimedOut{TimedOut: &shardv1.ScanQuery{Limit: 100}}
			var out []string
			for _, it := range s.rep.query(s.now, q).GetDrop().GetItems() {
				out = append(out, fmt.Sprintf("%s:%d@%s", it.GetResource(), it.GetSeq(), at(it.GetDeadlineUnixNano())))
			}
			return "[" + strings.Join(out, " ") + "]"
		}
		q.Query = &shardv1.Query_Forgettable{Forgettable: &shardv1.ScanQuery{Limit: 100}}
		fc := s.rep.query(s.now, q).GetForget()
		var out []string
		for _, d := range fc.GetDedup() {
			out = append(out, "dedup:"+d.GetResource()+"/"+d.GetRequestId())
		}
		for _, r := range fc.GetIdleLocks() {
			out = append(out, "idle:"+r)
		}
		for _, r := range fc.GetReservations() {
			out = append(out, "res:"+r.GetKey()+":"+r.GetReservationId())
		}
		return "[" + strings.Join(out, " ") + "]"
	}
	s.t.Fatalf("unknown verb %q", f[0])
	return ""
}

func waiters(l *shardv1.LockRecord) string {
	if l.GetWaiters() == 0 {
		return ""
	}
	return fmt.Sprintf(" waiters=%d", l.GetWaiters())
}

func splitList(v string) []string {
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// rev prints a token as its revision (tests run in epoch 1).
func rev(token uint64) uint64 {
	_, r := SplitToken(token)
	return r
}

// out prints a result of verb in the scripts' EXPECT form.
func out(verb string, r *shardv1.Result) string {
	code := strings.ToLower(strings.TrimPrefix(r.GetCode().String(), "CODE_"))
	var b strings.Builder
	b.WriteString(code)
	if l := r.GetLease(); l != nil {
		if len(l.GetLeaseId()) > 0 {
			b.WriteString(" lease=" + leaseName(l.GetLeaseId()))
		}
		b.WriteString(" token=" + strconv.FormatUint(rev(l.GetFencingToken()), 10))
		b.WriteString(" expires=" + at(l.GetExpiresAtUnixNano()))
	}
	if r.GetReplayed() {
		b.WriteString(" replayed")
	}
	if r.GetCode() == shardv1.Code_CODE_QUEUED {
		fmt.Fprintf(&b, " until=%s", at(r.GetWaitDeadlineUnixNano()))
		if r.GetCount() > 0 {
			fmt.Fprintf(&b, " waiters=%d", r.GetCount())
		}
	}
	if qo := r.GetQuota(); qo != nil {
		switch {
		case r.GetCode() == shardv1.Code_CODE_RESOURCE_EXHAUSTED:
			fmt.Fprintf(&b, " level=%s reason=%s remaining=%d", qo.GetLevel(), qo.GetReason(), qo.GetRemaining())
			if qo.GetRetryAfterNanos() > 0 {
				fmt.Fprintf(&b, " retry_after=%v", time.Duration(qo.GetRetryAfterNanos()))
			}
		case verb == "reserve":
			fmt.Fprintf(&b, " remaining=%d expires=%s", qo.GetRemaining(), at(qo.GetReservation().GetExpiresAtUnixNano()))
		case verb == "commit":
			fmt.Fprintf(&b, " committed=%d", qo.GetReservation().GetCommitted())
		case verb == "report":
			fmt.Fprintf(&b, " drift=%d", qo.GetDrift())
		}
		if qo.GetReplayed() {
			b.WriteString(" replayed")
		}
	}
	if r.GetCode() == shardv1.Code_CODE_OK {
		switch verb {
		case "release", "revoke":
			b.WriteString(" released=" + strconv.FormatBool(r.GetReleased()))
		case "expire", "forget", "drop", "cancel", "reclaim", "compact":
			b.WriteString(" count=" + strconv.Itoa(int(r.GetCount())))
		}
		if verb == "cancel" && r.GetReleased() {
			b.WriteString(" released")
		}
	}
	for _, g := range r.GetGranted() {
		fmt.Fprintf(&b, " granted=%s:%s:%d:%s", g.GetRequestId(), leaseName(g.GetLease().GetLeaseId()), rev(g.GetLease().GetFencingToken()), at(g.GetLease().GetExpiresAtUnixNano()))
	}
	for _, d := range r.GetDropped() {
		fmt.Fprintf(&b, " dropped=%s", d.GetRequestId())
	}
	if r.GetField() != "" {
		b.WriteString(" field=" + r.GetField())
	}
	return b.String()
}
