package shard

import (
	"bytes"
	"errors"
	"testing"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// FuzzDecodeAndApply feeds arbitrary bytes to Update as a committed entry:
// whatever a buggy proposer sends, the replica answers with a Result and
// never panics or stops (except for a newer command version, by design).
func FuzzDecodeAndApply(f *testing.F) {
	id := bytes.Repeat([]byte{7}, 16)
	skew := int64(0)
	for _, env := range []*shardv1.Envelope{
		acquireCmd("r", "q", 0, "h", id),
		acquireCmd("r", "q", second, "", id[:3]),
		renewCmd("r", id),
		renewBatchCmd(&shardv1.RenewCmd{Resource: "r", LeaseId: id}, &shardv1.RenewCmd{Resource: "s", LeaseId: id[:4]}),
		releaseCmd("r", id),
		batchCmd(acquireItem("r", "q", id), releaseItem("r", id), acquireItem("s", "q", id[:5]), &shardv1.BatchItem{}),
		batchCmd(acquireItem("r", "p", id), releaseItem("r", id), releaseItem("r", id)), // a repeat: already released
		{Command: &shardv1.Envelope_SetLimit{SetLimit: &shardv1.SetLimitCmd{Key: "pool", Limit: 10}}},
		reserveCmd("pool/a", "v", 1),
		reserveCmd("pool/b", "v", 1), // the id another key of the pool holds
		expireCmd(&shardv1.ExpireItem{Resource: "r", LeaseId: id, ExpiresAtUnixNano: 5}),
		forgetCmd(&shardv1.ForgetCmd{Dedup: []*shardv1.DedupRef{{Resource: "r", RequestId: "q"}}, IdleLocks: []string{"r"}}),
		setConfigCmd(&shardv1.SetConfigCmd{MaxClockSkewNanos: &skew}),
		{Command: &shardv1.Envelope_Acquire{Acquire: &shardv1.AcquireCmd{Resource: "r", RequestId: "w", LeaseId: id, WaitTimeoutNanos: second, Tenant: "t"}}},
		{Command: &shardv1.Envelope_CancelWait{CancelWait: &shardv1.CancelWaitCmd{Resource: "r", RequestId: "w"}}},
		{Command: &shardv1.Envelope_DropWaiters{DropWaiters: &shardv1.DropWaitersCmd{Items: []*shardv1.WaiterRef{{Resource: "r", Seq: 1, DeadlineUnixNano: 2}}}}},
	} {
		env.Version, env.ShardId, env.Generation, env.NowUnixNano = CommandVersion, 1, 1, 1
		b, _ := EncodeCommand(env)
		f.Add(b)
	}
	f.Add([]byte{0xff, 0x01})
	rep := newReplica(f)
	f.Fuzz(func(t *testing.T, cmd []byte) {
		if _, err := DecodeCommand(cmd); errors.Is(err, ErrUnsupportedVersion) {
			return
		}
		rep.t = t
		res := rep.proposeRaw(cmd)[0]
		if _, ok := shardv1.Code_name[int32(res.GetCode())]; !ok || res.GetCode() == shardv1.Code_CODE_UNSPECIFIED {
			t.Fatalf("result code %v", res.GetCode())
		}
		if m := rep.query(0, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}}).GetMeta(); CheckConfig(m.GetConfig()) != nil {
			t.Fatalf("config became invalid: %v", m.GetConfig())
		}
	})
}

// FuzzLoadSnapshot feeds arbitrary bytes to RecoverFromSnapshot: it fails
// with an error or succeeds, never panics, and a failure keeps the state.
func FuzzLoadSnapshot(f *testing.F) {
	src := newReplica(f)
	fill(src)
	snap := snapshotOf(f, src)
	f.Add(snap)
	f.Add(snap[:len(snap)/3])
	f.Add([]byte(SnapshotMagic))
	rep := newReplica(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		before := dump(t, rep)
		if err := rep.sm.RecoverFromSnapshot(bytes.NewReader(data), nil); err != nil && dump(t, rep) != before {
			t.Fatalf("failed recovery (%v) changed the state", err)
		}
	})
}
