package routertest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/shard"
)

// Cluster is one router per node over a Group, as each process has its
// own. Node N listens at Addr(N); calls to it go in memory, to its
// router's node API (Propose and Read, served from its own replica)
// until Serve gives it another HTTP surface. The nodes share the cluster
// secret Secret.
type Cluster struct {
	// Routers are the nodes' routers, by node id.
	Routers map[uint64]*router.Router

	mu       sync.Mutex
	handlers map[uint64]http.Handler
}

// Secret is a Cluster's cluster secret (router.Config.ClusterSecret),
// which its nodes send on node-to-node calls.
const Secret = "routertest"

// Addr is node id's listen address in a Cluster's placement map (no
// network: Cluster routes it in memory).
func Addr(id uint64) string { return fmt.Sprintf("node-%d.invalid:1", id) }

// NewCluster returns a router for each of g's replicas, with a
// placement map in which g's shard owns every key and replica i runs on
// node i. Each node's Leadership and wait registry listen to g; the
// routers count every term's clock as confirmed
// (router.TestingKnobs.OneClock: they share one).
func NewCluster(g *Group) *Cluster {
	st := &placementv1.State{
		Generation: 1,
		Ranges:     []*shardv1.RangeDescriptor{{ShardId: g.shardID, Generation: 1}},
		Shards:     []*placementv1.Shard{{Id: g.shardID, Epoch: 1}},
	}
	for id := uint64(1); id <= uint64(g.replicas); id++ {
		st.Nodes = append(st.Nodes, &placementv1.Node{Id: id, ListenAddr: Addr(id), CommandVersion: shard.CommandVersion})
		st.Shards[0].Replicas = append(st.Shards[0].Replicas, &placementv1.Replica{ReplicaId: id, NodeId: id})
	}
	c := &Cluster{Routers: map[uint64]*router.Router{}, handlers: map[uint64]http.Handler{}}
	peers := router.NewPeersOver(c, Secret)
	for id := uint64(1); id <= uint64(g.replicas); id++ {
		l, waits := router.NewLeadership(0), router.NewWaitRegistry()
		g.Listen(id, l, waits.Observe)
		cfg := router.Config{Logger: slog.New(slog.DiscardHandler), ClusterSecret: Secret, Knobs: router.TestingKnobs{OneClock: true}}
		c.Routers[id] = router.New([]router.LocalNode{{Leadership: l, ID: id, Raft: g.Host(id)}}, Meta{State: st}, placement.NewMap(st),
			waits, cfg, peers)
		_, c.handlers[id] = placementv1connect.NewNodeServiceHandler(nodeAPI{r: c.Routers[id]})
	}
	return c
}

// Serve makes h node id's HTTP surface (an API layer over its router):
// every call to Addr(id) goes to h from then on.
func (c *Cluster) Serve(id uint64, h http.Handler) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handlers[id] = h
}

// Client returns an HTTP client that reaches every node of c in memory.
func (c *Cluster) Client() *http.Client { return &http.Client{Transport: c} }

// RoundTrip serves a call to Addr(N) with node N's HTTP surface.
func (c *Cluster) RoundTrip(req *http.Request) (*http.Response, error) {
	var id uint64
	if _, err := fmt.Sscanf(req.URL.Host, "node-%d.invalid:1", &id); err != nil || c.Routers[id] == nil {
		return nil, fmt.Errorf("routertest: no node at %s", req.URL.Host)
	}
	c.mu.Lock()
	h := c.handlers[id]
	c.mu.Unlock()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w.Result(), nil
}

// nodeAPI is the node API's Propose and Read, served by one node's
// router from its own replica (rpc.NodeServer goes one hop further).
type nodeAPI struct {
	placementv1connect.UnimplementedNodeServiceHandler
	r *router.Router
}

func (s nodeAPI) Propose(ctx context.Context, req *connect.Request[placementv1.ProposeRequest]) (*connect.Response[placementv1.ProposeResponse], error) {
	res, err := s.r.ProposeShard(ctx, req.Msg.GetShardId(), req.Msg.GetEnvelope())
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return connect.NewResponse(&placementv1.ProposeResponse{Result: res}), nil
}

func (s nodeAPI) Read(ctx context.Context, req *connect.Request[placementv1.ReadRequest]) (*connect.Response[placementv1.ReadResponse], error) {
	out, err := s.r.ReadShard(ctx, req.Msg.GetShardId(), req.Msg.GetQuery())
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return connect.NewResponse(&placementv1.ReadResponse{Result: out}), nil
}

// Meta is a placement group that serves a fixed State and refuses
// commands.
type Meta struct{ State *placementv1.State }

var _ placement.MetaClient = Meta{}

// Propose refuses every command.
func (Meta) Propose(context.Context, *placementv1.Command) (*placementv1.Result, error) {
	return nil, &placement.RefusedError{Reason: "routertest: the placement map is fixed"}
}

// Read returns the fixed state.
func (m Meta) Read(context.Context) (*placementv1.State, error) { return m.State, nil }
