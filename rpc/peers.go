package rpc

import (
	"context"
	"sync"

	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// peer is another node's client API, to which this node forwards client
// calls.
type peer struct {
	Locks wardenv1connect.LockServiceClient
	Quota wardenv1connect.QuotaServiceClient
	Admin wardenv1connect.AdminServiceClient
}

// peerClients keeps one peer per node address, over the routing core's
// peer transport (router.Peers.Conn), so forwarded calls share its
// connections.
type peerClients struct {
	peers  *router.Peers
	mu     sync.Mutex
	byAddr map[string]*peer
}

func newPeerClients(p *router.Peers) *peerClients {
	return &peerClients{peers: p, byAddr: map[string]*peer{}}
}

// get returns the clients of the node listening on addr (host:port).
func (c *peerClients) get(addr string) *peer {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.byAddr[addr]; p != nil {
		return p
	}
	client, base, opt := c.peers.Conn(addr)
	p := &peer{
		Locks: wardenv1connect.NewLockServiceClient(client, base, opt),
		Quota: wardenv1connect.NewQuotaServiceClient(client, base, opt),
		Admin: wardenv1connect.NewAdminServiceClient(client, base, opt),
	}
	c.byAddr[addr] = p
	return p
}

// NewRemote returns the routing core's questions to other nodes
// (router.Remote), asked over their admin API through p: the composition
// root passes it in router.Config.Remote.
func NewRemote(p *router.Peers) router.Remote { return remote{newPeerClients(p)} }

type remote struct{ clients *peerClients }

func (m remote) LeaderOf(ctx context.Context, addr string, shardID uint64) (uint64, error) {
	resp, err := m.clients.get(addr).Admin.ListShards(ctx, router.ForwardedReq(&wardenv1.ListShardsRequest{}))
	if err != nil {
		return 0, err
	}
	for _, s := range resp.Msg.GetShards() {
		if s.GetId() == shardID {
			return s.GetLeaderNodeId(), nil
		}
	}
	return 0, nil
}

func (m remote) TransferLeader(ctx context.Context, addr string, shardID, node uint64) (uint64, error) {
	resp, err := m.clients.get(addr).Admin.TransferLeader(ctx, router.ForwardedReq(&wardenv1.TransferLeaderRequest{ShardId: shardID, NodeId: node}))
	if err != nil {
		return 0, err
	}
	return resp.Msg.GetLeaderNodeId(), nil
}
