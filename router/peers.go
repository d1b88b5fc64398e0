package router

import (
	"net/http"
	"sync"
	"time"

	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// peer is another Warden node's Connect API.
type peer struct {
	locks wardenv1connect.LockServiceClient
	admin wardenv1connect.AdminServiceClient
	node  placementv1connect.NodeServiceClient
}

// peers keeps one client per node address, over one HTTP/2 (h2c)
// transport, so forwarded calls share connections.
type peers struct {
	client *http.Client
	mu     sync.Mutex
	byAddr map[string]*peer
}

func newPeers() *peers {
	t := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 5 * time.Minute}
	t.Protocols = new(http.Protocols)
	t.Protocols.SetUnencryptedHTTP2(true)
	return &peers{client: &http.Client{Transport: t}, byAddr: map[string]*peer{}}
}

// get returns the clients of the node listening on addr (host:port).
func (p *peers) get(addr string) *peer {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.byAddr[addr]; c != nil {
		return c
	}
	base := "http://" + addr
	c := &peer{
		locks: wardenv1connect.NewLockServiceClient(p.client, base),
		admin: wardenv1connect.NewAdminServiceClient(p.client, base),
		node:  placementv1connect.NewNodeServiceClient(p.client, base),
	}
	p.byAddr[addr] = c
	return c
}
