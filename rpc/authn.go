package rpc

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"

	"github.com/warden-dev/warden/auth"
	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/tlsconfig"
)

// Authentication and authorization (docs/security.md). The HTTP layer
// (guard) authenticates every client call before its body is read: the
// principal is a verified client certificate's (auth.PrincipalOf), or a
// bearer token's, or, on a call another node forwarded over the
// peer-authenticated link, the original caller's (principalHeader). The
// authorizer interceptor, inside the observer so that denials are
// counted and audited, then checks the call's permission on its resource
// or key before anything is proposed; Batch and RenewBatch check each op
// and deny it alone.
//
// Every node decides by the auth state of the placement group, which it
// reads with the map (linearizably, every MapInterval). With
// authentication on, a node whose last good read began more than
// authMaxStale ago answers Unavailable instead of deciding by a view
// that may miss a revocation: so a revoked token or binding stops
// working on every node within authMaxStale plus one read.

// requirement is the permission a client call needs, on what (a
// resource or quota key); alt, if set, allows it too. Batch and
// RenewBatch need none as a whole: each op is checked. A message no case
// names needs admin: a new RPC is closed until it is listed here.
func requirement(msg any) (perm, alt auth.Permission, resource string, whole bool) {
	type keyed interface{ GetKey() string }
	switch m := msg.(type) {
	case *wardenv1.AcquireRequest:
		return auth.Lock, "", m.GetResource(), true
	case *wardenv1.RenewRequest:
		return auth.Lock, "", m.GetResource(), true
	case *wardenv1.ReleaseRequest:
		return auth.Lock, "", m.GetResource(), true
	case *wardenv1.DescribeRequest:
		return auth.Lock, auth.Read, m.GetResource(), true
	case *wardenv1.WatchRequest:
		return auth.Lock, auth.Read, m.GetResource(), true
	case *wardenv1.BatchRequest, *wardenv1.RenewBatchRequest:
		return "", "", "", false
	case *wardenv1.ReserveRequest, *wardenv1.CommitRequest, *wardenv1.QuotaServiceReleaseRequest:
		return auth.QuotaUse, "", m.(keyed).GetKey(), true
	case *wardenv1.QueryRequest:
		return auth.QuotaUse, auth.Read, m.GetKey(), true
	case *wardenv1.ListReservationsRequest, *wardenv1.ListLedgerRequest:
		return auth.Read, auth.QuotaAdmin, m.(keyed).GetKey(), true
	case *wardenv1.SetLimitRequest, *wardenv1.ReportUsageRequest:
		return auth.QuotaAdmin, "", m.(keyed).GetKey(), true
	case *wardenv1.UnfreezeRequest:
		return auth.QuotaAdmin, "", m.GetPool(), true
	case *wardenv1.ListNodesRequest, *wardenv1.ListShardsRequest, *wardenv1.HotResourcesRequest:
		return auth.Read, auth.Admin, "", true
	}
	return auth.Admin, "", "", true
}

// authorizer is the interceptor that checks each client call's
// permission (requirement) before its handler runs.
type authorizer struct{ r *node }

var _ connect.Interceptor = authorizer{}

func (a authorizer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if perm, alt, resource, whole := requirement(req.Any()); whole {
			if err := authorize(ctx, a.r, perm, alt, resource); err != nil {
				return nil, err
			}
		}
		return next(ctx, req)
	}
}

func (authorizer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler checks a streaming call's permission
// (requirement) on its request as the handler receives it: Watch needs
// lock or read on its resource; AdminService.Backup, whose stream holds
// every lease id, admin. Nothing is sent before the check.
func (a authorizer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return next(ctx, &authorizedConn{StreamingHandlerConn: conn, ctx: ctx, r: a.r})
	}
}

// authorizedConn is a server-streaming call's connection that authorizes
// the call on its one request when it is received, and refuses to send
// before that.
type authorizedConn struct {
	connect.StreamingHandlerConn
	ctx     context.Context
	r       *node
	checked error // nil until Receive checked; then errChecked or the refusal
}

// errChecked marks an authorized stream.
var errChecked = errors.New("authorized")

func (c *authorizedConn) Receive(m any) error {
	if err := c.StreamingHandlerConn.Receive(m); err != nil {
		return err
	}
	if c.checked == nil {
		perm, alt, resource, _ := requirement(m)
		c.checked = errChecked
		if err := authorize(c.ctx, c.r, perm, alt, resource); err != nil {
			c.checked = err
		}
	}
	if c.checked != errChecked {
		return c.checked
	}
	return nil
}

func (c *authorizedConn) Send(m any) error {
	if c.checked != errChecked {
		return connect.NewError(connect.CodePermissionDenied, errors.New("a stream sends nothing before its request is authorized"))
	}
	return c.StreamingHandlerConn.Send(m)
}

// authorize returns nil if the call ctx serves may use perm on resource
// (alt, if set, is a permission that allows it too), else a
// PermissionDenied error naming the permission and the resource.
func authorize(ctx context.Context, r *node, perm, alt auth.Permission, resource string) error {
	if ctx.Value(clusterCallKey{}) != nil {
		return nil
	}
	pol, err := r.auth.Policy()
	if err != nil {
		return err
	}
	return authorizeWith(pol, router.PrincipalOf(ctx), perm, alt, resource)
}

// Refusal returns the error guard answers req with, unread, when req is
// a call of the node API by anyone but a node, or a client's call of a
// client service (or of reflection) whose credentials do not
// authenticate; else nil. It is for a layer in front of NewHandler's
// that reads the body before guard sees the call (server's
// gRPC-Web-text translation), so that it reads none of a refused call.
func (h *Handler) Refusal(req *http.Request) error {
	r := h.n
	switch {
	case fromNode(r.Config(), req):
		return nil
	case strings.HasPrefix(req.URL.Path, nodeServicePrefix):
		return errNodeAPI()
	case !authenticated(req.URL.Path):
		return nil
	}
	_, err := authenticate(r.auth, req)
	return err
}

// nodeServicePrefix is the node API's path prefix.
var nodeServicePrefix = "/" + placementv1connect.NodeServiceName + "/"

// errNodeAPI is what anyone but a node calling the node API is answered
// (a new error each time: a Connect error's metadata is filled in as it
// is written).
func errNodeAPI() error {
	return connect.NewError(connect.CodeUnauthenticated, errors.New("the node API answers only the cluster's nodes"))
}

// authenticate returns the principal of a client's request req (not
// another node's), and an error to answer it with, unread, when it does
// not authenticate: with authentication on, a call without credentials,
// over cleartext, or with a bad token. A token, the call's own
// credential, wins over the connection's certificate (a service holding
// a certificate may act with an operator's token).
func authenticate(a *authState, req *http.Request) (string, error) {
	pol, err := a.Policy()
	if err != nil {
		return "", err
	}
	return authenticateWith(pol, req)
}

// fromNode reports whether req came from another node of the cluster:
// over a connection whose peer certificate the listener verified
// (cfg.PeerTLS), or, on a cluster without TLS, with the cluster secret
// (compared in constant time). With neither configured nothing is.
func fromNode(cfg *router.Config, req *http.Request) bool {
	if cfg.PeerTLS {
		_, ok := tlsconfig.PeerNodeID(req.TLS)
		return ok
	}
	return cfg.ClusterSecret != "" && subtle.ConstantTimeCompare([]byte(req.Header.Get(router.SecretHeader)), []byte(cfg.ClusterSecret)) == 1
}

// guard is the HTTP layer's check of who calls, before any body is read:
// the node API (nodeServicePrefix) answers only other nodes; the headers that
// mean something inside the cluster (forwardedHeader, principalHeader,
// the cluster secret) are stripped from every other caller's request;
// and a client's call to a client service or reflection is
// authenticated by a (see authenticated, authState.authenticate), its
// principal put in the request's context. A node's call carries its original caller's principal,
// or none: then it is the cluster's own call (clusterCallKey).
//
// Under TLS a node must also be one the map knows (known, when set,
// says): a peer certificate for any other id (a node about to join) may
// read the placement state and register itself, nothing else.
func guard(cfg *router.Config, a *authState, known func(id uint64) bool, next http.Handler) http.Handler {
	refuse := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if fromNode(cfg, req) {
			if id, ok := tlsconfig.PeerNodeID(req.TLS); ok && known != nil && !known(id) {
				switch req.URL.Path {
				case nodeServicePrefix + "ReadMeta", nodeServicePrefix + "Clock":
				case nodeServicePrefix + "ProposeMeta":
					req = req.WithContext(context.WithValue(req.Context(), joiningKey{}, id))
				default:
					_ = refuse.Write(w, req, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("node %d is not in the cluster's map: it may only register", id)))
					return
				}
			}
			if p := req.Header.Get(router.PrincipalHeader); p != "" {
				req = req.WithContext(router.WithPrincipal(req.Context(), p))
			} else {
				req = req.WithContext(context.WithValue(req.Context(), clusterCallKey{}, true))
			}
			next.ServeHTTP(w, req)
			return
		}
		if strings.HasPrefix(req.URL.Path, nodeServicePrefix) {
			_ = refuse.Write(w, req, errNodeAPI())
			return
		}
		req.Header.Del(router.ForwardedHeader)
		req.Header.Del(router.SecretHeader)
		req.Header.Del(router.PrincipalHeader)
		if authenticated(req.URL.Path) {
			p, err := authenticate(a, req)
			if err != nil {
				_ = refuse.Write(w, req, err)
				return
			}
			rctx := context.WithValue(req.Context(), credentialKey{}, req)
			if p != "" {
				rctx = router.WithPrincipal(rctx, p)
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

// clusterCallKey marks, in a call's context, a node's call made for no
// client (no principal header): the routing core's own questions to
// another node (router.Remote: a shard's leader, a leader transfer, which
// operators ask). authorize allows it whatever it asks: a node may
// propose anything through the node API already. A client call a node
// forwards carries its caller's principal, and is authorized as theirs:
// with authentication on every client has one. Before, the core's calls
// were authorized as principal "" and refused, so with authentication on
// a node that hosts no replica of a shard could neither learn its leader
// nor hand its leadership on (the attack review).
type clusterCallKey struct{}

// ClientPath reports whether an HTTP request path names a method of the
// client services (warden.v1): those authentication covers, and those
// browser pages of other origins may call (server's CORS layer); not the
// probes, metrics, reflection or the dashboard's files.
func ClientPath(path string) bool {
	return strings.HasPrefix(path, "/warden.v1.")
}
