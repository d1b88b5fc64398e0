package shard

import (
	"testing"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

func renewBatchCmd(items ...*shardv1.RenewCmd) *shardv1.Envelope {
	return &shardv1.Envelope{Command: &shardv1.Envelope_RenewBatch{RenewBatch: &shardv1.RenewBatchCmd{Items: items}}}
}

// A RenewBatch gives each item Renew's own result and renews only current
// leases (rule 3); an empty or oversized batch renews nothing.
func TestRenewBatchItems(t *testing.T) {
	r := newReplica(t)
	idA, idB := []byte("lease-a-00000000"), []byte("lease-b-00000000")
	r.propose(second, acquireCmd("a", "ra", 10*second, "", idA))
	r.propose(second, acquireCmd("b", "rb", 10*second, "", idB))
	got := r.propose(3*second, renewBatchCmd(
		&shardv1.RenewCmd{Resource: "a", LeaseId: idA},
		&shardv1.RenewCmd{Resource: "b", LeaseId: idA}, // not b's lease
		&shardv1.RenewCmd{Resource: "missing", LeaseId: idA},
		&shardv1.RenewCmd{Resource: "", LeaseId: idA},
		&shardv1.RenewCmd{Resource: "b", LeaseId: idB},
	))
	want := []shardv1.Code{shardv1.Code_CODE_OK, shardv1.Code_CODE_FAILED_PRECONDITION, shardv1.Code_CODE_FAILED_PRECONDITION,
		shardv1.Code_CODE_INVALID_ARGUMENT, shardv1.Code_CODE_OK}
	if got.GetCode() != shardv1.Code_CODE_OK || len(got.GetItems()) != len(want) {
		t.Fatalf("batch: %v", got)
	}
	for i, w := range want {
		if c := got.GetItems()[i].GetCode(); c != w {
			t.Errorf("item %d: %v, want %v", i, c, w)
		}
	}
	if exp := got.GetItems()[0].GetLease().GetExpiresAtUnixNano(); exp != 13*second {
		t.Errorf("a expires at %d, want %d", exp, 13*second)
	}
	// b was renewed by its own lease only: a renewal of it with a's lease
	// changed nothing, so a plain Renew still sees b's lease current.
	if res := r.propose(4*second, renewCmd("b", idB)); res.GetCode() != shardv1.Code_CODE_OK {
		t.Fatalf("renew b: %v", res)
	}

	for _, n := range []int{0, MaxRenewBatch + 1} {
		items := make([]*shardv1.RenewCmd, n)
		for i := range items {
			items[i] = &shardv1.RenewCmd{Resource: "a", LeaseId: idA}
		}
		res := r.propose(5*second, renewBatchCmd(items...))
		if res.GetCode() != shardv1.Code_CODE_INVALID_ARGUMENT || res.GetField() != "items" {
			t.Errorf("%d items: %v", n, res)
		}
	}
	// The refused batches renewed nothing: a still expires 10 s after
	// its renewal at 3 s.
	if d := r.query(5*second, describeQuery("a")); d.GetLock().GetExpiresAtUnixNano() != 13*second {
		t.Errorf("a expires at %d after refused batches", d.GetLock().GetExpiresAtUnixNano())
	}
}

// A RenewBatchCmd in a version 1 envelope is an unknown command, as it is
// to a version 1 binary; applying it would make replicas of the two
// versions diverge.
func TestRenewBatchNeedsVersion2(t *testing.T) {
	r := newReplica(t)
	id := []byte("lease-a-00000000")
	r.propose(second, acquireCmd("a", "ra", 10*second, "", id))
	env := renewBatchCmd(&shardv1.RenewCmd{Resource: "a", LeaseId: id})
	if VersionOf(env) != 2 || VersionOf(renewCmd("a", id)) != 1 {
		t.Fatalf("versions: batch %d, renew %d", VersionOf(env), VersionOf(renewCmd("a", id)))
	}
	env.Version, env.ShardId, env.Generation, env.NowUnixNano = 1, r.shardID, r.generation, 3*second
	b, err := EncodeCommand(env)
	if err != nil {
		t.Fatal(err)
	}
	res := r.proposeRaw(b)[0]
	if res.GetCode() != shardv1.Code_CODE_INVALID_ARGUMENT || res.GetField() != "command" {
		t.Fatalf("version 1 batch: %v", res)
	}
	if d := r.query(3*second, describeQuery("a")); d.GetLock().GetExpiresAtUnixNano() != 11*second {
		t.Errorf("a expires at %d: the version 1 batch renewed it", d.GetLock().GetExpiresAtUnixNano())
	}
}

func describeQuery(resource string) *shardv1.Query {
	return &shardv1.Query{Query: &shardv1.Query_Describe{Describe: &shardv1.DescribeQuery{Resource: resource}}}
}
