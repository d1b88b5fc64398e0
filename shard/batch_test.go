package shard

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// Dragonboat hands Update a batch of entries that are applied in one Pebble
// batch, each reading the writes of the ones before it. Applying a command
// sequence in random batches must give exactly the results and state of
// applying it one entry at a time.
func TestBatchingDoesNotChangeResults(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		one := openReplica(rt, t.TempDir(), FirstShard)
		defer one.sm.Close()
		batched := openReplica(rt, t.TempDir(), FirstShard)
		defer batched.sm.Close()

		now := t0
		var cmds [][]byte
		n := rapid.IntRange(1, 60).Draw(rt, "commands")
		for i := range n {
			now += rapid.Int64Range(0, 2*second).Draw(rt, "advance")
			res := fmt.Sprintf("r%d", rapid.IntRange(0, 3).Draw(rt, "resource"))
			id := leaseID(fmt.Sprintf("l%d", rapid.IntRange(0, i).Draw(rt, "lease")))
			var env *shardv1.Envelope
			switch rapid.IntRange(0, 5).Draw(rt, "kind") {
			case 0, 1:
				env = acquireCmd(res, fmt.Sprintf("q%d", rapid.IntRange(0, i).Draw(rt, "req")), second, "", leaseID(fmt.Sprintf("l%d", i)))
			case 2:
				env = renewCmd(res, id)
			case 3:
				env = releaseCmd(res, id)
			case 4:
				env = expireCmd(&shardv1.ExpireItem{Resource: res, LeaseId: id, ExpiresAtUnixNano: now - second})
			case 5:
				env = forgetCmd(&shardv1.ForgetCmd{IdleLocks: []string{res}, Dedup: []*shardv1.DedupRef{{Resource: res, RequestId: "q0"}}})
			}
			env.Version, env.ShardId, env.Generation, env.NowUnixNano = CommandVersion, 1, 1, now
			b, err := EncodeCommand(env)
			if err != nil {
				rt.Fatal(err)
			}
			cmds = append(cmds, b)
		}
		w := int64(0)
		cfg, _ := EncodeCommand(&shardv1.Envelope{Version: CommandVersion, ShardId: 1, Generation: 1, NowUnixNano: t0,
			Command: &shardv1.Envelope_SetConfig{SetConfig: &shardv1.SetConfigCmd{DedupWindowNanos: &w}}})
		cmds = append([][]byte{cfg}, cmds...)

		var want []*shardv1.Result
		for _, c := range cmds {
			want = append(want, one.proposeRaw(c)...)
		}
		var got []*shardv1.Result
		for rest := cmds; len(rest) > 0; {
			k := rapid.IntRange(1, len(rest)).Draw(rt, "batch")
			got = append(got, batched.proposeRaw(rest[:k]...)...)
			rest = rest[k:]
		}
		for i := range want {
			if !proto.Equal(want[i], got[i]) {
				rt.Fatalf("command %d: alone %v, in a batch %v", i, want[i], got[i])
			}
		}
		if a, b := dump(t, one), dump(t, batched); a != b {
			rt.Fatalf("state differs:\n%s\nvs\n%s", a, b)
		}
	})
}
