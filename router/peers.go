package router

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
)

// Peer is another Warden node's node API.
type Peer struct {
	Node placementv1connect.NodeServiceClient
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
	byAddr map[string]*Peer
}

// SecretHeader carries the cluster secret on node-to-node calls of a
// cluster without TLS.
const SecretHeader = "Warden-Cluster-Secret"

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
	return &Peers{client: &http.Client{Transport: t}, scheme: scheme, secret: secret, byAddr: map[string]*Peer{}}
}

// NewPeersOver returns clients of the other nodes whose calls go to rt
// with secret, over cleartext: routertest's in-memory transport.
func NewPeersOver(rt http.RoundTripper, secret string) *Peers {
	return &Peers{client: &http.Client{Transport: rt}, scheme: "http://", secret: secret, byAddr: map[string]*Peer{}}
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
		h.Set(SecretHeader, n.secret)
	}
	if p := PrincipalOf(ctx); p != "" {
		h.Set(PrincipalHeader, p)
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

// Get returns the clients of the node listening on addr (host:port).
func (p *Peers) Get(addr string) *Peer {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.byAddr[addr]; c != nil {
		return c
	}
	c := &Peer{Node: placementv1connect.NewNodeServiceClient(p.Conn(addr))}
	p.byAddr[addr] = c
	return c
}

// Conn returns what a client of any service of the node at addr is made
// of (connect's NewXClient arguments): the peer transport, the node's
// base URL, and the option that makes each call a node's. The secret
// goes with forwarded client calls too: it is what tells the other node
// that their forwarding header is a node's.
func (p *Peers) Conn(addr string) (connect.HTTPClient, string, connect.ClientOption) {
	return p.client, p.scheme + addr, nodeCall(p.secret)
}

// ProbeStart asks the node at addr for the placement state: it returns
// the state of a node that serves, or the StartingHeader of one still
// starting (NewStartingHandler), or the error of one that answers
// neither (unreachable, or a binary without the header).
func (p *Peers) ProbeStart(ctx context.Context, addr string) (*placementv1.State, string, error) {
	resp, err := p.Get(addr).Node.ReadMeta(ctx, connect.NewRequest(&placementv1.ReadMetaRequest{}))
	if err == nil {
		return resp.Msg.GetState(), "", nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		if s := ce.Meta().Get(StartingHeader); s != "" {
			return nil, s, nil
		}
	}
	return nil, "", err
}

// StartingHeader is the header with which a node whose cluster has not
// started yet (NewStartingHandler) answers another node's ReadMeta: how
// it starts (server.StartMode's name, and a restore's id after a space),
// for the identity check of a node that may not start Raft before the
// cluster confirms it.
const StartingHeader = "Warden-Starting"

// Placement returns the placement client that asks the nodes at seeds
// and then, if known is set, at the addresses it lists (the map's), over
// NodeService: the placement.MetaClient of a node that hosts no replica
// of the placement group.
func (p *Peers) Placement(seeds []string, known func() []string) placement.MetaClient {
	return remoteMeta{peers: p, seeds: seeds, known: known}
}

// remoteMeta is the placement.MetaClient of a node that hosts no replica
// of the placement group: it asks the nodes it knows (seeds, then the
// map's) over NodeService.
type remoteMeta struct {
	peers *Peers
	seeds []string
	known func() []string
}

func (m remoteMeta) addrs() []string {
	out := append([]string(nil), m.seeds...)
	if m.known != nil {
		out = append(out, m.known()...)
	}
	return out
}

func (m remoteMeta) Propose(ctx context.Context, cmd *placementv1.Command) (*placementv1.Result, error) {
	var errs []error
	for _, a := range m.addrs() {
		resp, err := m.peers.Get(a).Node.ProposeMeta(ctx, connect.NewRequest(&placementv1.ProposeMetaRequest{Command: cmd}))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if res := resp.Msg.GetResult(); res.GetError() != "" {
			return res, &placement.RefusedError{Reason: res.GetError()}
		}
		return resp.Msg.GetResult(), nil
	}
	return nil, fmt.Errorf("placement: no node answered: %w", errors.Join(errs...))
}

func (m remoteMeta) Read(ctx context.Context) (*placementv1.State, error) {
	var errs []error
	for _, a := range m.addrs() {
		resp, err := m.peers.Get(a).Node.ReadMeta(ctx, connect.NewRequest(&placementv1.ReadMetaRequest{}))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return resp.Msg.GetState(), nil
	}
	return nil, fmt.Errorf("placement: no node answered: %w", errors.Join(errs...))
}
