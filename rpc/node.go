package rpc

import (
	"time"

	"github.com/warden-dev/warden/router"
)

// node is what the API layer's handlers serve with: the node's routing
// core, and the API layer's own state beside it.
type node struct {
	*router.Router
	// clients are the other nodes' client API, for forwarded calls.
	clients *peerClients
	// auth is the view of the cluster's auth state that calls are
	// authenticated and authorized by, fed by r.
	auth *authState
}

func newNode(r *router.Router) *node {
	n := &node{Router: r, clients: newPeerClients(r.Peers()), auth: newAuthState(nil, time.Time{}, r.Config().AuthRequired)}
	r.OnAuth(n.auth.set)
	return n
}

// peer returns the client API of the node listening on addr.
func (n *node) peer(addr string) *peer { return n.clients.get(addr) }
