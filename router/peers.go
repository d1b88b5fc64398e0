package router

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// peer is another Warden node's Connect API.
type peer struct {
	locks wardenv1connect.LockServiceClient
	quota wardenv1connect.QuotaServiceClient
	admin wardenv1connect.AdminServiceClient
	node  placementv1connect.NodeServiceClient
}

// Peers keeps one client per node address, over one HTTP/2 (h2c)
// transport, so forwarded calls share connections. The composition root
// (package server) makes it, and may use it before the router exists
// (to ask the other nodes about a node before it starts, and to reach
// the placement group of a joining node).
type Peers struct {
	client *http.Client
	secret string
	mu     sync.Mutex
	byAddr map[string]*peer
}

// secretHeader carries the cluster secret on node-to-node calls.
const secretHeader = "Warden-Cluster-Secret"

// NewPeers returns the clients of the other nodes; secret (if set) goes
// with every NodeService call.
func NewPeers(secret string) *Peers {
	t := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 5 * time.Minute}
	t.Protocols = new(http.Protocols)
	t.Protocols.SetUnencryptedHTTP2(true)
	return &Peers{client: &http.Client{Transport: t}, secret: secret, byAddr: map[string]*peer{}}
}

// withSecret adds the cluster secret to outgoing calls.
func withSecret(secret string) connect.Option {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if secret != "" {
				req.Header().Set(secretHeader, secret)
			}
			return next(ctx, req)
		}
	}))
}

// requireSecret refuses incoming calls without the cluster secret (when
// one is set), in constant time.
func requireSecret(secret string) connect.HandlerOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if secret != "" && subtle.ConstantTimeCompare([]byte(req.Header().Get(secretHeader)), []byte(secret)) != 1 {
				return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("the node API needs the cluster secret"))
			}
			return next(ctx, req)
		}
	}))
}

// get returns the clients of the node listening on addr (host:port).
func (p *Peers) get(addr string) *peer {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.byAddr[addr]; c != nil {
		return c
	}
	base := "http://" + addr
	c := &peer{
		locks: wardenv1connect.NewLockServiceClient(p.client, base),
		quota: wardenv1connect.NewQuotaServiceClient(p.client, base),
		admin: wardenv1connect.NewAdminServiceClient(p.client, base),
		node:  placementv1connect.NewNodeServiceClient(p.client, base, withSecret(p.secret)),
	}
	p.byAddr[addr] = c
	return c
}
