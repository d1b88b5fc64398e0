package rpc

import (
	"context"
	"time"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/router"
)

// core is the routing core as the client API's handlers (LockService,
// QuotaService, their batches, forwarding and the interceptors) call it:
// commands and reads by key, the wait of a queued Acquire, and what
// routing and version gating need to read. *router.Router implements it;
// the operator services (AdminService, NodeService, health) reach the
// rest of the core through node.ops.
type core interface {
	// Propose commits env on key's shard through its leader, here or
	// forwarded (router.Router.Propose); Read reads key's shard
	// linearizably.
	Propose(ctx context.Context, key string, env *shardv1.Envelope) (*shardv1.Result, error)
	Read(ctx context.Context, key string, q *shardv1.Query) (*shardv1.QueryResult, error)
	// StaleRead reads key's shard from a local replica without a quorum
	// round, if one runs here.
	StaleRead(key string, q *shardv1.Query) (*shardv1.QueryResult, bool)
	// Forward runs call on the node that leads key's shard, looking
	// again and retrying while it fails over (router/forward.go).
	Forward(ctx context.Context, key string, hops int, call func(ctx context.Context, node *placementv1.Node) error) (asked *router.RemoteLeader, ok bool, err error)
	// Waits, AwaitGrant, CancelWait and EndWait serve a queued Acquire's
	// wait for its grant (router/wait.go).
	Waits() *router.WaitRegistry
	AwaitGrant(ctx context.Context, sub *router.Subscription, resource, requestID string, attempt []byte, seq uint64, deadline, placeDeadline int64) (*shardv1.LeaseInfo, error)
	CancelWait(resource, requestID string, attempt []byte) error
	EndWait(resource, requestID string, attempt []byte) error
	// WatchLock follows a resource's lock events on a replica here
	// (router/watch.go).
	WatchLock(ctx context.Context, resource string, fromShard uint64, from *router.Cursor, emit func(router.WatchItem) error) error
	// Acquires estimates the busiest resources' Acquire rates.
	Acquires() *router.RateTracker
	// Map is the placement map routed by; IsLocal says whether a node
	// runs in this process; Applies whether every replica of a shard
	// applies command version v.
	Map() *placement.Map
	IsLocal(id uint64) bool
	Applies(shardID uint64, v uint32) bool
	// Config is the node's routing configuration; Now its clock.
	Config() *router.Config
	Now() time.Time
}

var _ core = (*router.Router)(nil)

// node is what the API layer's handlers serve with: the routing core,
// and the API layer's own state beside it.
type node struct {
	core
	// ops is the whole routing core, for the operator services.
	ops *router.Router
	// clients are the other nodes' client API, for forwarded calls.
	clients *peerClients
	// auth is the view of the cluster's auth state that calls are
	// authenticated and authorized by, fed by the core.
	auth *authState
}

func newNode(r *router.Router) *node {
	n := &node{core: r, ops: r, clients: newPeerClients(r.Peers()), auth: newAuthState(nil, time.Time{}, r.Config().AuthRequired)}
	r.OnAuth(n.auth.set)
	return n
}

// peer returns the client API of the node listening on addr.
func (n *node) peer(addr string) *peer { return n.clients.get(addr) }
