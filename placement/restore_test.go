package placement

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// backedUpState is a placement state as a backup holds it: three registered
// nodes with incarnations, two shards after a split and a move (whose
// replica is marked joining), and an epoch window.
func backedUpState() *placementv1.State {
	var nodes []*placementv1.Node
	for i := range 3 {
		nodes = append(nodes, &placementv1.Node{Id: uint64(i + 1), Zone: fmt.Sprintf("az%d", i+1), RaftAddr: "r", ListenAddr: "l"})
	}
	st, res := ApplyMeta(&placementv1.State{}, BootstrapCommand(nodes))
	if res.GetError() != "" {
		panic(res.GetError())
	}
	for _, n := range st.Nodes {
		n.Incarnation = "old-incarnation"
	}
	st.Ranges[0].End = 1 << 63
	st.Ranges = append(st.Ranges, &shardv1.RangeDescriptor{ShardId: 2, Start: 1 << 63, Generation: 2})
	st.Shards = append(st.Shards, &placementv1.Shard{Id: 2, Epoch: 2, State: placementv1.ShardState_SHARD_STATE_ACTIVE,
		Replicas: []*placementv1.Replica{{ReplicaId: 1, NodeId: 1}, {ReplicaId: 2, NodeId: 2}, {ReplicaId: 4, NodeId: 3, Join: true}}})
	st.Generation, st.LastEpoch, st.EpochLimit, st.NextShardId, st.NextOperatorId = 2, 2, 34, 3, 3
	return st
}

// Every restored shard takes a new epoch above the backup's window plus
// the gap (or from --min-epoch, never below the window), so no token of
// the restored cluster repeats one the old cluster issued, even after
// the backup; the allocator resumes above them; incarnations and join
// marks are gone; the same inputs give the same state and restore id.
func TestPrepareRestore(t *testing.T) {
	st := backedUpState()
	out, id, epochs, err := PrepareRestore(st, "backup-1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if epochs[1] != 34+RestoreEpochGap || epochs[2] != 35+RestoreEpochGap || out.GetLastEpoch() != epochs[2] || out.GetEpochLimit() != epochs[2]+1 {
		t.Fatalf("epochs %v, last %d, limit %d", epochs, out.GetLastEpoch(), out.GetEpochLimit())
	}
	for _, s := range out.GetShards() {
		if s.GetEpoch() != epochs[s.GetId()] {
			t.Fatalf("shard %d has epoch %d in the map, %d in its records", s.GetId(), s.GetEpoch(), epochs[s.GetId()])
		}
		for _, r := range s.GetReplicas() {
			if r.GetJoin() || r.GetNonVoting() {
				t.Fatalf("shard %d replica %d still joins", s.GetId(), r.GetReplicaId())
			}
		}
	}
	for _, n := range out.GetNodes() {
		if n.GetIncarnation() != "" {
			t.Fatalf("node %d keeps incarnation %q", n.GetId(), n.GetIncarnation())
		}
	}
	if st.GetNodes()[0].GetIncarnation() == "" || st.GetShards()[0].GetEpoch() != 1 {
		t.Fatal("PrepareRestore changed its argument")
	}
	again, id2, _, _ := PrepareRestore(st, "backup-1", 0)
	if id2 != id || !proto.Equal(again, out) || out.GetRestoreId() != id {
		t.Fatal("the same backup prepared twice differs")
	}
	if _, other, _, _ := PrepareRestore(st, "backup-2", 0); other == id {
		t.Fatal("two backups share a restore id")
	}
	_, id3, epochs, _ := PrepareRestore(st, "backup-1", 500)
	if epochs[1] != 500 || id3 == id {
		t.Fatalf("--min-epoch 500: epochs %v, id %s (without: %s)", epochs, id3, id)
	}
	if _, _, epochs, _ := PrepareRestore(st, "backup-1", 3); epochs[1] != 34 {
		t.Fatalf("--min-epoch below the window: epochs %v, want from the window, 34", epochs)
	}
	if _, _, _, err := PrepareRestore(st, "backup-1", shard.MaxEpoch); err == nil {
		t.Fatal("epochs past the maximum were prepared")
	}
	busy := proto.CloneOf(st)
	busy.Operators = []*placementv1.Operator{{Id: 2}}
	if _, _, _, err := PrepareRestore(busy, "backup-1", 0); err == nil || !strings.Contains(err.Error(), "operator 2") {
		t.Fatalf("a state with an operator: %v", err)
	}
}

func restoreMembers(addr string) []*placementv1.Node {
	var out []*placementv1.Node
	for i := range 3 {
		out = append(out, &placementv1.Node{Id: uint64(i + 1), RaftAddr: addr + "-raft", ListenAddr: addr + "-api"})
	}
	return out
}

// A RestoreCmd creates the state once; the same restore again is a
// no-op (every initial member proposes it), another restore or a
// bootstrap is refused, and a restore is never refused for the version
// the empty state's nodes applied.
func TestApplyRestore(t *testing.T) {
	prepared, id, _, err := PrepareRestore(backedUpState(), "backup-1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := RestoreCommand(prepared, restoreMembers("new")[:2]); err == nil || !strings.Contains(err.Error(), "missing [3]") {
		t.Fatalf("members without node 3: %v", err)
	}
	cmd, err := RestoreCommand(prepared, restoreMembers("new"))
	if err != nil {
		t.Fatal(err)
	}
	if cmd, err = stampVersion(cmd, clusterMetaVersion(&placementv1.State{})); err != nil || cmd.GetVersion() != MetaCommandVersion {
		t.Fatalf("a restore on an empty state stamped %v, %v", cmd.GetVersion(), err)
	}
	st, res := ApplyMeta(&placementv1.State{}, cmd)
	if res.GetError() != "" || st.GetRestoreId() != id || st.GetGeneration() != 2 || st.GetNodes()[0].GetRaftAddr() != "new-raft" {
		t.Fatalf("restore: %v, state %v", res, st)
	}
	if err := CheckMap(st); err != nil {
		t.Fatal(err)
	}
	if again, res := ApplyMeta(st, cmd); res.GetError() != "" || !proto.Equal(again, st) {
		t.Fatalf("the same restore again: %v", res)
	}
	other, _ := RestoreCommand(prepared, restoreMembers("other"))
	other.GetRestore().RestoreId = "another"
	other.GetRestore().GetState().RestoreId = "another"
	if _, res := ApplyMeta(st, other); !strings.Contains(res.GetError(), "did not create") {
		t.Fatalf("another restore on the restored state: %v", res)
	}
	if _, res := ApplyMeta(&placementv1.State{}, other); res.GetError() != "" {
		t.Fatalf("another restore on an empty state: %v", res)
	}
	if _, res := ApplyMeta(st, BootstrapCommand(restoreMembers("x"))); res.GetError() != ErrBootstrapped.Error() {
		t.Fatalf("a bootstrap on the restored state: %v", res)
	}
	broken := proto.CloneOf(cmd)
	broken.GetRestore().GetState().Ranges = broken.GetRestore().GetState().Ranges[:1]
	if _, res := ApplyMeta(&placementv1.State{}, broken); !strings.Contains(res.GetError(), "state:") {
		t.Fatalf("a restore whose ranges leave a gap: %v", res)
	}
}

// A directory wardend restore wrote may start without a Raft log until
// its first start registered (FinishRestore); then losing the log is
// refused as for any member.
func TestRestoredIdentity(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "node")
	prepared, id, _, _ := PrepareRestore(backedUpState(), "backup-1", 0)
	written, err := WriteRestore(dir, 2, &placementv1.RestoreCmd{State: prepared, RestoreId: id})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenIdentity(dir, 2, InitRefuse); err == nil {
		t.Fatal("a restored directory opened without InitRestore")
	}
	got, err := OpenIdentity(dir, 2, InitRestore)
	if err != nil || got.Incarnation != written.Incarnation || got.Created {
		t.Fatalf("restored identity %+v, %v; wrote %+v", got, err, written)
	}
	pending, err := PendingRestore(dir)
	if err != nil || pending.GetRestoreId() != id {
		t.Fatalf("pending restore %v, %v", pending, err)
	}
	if err := FinishRestore(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenIdentity(dir, 2, InitRestore); err == nil || !strings.Contains(err.Error(), "Raft log is gone") {
		t.Fatalf("a finished restore without its log: %v", err)
	}
	if p, err := PendingRestore(dir); p != nil || err != nil {
		t.Fatalf("pending after finish: %v %v", p, err)
	}
	if err := FinishRestore(dir); err != nil {
		t.Fatal("FinishRestore twice:", err)
	}
}

// A damaged restore.pb is an error naming the file, never a panic.
func FuzzPendingRestore(f *testing.F) {
	prepared, id, _, _ := PrepareRestore(backedUpState(), "backup-1", 0)
	good, _ := proto.Marshal(&placementv1.RestoreCmd{State: prepared, RestoreId: id})
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, restoreFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd, err := PendingRestore(dir)
		if err == nil && cmd.GetRestoreId() == "" {
			t.Fatal("a pending restore without its id")
		}
		if err != nil && !strings.Contains(err.Error(), restoreFile) {
			t.Fatalf("the error does not name the file: %v", err)
		}
	})
}
