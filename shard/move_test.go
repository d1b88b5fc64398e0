package shard

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/warden-dev/warden/keyspace"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

func fenceCmd(op, start, end uint64) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_FenceRange{FenceRange: &shardv1.FenceRangeCmd{Fence: &shardv1.RangeFence{OperatorId: op, Start: start, End: end}}}}
}

func importCmd(op uint64, recs *shardv1.RangeRecords) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_ImportRange{ImportRange: &shardv1.ImportRangeCmd{OperatorId: op, Records: recs}}}
}

func activateCmd(op uint64, rg *shardv1.RangeDescriptor, epoch uint64, lastNow int64) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_ActivateRange{ActivateRange: &shardv1.ActivateRangeCmd{
		OperatorId: op, Range: rg, Epoch: epoch, Config: DefaultConfig(), SourceLastNowUnixNano: lastNow}}}
}

func releaseRangeCmd(op uint64, keep *shardv1.RangeDescriptor) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_ReleaseRange{ReleaseRange: &shardv1.ReleaseRangeCmd{OperatorId: op, Keep: keep}}}
}

func (r *replica) export(start, end uint64, page uint32) *shardv1.RangeRecords {
	r.t.Helper()
	all := &shardv1.RangeRecords{}
	var after []byte
	for {
		q := r.query(0, &shardv1.Query{Query: &shardv1.Query_Export{Export: &shardv1.ExportQuery{Start: start, End: end, After: after, Limit: page}}})
		proto.Merge(all, q.GetRecords())
		if after = q.GetNext(); len(after) == 0 {
			return all
		}
	}
}

func (r *replica) meta() *shardv1.ShardMeta {
	return r.query(0, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}}).GetMeta()
}

// checkCounts recounts held locks, queued waiters and per-tenant waiters
// from r's records and compares them with the derived counts.
func checkCounts(t fataler, name string, r *replica) {
	t.Helper()
	recs := r.export(0, 0, 0)
	var held uint64
	for _, l := range recs.GetLocks() {
		if l.GetHeld() {
			held++
		}
	}
	tenants := map[string]uint32{}
	for _, w := range recs.GetWaiters() {
		tenants[w.GetTenant()]++
	}
	m := r.meta()
	if m.GetHeldLocks() != held || m.GetQueuedWaiters() != uint64(len(recs.GetWaiters())) {
		t.Fatalf("%s: meta counts %d held, %d queued; records say %d, %d", name, m.GetHeldLocks(), m.GetQueuedWaiters(), held, len(recs.GetWaiters()))
	}
	view := &records{g: r.sm.mu.db, initial: initialMeta(r.shardID)}
	for _, tenant := range []string{"", "t0", "t1"} {
		n, err := view.TenantWaiters(tenant)
		if err != nil || n != tenants[tenant] {
			t.Fatalf("%s: tenant %q counts %d waiters (%v); records say %d", name, tenant, n, err, tenants[tenant])
		}
	}
}

// TestMoveRangeKeepsEveryRecord runs random lock traffic on a shard,
// moves the upper part of its range to a new shard through the fence,
// export, import, activate and release steps (with a page imported twice
// and the import restarted, as a resumed operator would), with traffic
// during the fence, and checks that: exactly one shard serves every
// resource; the fence froze the moving records; the new shard holds
// exactly them, with consistent counts; the source no longer holds them;
// retries replay moved leases; and every token the new shard grants is
// above every token the source granted for that resource.
func TestMoveRangeKeepsEveryRecord(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp("", "warden-move-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		src := openReplica(rt, dir+"/src", FirstShard)
		defer func() { src.sm.Close() }()
		dst := openReplica(rt, dir+"/dst", 2)
		defer func() { dst.sm.Close() }()
		dst.generation = 2 // the operator stamps the generation it will commit

		resources := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
		maxToken := map[string]uint64{}
		type lease struct {
			resource, req string
			id            []byte
		}
		var leases []lease
		now := t0
		n := 0
		traffic := func(r *replica, steps int) {
			for range steps {
				n++
				now += rapid.Int64Range(0, 3*second).Draw(rt, "advance")
				res := rapid.SampledFrom(resources).Draw(rt, "resource")
				var env *shardv1.Envelope
				switch k := rapid.IntRange(0, 4).Draw(rt, "kind"); {
				case k <= 1 || len(leases) == 0:
					id := leaseID(fmt.Sprintf("l%d", n))
					env = acquireCmd(res, fmt.Sprintf("q%d", n), 5*second, "", id)
					env.GetAcquire().WaitTimeoutNanos = rapid.SampledFrom([]int64{0, 10 * second}).Draw(rt, "wait")
					env.GetAcquire().Tenant = rapid.SampledFrom([]string{"", "t0", "t1"}).Draw(rt, "tenant")
					leases = append(leases, lease{res, fmt.Sprintf("q%d", n), id})
				case k == 2:
					l := rapid.SampledFrom(leases).Draw(rt, "lease")
					env = renewCmd(l.resource, l.id)
				default:
					l := rapid.SampledFrom(leases).Draw(rt, "lease")
					env = releaseCmd(l.resource, l.id)
				}
				res = resourceOf(env)
				serving := Serves(r.meta(), res)
				out := r.propose(now, env)
				refused := out.GetCode() == shardv1.Code_CODE_UNAVAILABLE || out.GetCode() == shardv1.Code_CODE_WRONG_SHARD
				if refused == serving {
					rt.Fatalf("shard %d answered %v for %s (hash %#x); it serves it: %v", r.shardID, out.GetCode(), res, keyspace.Hash(res), serving)
				}
				for _, tok := range tokensOf(res, env, out) {
					if tok.token <= maxToken[tok.resource] {
						rt.Fatalf("shard %d granted %s token %#x, not above the last one, %#x", r.shardID, tok.resource, tok.token, maxToken[tok.resource])
					}
					maxToken[tok.resource] = tok.token
				}
			}
		}
		traffic(src, rapid.IntRange(5, 40).Draw(rt, "before"))

		split := keyspace.Hash(rapid.SampledFrom(resources).Draw(rt, "split at"))
		if split == 0 {
			split = 1
		}
		const op = 7
		if c := src.propose(now, fenceCmd(op, split, 0)).GetCode(); c != shardv1.Code_CODE_OK {
			rt.Fatalf("fence: %v", c)
		}
		frozen := src.export(split, 0, 0)
		traffic(src, rapid.IntRange(0, 15).Draw(rt, "during fence"))
		if got := src.export(split, 0, 0); !proto.Equal(got, frozen) {
			rt.Fatalf("the fence let the moving records change:\n%v\n%v", frozen, got)
		}

		page := rapid.Uint32Range(1, 6).Draw(rt, "page")
		imp := func() {
			var after []byte
			for {
				q := src.query(now, &shardv1.Query{Query: &shardv1.Query_Export{Export: &shardv1.ExportQuery{Start: split, After: after, Limit: page}}})
				times := rapid.IntRange(1, 2).Draw(rt, "import times")
				for range times {
					if res := dst.propose(now, importCmd(op, q.GetRecords())); res.GetCode() != shardv1.Code_CODE_OK {
						rt.Fatalf("import: %v %s", res.GetCode(), res.GetReason())
					}
				}
				if after = q.GetNext(); len(after) == 0 {
					return
				}
			}
		}
		imp()
		if rapid.Bool().Draw(rt, "restart import") {
			imp()
		}
		if c := dst.propose(now, importCmd(op+1, frozen)).GetCode(); c != shardv1.Code_CODE_FAILED_PRECONDITION {
			rt.Fatalf("another operator imported into a claimed shard: %v", c)
		}
		srcMeta := src.meta()
		moved := &shardv1.RangeDescriptor{ShardId: 2, Start: split, Generation: 2}
		for range rapid.IntRange(1, 2).Draw(rt, "activations") {
			if res := dst.propose(now, activateCmd(op, moved, 2, srcMeta.GetLastNowUnixNano())); res.GetCode() != shardv1.Code_CODE_OK {
				rt.Fatalf("activate: %v %s", res.GetCode(), res.GetReason())
			}
		}
		if got := dst.export(0, 0, 0); !proto.Equal(got, frozen) {
			rt.Fatalf("the new shard holds other records than the moved ones:\n%v\n%v", frozen, got)
		}
		checkCounts(rt, "new shard", dst)
		// Moving records changes no holder: no lock events (a watch
		// follows the range and reads the imported holders as state).
		if len(dst.events) > 0 {
			rt.Fatalf("the import reported lock events: %+v", dst.events)
		}

		// A retry of a moved, current lease replays it from the new shard.
		for _, l := range frozen.GetLocks() {
			if !l.GetHeld() || now >= l.GetExpiresAtUnixNano() {
				continue
			}
			res := dst.propose(now, acquireCmd(l.GetResource(), l.GetRequestId(), l.GetLeaseTtlNanos(), l.GetHolder(), l.GetLeaseId()))
			if !res.GetReplayed() || !bytes.Equal(res.GetLease().GetLeaseId(), l.GetLeaseId()) {
				rt.Fatalf("retry of moved lease %s/%s: %v %s replayed=%v", l.GetResource(), l.GetRequestId(), res.GetCode(), res.GetReason(), res.GetReplayed())
			}
		}

		keep := &shardv1.RangeDescriptor{ShardId: 1, End: split, Generation: 2}
		src.generation = 2 // the map that moved the range is committed
		heard := len(src.events)
		for range rapid.IntRange(1, 2).Draw(rt, "releases") {
			if res := src.propose(now, releaseRangeCmd(op, keep)); res.GetCode() != shardv1.Code_CODE_OK {
				rt.Fatalf("release: %v %s", res.GetCode(), res.GetReason())
			}
		}
		if got := src.export(split, 0, 0); len(got.GetLocks())+len(got.GetDedups())+len(got.GetWaiters()) > 0 {
			rt.Fatalf("the source kept moved records: %v", got)
		}
		checkCounts(rt, "source", src)
		if evs := src.events[heard:]; len(evs) > 0 {
			rt.Fatalf("the release of the moved range reported lock events: %+v", evs)
		}
		for _, res := range resources {
			if Serves(src.meta(), res) == Serves(dst.meta(), res) {
				rt.Fatalf("%s (hash %#x) served by both or neither shard (split at %#x)", res, keyspace.Hash(res), split)
			}
		}

		// Traffic on both shards afterwards: the traffic helper checks that
		// the new shard's tokens exceed the source's, and only the serving
		// shard answers.
		for range 3 {
			traffic(src, 5)
			traffic(dst, 5)
		}
		checkCounts(rt, "source after traffic", src)
		checkCounts(rt, "new shard after traffic", dst)
	})
}

type grantToken struct {
	resource string
	token    uint64
}

// tokensOf lists the tokens a result newly granted, to the Acquire's
// caller or to waiters.
func tokensOf(resource string, env *shardv1.Envelope, res *shardv1.Result) []grantToken {
	var out []grantToken
	if env.GetAcquire() != nil && res.GetCode() == shardv1.Code_CODE_OK && !res.GetReplayed() {
		out = append(out, grantToken{resource, res.GetLease().GetFencingToken()})
	}
	for _, g := range res.GetGranted() {
		out = append(out, grantToken{g.GetResource(), g.GetLease().GetFencingToken()})
	}
	return out
}

func resourceOf(env *shardv1.Envelope) string {
	switch c := env.GetCommand().(type) {
	case *shardv1.Envelope_Acquire:
		return c.Acquire.GetResource()
	case *shardv1.Envelope_Renew:
		return c.Renew.GetResource()
	case *shardv1.Envelope_Release:
		return c.Release.GetResource()
	}
	return ""
}
