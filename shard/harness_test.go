package shard

import (
	"testing"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"google.golang.org/protobuf/proto"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// replica drives one StateMachine directly, as Dragonboat would, without
// Raft: each propose is one Update with the next log index.
type replica struct {
	t     fataler
	dir   string
	sm    *StateMachine
	index uint64
	// shardID and generation stamp every proposal (1 and 1 unless a
	// test moves ranges).
	shardID, generation uint64
	// version, when set, is the envelope version of every proposal
	// (CommandVersion otherwise): scripts replay older rules with it.
	version uint32
	// events are the lock events the replica reported (Hooks.Events)
	// since it was opened, and reported the index its history is
	// complete through.
	events   []LockEvent
	reported uint64
}

// fataler is the part of testing.TB (and *rapid.T) the harness needs.
type fataler interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

func newReplica(t testing.TB) *replica {
	t.Helper()
	return newShardReplica(t, FirstShard)
}

// newShardReplica starts a replica of shardID in a temporary directory.
func newShardReplica(t testing.TB, shardID uint64) *replica {
	t.Helper()
	r := openReplica(t, t.TempDir(), shardID)
	t.Cleanup(func() { r.sm.Close() })
	return r
}

// openReplica opens the replica of shardID kept in dir; the caller closes
// r.sm.
func openReplica(t fataler, dir string, shardID uint64) *replica {
	t.Helper()
	r := &replica{t: t, dir: dir, shardID: shardID, generation: 1}
	r.open()
	return r
}

func (r *replica) open() {
	r.t.Helper()
	r.events = nil
	r.sm = NewStateMachine(r.dir, Hooks{Events: r.heard, Reset: func(_, applied uint64) { r.reported = applied }})(r.shardID, 1).(*StateMachine)
	idx, err := r.sm.Open(nil)
	if err != nil {
		r.t.Fatalf("open: %v", err)
	}
	if r.reported != idx {
		r.t.Fatalf("open: Reset heard index %d, Open returned %d", r.reported, idx)
	}
	r.index = idx
}

// heard keeps a batch's events, checking what a watcher relies on: the
// reports cover every applied index once, in order, and positions
// increase strictly.
func (r *replica) heard(shardID, applied uint64, evs []LockEvent) {
	r.t.Helper()
	if shardID != r.shardID || applied <= r.reported {
		r.t.Fatalf("events of shard %d through index %d, after a report through %d", shardID, applied, r.reported)
	}
	for _, e := range evs {
		if e.Index <= r.reported || e.Index > applied {
			r.t.Fatalf("event %+v outside the batch's indexes (%d, %d]", e, r.reported, applied)
		}
		var prev LockEvent
		if n := len(r.events); n > 0 {
			prev = r.events[n-1]
		}
		seq := uint32(0) // the entry's first event
		if prev.Index == e.Index {
			seq = prev.Seq + 1
		}
		if e.Index < prev.Index || e.Seq != seq {
			r.t.Fatalf("event %+v after %+v", e, prev)
		}
		r.events = append(r.events, e)
	}
	r.reported = applied
}

func (r *replica) proposeRaw(cmds ...[]byte) []*shardv1.Result {
	r.t.Helper()
	entries := make([]sm.Entry, len(cmds))
	for i, c := range cmds {
		r.index++
		entries[i] = sm.Entry{Index: r.index, Cmd: c}
	}
	out, err := r.sm.Update(entries)
	if err != nil {
		r.t.Fatalf("update: %v", err)
	}
	results := make([]*shardv1.Result, len(out))
	for i, e := range out {
		results[i] = &shardv1.Result{}
		if err := proto.Unmarshal(e.Result.Data, results[i]); err != nil {
			r.t.Fatalf("result: %v", err)
		}
		if e.Result.Value != uint64(results[i].GetCode()) {
			r.t.Fatalf("result value %d, code %v", e.Result.Value, results[i].GetCode())
		}
	}
	return results
}

// propose applies one command stamped with now (nanoseconds).
func (r *replica) propose(now int64, env *shardv1.Envelope) *shardv1.Result {
	r.t.Helper()
	return r.proposeRaw(r.encode(now, env))[0]
}

// encode stamps env as a proposal of r at now and encodes it.
func (r *replica) encode(now int64, env *shardv1.Envelope) []byte {
	r.t.Helper()
	env.Version, env.ShardId, env.Generation, env.NowUnixNano = CommandVersion, r.shardID, r.generation, now
	if r.version != 0 {
		env.Version = r.version
	}
	b, err := EncodeCommand(env)
	if err != nil {
		r.t.Fatal(err)
	}
	return b
}

func (r *replica) query(now int64, q *shardv1.Query) *shardv1.QueryResult {
	r.t.Helper()
	q.NowUnixNano = now
	out, err := r.sm.Lookup(q)
	if err != nil {
		r.t.Fatalf("lookup: %v", err)
	}
	return out.(*shardv1.QueryResult)
}

func acquireCmd(resource, reqID string, ttl int64, holder string, leaseID []byte) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_Acquire{Acquire: &shardv1.AcquireCmd{
		Resource: resource, RequestId: reqID, LeaseTtlNanos: ttl, Holder: holder, LeaseId: leaseID}}}
}

func renewCmd(resource string, leaseID []byte) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_Renew{Renew: &shardv1.RenewCmd{Resource: resource, LeaseId: leaseID}}}
}

func releaseCmd(resource string, leaseID []byte) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_Release{Release: &shardv1.ReleaseCmd{Resource: resource, LeaseId: leaseID}}}
}

func expireCmd(items ...*shardv1.ExpireItem) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_Expire{Expire: &shardv1.ExpireCmd{Items: items}}}
}

func forgetCmd(c *shardv1.ForgetCmd) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_Forget{Forget: c}}
}

func setConfigCmd(c *shardv1.SetConfigCmd) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_SetConfig{SetConfig: c}}
}
