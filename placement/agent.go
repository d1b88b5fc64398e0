package placement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/lni/dragonboat/v4"
	"google.golang.org/protobuf/proto"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
)

// MetaClient reads and writes the placement group, through a local replica
// (localMeta) or over the network from a node that hosts none.
type MetaClient interface {
	// Propose commits cmd; a refused command is a *RefusedError.
	Propose(ctx context.Context, cmd *placementv1.Command) (*placementv1.Result, error)
	// Read returns the committed state, linearizably.
	Read(ctx context.Context) (*placementv1.State, error)
}

// RefusedError is a placement command the state machine refused.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "placement: " + e.Reason }

// localMeta is the MetaClient over this node's replica of the placement
// group. Dragonboat forwards proposals made on a follower to the leader.
type localMeta struct{ nh *dragonboat.NodeHost }

// metaTimeout bounds one placement proposal or read (Dragonboat requires
// a deadline, and a caller with a long one retries rather than wait on a
// request the group lost).
const metaTimeout = 5 * time.Second

// Propose implements MetaClient.
//
// It stamps cmd with the newest version every node registered a binary
// applying (clusterMetaVersion, read first), so a rule changed in a
// version decides only once every replica knows it; a command that needs
// more is ErrMetaVersion (retry after the rolling upgrade).
func (m localMeta) Propose(ctx context.Context, cmd *placementv1.Command) (*placementv1.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, metaTimeout)
	defer cancel()
	st, err := m.Read(ctx)
	if err != nil {
		return nil, err
	}
	cmd, err = stampVersion(cmd, clusterMetaVersion(st))
	if err != nil {
		return nil, err
	}
	b, err := proto.Marshal(cmd)
	if err != nil {
		return nil, err
	}
	out, err := m.nh.SyncPropose(ctx, m.nh.GetNoOPSession(MetaShardID), b)
	if err != nil {
		return nil, fmt.Errorf("placement: propose: %w", err)
	}
	res := &placementv1.Result{}
	if err := proto.Unmarshal(out.Data, res); err != nil {
		return nil, fmt.Errorf("placement: result: %w", err)
	}
	if res.GetError() != "" {
		return res, &RefusedError{res.GetError()}
	}
	return res, nil
}

// Read implements MetaClient.
func (m localMeta) Read(ctx context.Context) (*placementv1.State, error) {
	ctx, cancel := context.WithTimeout(ctx, metaTimeout)
	defer cancel()
	out, err := m.nh.SyncRead(ctx, MetaShardID, nil)
	if err != nil {
		return nil, fmt.Errorf("placement: read: %w", err)
	}
	return out.(*placementv1.State), nil
}

// Bootstrap creates the first map with create (a BootstrapCmd from the
// initial members, or a RestoreCmd; nil for a node that creates none),
// unless it exists, checks that the placement group knows this node by the
// incarnation of its data directory (CheckIncarnation), and registers
// this node (with its zone and incarnation) in it. It returns the
// placement state read after the registration, to route by. It retries
// until the placement group has a quorum or ctx ends (a first election
// may take longer than one read waits); a refused command or a failed
// incarnation check ends it at once.
func Bootstrap(ctx context.Context, meta MetaClient, create *placementv1.Command, self *placementv1.Node, id Identity) (*placementv1.State, error) {
	for {
		st, err := bootstrapOnce(ctx, meta, create, self, id)
		if err == nil {
			return st, nil
		}
		var refused *RefusedError
		var identity *IdentityError
		if errors.As(err, &refused) || errors.As(err, &identity) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("placement: bootstrap: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func bootstrapOnce(ctx context.Context, meta MetaClient, create *placementv1.Command, self *placementv1.Node, id Identity) (*placementv1.State, error) {
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if create != nil {
		// Every initial member proposes the same first state; a bootstrap
		// after another's is refused harmlessly (a restore after the same
		// restore is a no-op; after anything else, it fails the start).
		_, err := meta.Propose(pctx, create)
		var refused *RefusedError
		if err != nil && !(errors.As(err, &refused) && refused.Reason == ErrBootstrapped.Error()) {
			return nil, err
		}
	}
	st, err := meta.Read(pctx)
	if err != nil {
		return nil, err
	}
	if err := CheckIncarnation(st, id); err != nil {
		return nil, err
	}
	if _, err = meta.Propose(pctx, &placementv1.Command{Command: &placementv1.Command_RegisterNode{RegisterNode: &placementv1.RegisterNodeCmd{Node: self}}}); err != nil {
		return nil, err
	}
	return meta.Read(pctx)
}

// Agent starts and stops the data shard replicas of one node to match the
// placement map (Dragonboat cannot start a group from inside a state
// machine, so placement changes become replica starts here).
type Agent struct {
	node *Node
	// start starts the node's replica of a shard (Node.StartDataShard).
	start func(s *placementv1.Shard, members map[uint64]string) error
	mu    sync.Mutex
	// running maps shard id → replica id of the replicas it started.
	running map[uint64]uint64
}

// NewAgent returns the agent of node.
func NewAgent(node *Node) *Agent {
	return &Agent{node: node, start: node.StartDataShard, running: map[uint64]uint64{}}
}

// startWorkers is how many replicas Reconcile starts at once. A start
// reads the replica's files (the rollback check opens its state
// machine's database) before Dragonboat's part, which NodeHost runs one
// at a time: started one after another, a node's restart took about
// 30 ms a replica on a 2-core machine (0.8–3.4 s of 64) before it served.
const startWorkers = 8

// Reconcile starts every replica m places on the node that is not running
// and stops (and deletes) every running one m no longer places there. An
// empty (unbootstrapped) map changes nothing.
func (a *Agent) Reconcile(m *Map) error {
	if m.Generation() == 0 {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	want := map[uint64]*placementv1.Replica{}
	shards := map[uint64]*placementv1.Shard{}
	for _, s := range m.State().GetShards() {
		for _, r := range s.GetReplicas() {
			if r.GetNodeId() == a.node.ID() {
				want[s.GetId()], shards[s.GetId()] = r, s
			}
		}
	}
	var errs []error
	for id, err := range a.startAll(m, want, shards) {
		if _, failed := errors.AsType[*RolledBackError](err); failed {
			continue // left stopped, logged once; the node serves its other replicas
		}
		if err != nil && !errors.Is(err, dragonboat.ErrShardAlreadyExist) {
			errs = append(errs, err)
			continue
		}
		a.running[id] = want[id].GetReplicaId()
	}
	ids := map[uint64]uint64{}
	for id, r := range want {
		ids[id] = r.GetReplicaId()
	}
	errs = append(errs, a.node.dropFailed(ids))
	for id, replica := range a.running {
		if r, ok := want[id]; ok && r.GetReplicaId() == replica {
			continue
		}
		if err := a.node.StopDataShard(id, replica); err != nil {
			errs = append(errs, err)
			continue
		}
		slog.Info("replica removed", "node", a.node.ID(), "shard", id, "replica", replica)
		delete(a.running, id)
	}
	return errors.Join(errs...)
}

// startAll starts, startWorkers at a time, every replica of want (by
// shard id, with its shard in shards) that is not running and did not
// fail, and returns each start's error by shard id. The caller holds
// a.mu.
func (a *Agent) startAll(m *Map, want map[uint64]*placementv1.Replica, shards map[uint64]*placementv1.Shard) map[uint64]error {
	type start struct {
		shard   *placementv1.Shard
		members map[uint64]string
	}
	var todo []start
	for id, r := range want {
		if _, ok := a.running[id]; ok || a.node.ReplicaFailed(id) != nil {
			continue
		}
		var members map[uint64]string // a joining replica learns them from the leader
		if !r.GetJoin() {
			members = m.Members(m.Shard(id))
		}
		todo = append(todo, start{shards[id], members})
	}
	out := make(map[uint64]error, len(todo))
	var mu sync.Mutex
	var wg sync.WaitGroup
	work := make(chan start)
	for range min(startWorkers, len(todo)) {
		wg.Go(func() {
			for st := range work {
				err := a.start(st.shard, st.members)
				mu.Lock()
				out[st.shard.GetId()] = err
				mu.Unlock()
			}
		})
	}
	for _, st := range todo {
		work <- st
	}
	close(work)
	wg.Wait()
	return out
}

// Hosts reports whether the agent runs a replica of shardID.
func (a *Agent) Hosts(shardID uint64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.running[shardID]
	return ok
}

// BootstrapCommand is the placement command that creates a new cluster's
// first map over the initial members.
func BootstrapCommand(members []*placementv1.Node) *placementv1.Command {
	return &placementv1.Command{Command: &placementv1.Command_Bootstrap{Bootstrap: &placementv1.BootstrapCmd{Nodes: members}}}
}
