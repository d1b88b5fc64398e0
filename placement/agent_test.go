package placement

import (
	"errors"
	"sync"
	"testing"
	"time"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// Fault 7 of issue 41: a restarting node's agent starts its replicas
// startWorkers at a time, not one after another (whose time grew with
// the shard count before the node served: 0.8–3.4 s of 64 shards). Each
// start here blocks until startWorkers of them are in flight; started
// one at a time, none would ever see the others, and the test fails
// after 10 s. Every replica is then running, except the one whose start
// failed, which the next Reconcile starts.
func TestReconcileStartsReplicasAtOnce(t *testing.T) {
	const shards = 3 * startWorkers
	st := &placementv1.State{Generation: 1, Nodes: []*placementv1.Node{{Id: 1, RaftAddr: "a:1"}, {Id: 2, RaftAddr: "b:1"}}}
	for id := uint64(1); id <= shards; id++ {
		st.Shards = append(st.Shards, &placementv1.Shard{Id: id, Replicas: []*placementv1.Replica{{NodeId: 1, ReplicaId: 1}, {NodeId: 2, ReplicaId: 2}}})
	}
	var mu sync.Mutex
	inFlight, most := 0, 0
	all := make(chan struct{}) // closed once startWorkers are in flight, or after 10 s
	release := sync.OnceFunc(func() { close(all) })
	started := map[uint64]map[uint64]string{}
	failOnce := true
	a := &Agent{node: &Node{cfg: NodeConfig{ID: 1}}, running: map[uint64]uint64{}}
	a.start = func(s *placementv1.Shard, members map[uint64]string) error {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		if inFlight == startWorkers {
			release()
		}
		mu.Unlock()
		select {
		case <-all:
		case <-time.After(10 * time.Second):
			release()
		}
		mu.Lock()
		defer mu.Unlock()
		inFlight--
		if s.GetId() == 5 && failOnce {
			failOnce = false
			return errors.New("disk busy")
		}
		started[s.GetId()] = members
		return nil
	}
	if err := a.Reconcile(NewMap(st)); err == nil {
		t.Fatal("a failed start was not reported")
	}
	if most != startWorkers {
		t.Fatalf("at most %d replicas started at once, want %d", most, startWorkers)
	}
	if len(a.running) != shards-1 || a.Hosts(5) {
		t.Fatalf("%d replicas running (shard 5's: %v), want %d without shard 5's", len(a.running), a.Hosts(5), shards-1)
	}
	if err := a.Reconcile(NewMap(st)); err != nil || !a.Hosts(5) || len(started) != shards {
		t.Fatalf("the second Reconcile: %v; shard 5 running: %v; %d started", err, a.Hosts(5), len(started))
	}
	if m := started[7]; len(m) != 2 || m[1] != "a:1" || m[2] != "b:1" {
		t.Fatalf("shard 7 started with members %v", m)
	}
}
