package router

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"

	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/tlsconfig"
)

// peer is another Warden node's Connect API.
type peer struct {
	locks wardenv1connect.LockServiceClient
	quota wardenv1connect.QuotaServiceClient
	admin wardenv1connect.AdminServiceClient
	node  placementv1connect.NodeServiceClient
}

// Peers keeps one client per node address, over one HTTP/2 transport
// (over mutual TLS with the peer certificates, or cleartext h2c with the
// cluster secret), so forwarded calls share connections. The composition
// root (package server) makes it, and may use it before the router
// exists (to ask the other nodes about a node before it starts, and to
// reach the placement group of a joining node).
type Peers struct {
	client *http.Client
	scheme string
	secret string
	mu     sync.Mutex
	byAddr map[string]*peer
}

// secretHeader carries the cluster secret on node-to-node calls of a
// cluster without TLS.
const secretHeader = "Warden-Cluster-Secret"

// A connection to another node that went silent (a partition drops its
// packets: nothing closes it, and TCP retransmits with a backoff that
// grows through the cut) is closed once a ping sent after peerPingAfter
// without a frame gets no answer within peerPingTimeout, or a write
// makes no progress for as long; and a dial gives up after
// peerDialTimeout, not at the caller's deadline. Calls after a heal then
// go over a new connection at once. Before, they queued on the silent
// one until its next retransmission: after the nemesis suite's silent
// bridge partition (8 s) every node served again 5.1-6.7 s after the
// heal (an outside run once saw 17 s); now 0.4-0.9 s.
const (
	peerPingAfter   = time.Second
	peerPingTimeout = 2 * time.Second
	peerDialTimeout = 2 * time.Second
)

// NewPeers returns the clients of the other nodes. With tlsConfig (the
// node's peer TLS config, tlsconfig.Store.PeerClientConfig) they call
// over TLS and authenticate by the peer certificate; without it over
// cleartext HTTP/2, and secret (if set) goes with every call.
func NewPeers(secret string, tlsConfig *tls.Config) *Peers {
	t := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 5 * time.Minute, TLSClientConfig: tlsConfig,
		DialContext: (&net.Dialer{Timeout: peerDialTimeout}).DialContext,
		HTTP2:       &http.HTTP2Config{SendPingTimeout: peerPingAfter, PingTimeout: peerPingTimeout, WriteByteTimeout: peerPingTimeout}}
	t.Protocols = new(http.Protocols)
	scheme := "http://"
	if tlsConfig != nil {
		scheme = "https://"
		t.Protocols.SetHTTP2(true)
	} else {
		t.Protocols.SetUnencryptedHTTP2(true)
	}
	return &Peers{client: &http.Client{Transport: t}, scheme: scheme, secret: secret, byAddr: map[string]*peer{}}
}

// nodeCall adds to outgoing calls the cluster secret and the principal
// of the client call being served (ctx's), which the other node honours
// because the call comes from a node.
func nodeCall(secret string) connect.Option {
	return connect.WithInterceptors(nodeCaller{secret})
}

// nodeCaller is nodeCall's interceptor, for unary and streaming calls.
type nodeCaller struct{ secret string }

func (n nodeCaller) headers(ctx context.Context, h http.Header) {
	if n.secret != "" {
		h.Set(secretHeader, n.secret)
	}
	if p := principalOf(ctx); p != "" {
		h.Set(principalHeader, p)
	}
}

func (n nodeCaller) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		n.headers(ctx, req.Header())
		return next(ctx, req)
	}
}

func (n nodeCaller) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		n.headers(ctx, conn.RequestHeader())
		return conn
	}
}

func (nodeCaller) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// fromNode reports whether req came from another node of the cluster:
// over a connection whose peer certificate the listener verified
// (cfg.PeerTLS), or, on a cluster without TLS, with the cluster secret
// (compared in constant time). With neither configured nothing is.
func fromNode(cfg *Config, req *http.Request) bool {
	if cfg.PeerTLS {
		_, ok := tlsconfig.PeerNodeID(req.TLS)
		return ok
	}
	return cfg.ClusterSecret != "" && subtle.ConstantTimeCompare([]byte(req.Header.Get(secretHeader)), []byte(cfg.ClusterSecret)) == 1
}

// guard is the HTTP layer's check of who calls, before any body is read:
// the node API (nodePrefix) answers only other nodes; the headers that
// mean something inside the cluster (forwardedHeader, principalHeader,
// the cluster secret) are stripped from every other caller's request;
// and a client's call to a client service or reflection is
// authenticated by a (see authenticated, authState.authenticate), its
// principal put in the request's context. A node's call carries its original caller's principal.
//
// Under TLS a node must also be one the map knows (known, when set,
// says): a peer certificate for any other id (a node about to join) may
// read the placement state and register itself, nothing else.
func guard(cfg *Config, a *authState, known func(id uint64) bool, nodePrefix string, next http.Handler) http.Handler {
	refuse := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if fromNode(cfg, req) {
			if id, ok := tlsconfig.PeerNodeID(req.TLS); ok && known != nil && !known(id) {
				switch req.URL.Path {
				case nodePrefix + "ReadMeta", nodePrefix + "Clock":
				case nodePrefix + "ProposeMeta":
					req = req.WithContext(context.WithValue(req.Context(), joiningKey{}, id))
				default:
					_ = refuse.Write(w, req, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("node %d is not in the cluster's map: it may only register", id)))
					return
				}
			}
			if p := req.Header.Get(principalHeader); p != "" {
				req = req.WithContext(context.WithValue(req.Context(), principalKey{}, p))
			}
			next.ServeHTTP(w, req)
			return
		}
		if strings.HasPrefix(req.URL.Path, nodePrefix) {
			_ = refuse.Write(w, req, connect.NewError(connect.CodeUnauthenticated, errors.New("the node API answers only the cluster's nodes")))
			return
		}
		req.Header.Del(forwardedHeader)
		req.Header.Del(secretHeader)
		req.Header.Del(principalHeader)
		if authenticated(req.URL.Path) {
			p, err := a.authenticate(req)
			if err != nil {
				_ = refuse.Write(w, req, err)
				return
			}
			rctx := context.WithValue(req.Context(), credentialKey{}, req)
			if p != "" {
				rctx = context.WithValue(rctx, principalKey{}, p)
			}
			req = req.WithContext(rctx)
		}
		next.ServeHTTP(w, req)
	})
}

// authenticated reports whether guard authenticates a client's call of
// an HTTP request path: the client services (ClientPath), and gRPC
// server reflection, which lists them and AuthService: with
// authentication on, reflection answers any principal, nobody else.
func authenticated(path string) bool {
	return ClientPath(path) || strings.HasPrefix(path, "/"+grpcreflect.ReflectV1ServiceName+"/") ||
		strings.HasPrefix(path, "/"+grpcreflect.ReflectV1AlphaServiceName+"/")
}

// joiningKey marks, in a call's context, the id of a node the map does
// not know yet (see guard).
type joiningKey struct{}

// get returns the clients of the node listening on addr (host:port).
func (p *Peers) get(addr string) *peer {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.byAddr[addr]; c != nil {
		return c
	}
	base := p.scheme + addr
	// The secret goes with forwarded client calls too: it is what tells
	// the other node that their forwarding header is a node's.
	auth := nodeCall(p.secret)
	c := &peer{
		locks: wardenv1connect.NewLockServiceClient(p.client, base, auth),
		quota: wardenv1connect.NewQuotaServiceClient(p.client, base, auth),
		admin: wardenv1connect.NewAdminServiceClient(p.client, base, auth),
		node:  placementv1connect.NewNodeServiceClient(p.client, base, auth),
	}
	p.byAddr[addr] = c
	return c
}
