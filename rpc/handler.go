package rpc

import (
	"context"
	"net/http"
	"slices"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/warden-dev/warden/auth"
	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/ui"
)

// NewHandler serves a node's HTTP surface: the Connect services (Connect,
// gRPC and gRPC-Web protocols), grpc.health.v1, server reflection,
// Prometheus's /metrics and the web dashboard at /ui/. Extra handler
// options (interceptors) apply to the Warden services, outside the
// observer that counts, audits and maps the errors of the client
// services.
func NewHandler(core *router.Router, opts ...connect.HandlerOption) *Handler {
	r := newNode(core)
	opts = append([]connect.HandlerOption{
		// Compressing Warden's small messages costs more CPU than their
		// bytes cost a datacenter network: at 1 KiB, gzipping Batch
		// answers of 1 to 3 KiB took 4.5 % of a leader's CPU under the
		// reference load. Only large answers (listings, ledger pages,
		// the largest batches) are compressed.
		connect.WithCompressMinBytes(64 << 10),
		// Every valid request is far smaller; refuse the rest unread.
		connect.WithReadMaxBytes(MaxRequestBytes),
		connect.WithCodec(jsonCodec{"json"}),
		connect.WithCodec(jsonCodec{"json; charset=utf-8"}),
	}, opts...)
	mux := http.NewServeMux()
	// The client services' chain: the callers' interceptors, then the
	// observer (interceptors.go), so that they see the Connect errors
	// clients get, then the authorizer (authn.go), then the routing
	// interceptor (route.go), innermost, so that a call is authorized
	// here before it is forwarded.
	client := append(slices.Clone(opts), connect.WithInterceptors(observer{r}, authorizer{r}, routing{r}))
	mux.Handle(wardenv1connect.NewLockServiceHandler(newLockServer(r), client...))
	mux.Handle(wardenv1connect.NewQuotaServiceHandler(newQuotaServer(r), client...))
	mux.Handle(wardenv1connect.NewAdminServiceHandler(newAdminServer(r), client...))
	mux.Handle(wardenv1connect.NewAuthServiceHandler(&AuthServer{r}, client...))
	// Nodes forward whole pages of records when a range moves. The node
	// API is served only where the nodes authenticate each other (guard);
	// a dev cluster's nodes share one process and need none.
	nodePath, nodeAPI := placementv1connect.NewNodeServiceHandler(&NodeServer{r}, append(opts, connect.WithReadMaxBytes(maxNodeRequestBytes))...)
	if r.Config().PeerTLS || r.Config().ClusterSecret != "" {
		mux.Handle(nodePath, nodeAPI)
	}
	services := []string{wardenv1connect.LockServiceName, wardenv1connect.QuotaServiceName, wardenv1connect.AdminServiceName, wardenv1connect.AuthServiceName}
	mux.Handle(grpchealth.NewHandler(healthChecker{r, services}))
	mux.HandleFunc("/healthz", healthz)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, req *http.Request) { readyz(r, w, req) })
	reflector := grpcreflect.NewStaticReflector(services...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
	mux.Handle("/metrics", metricsHandler(r))
	// The dashboard's static page; it calls the services above like any
	// client, with the user's token.
	mux.Handle(ui.Prefix, ui.Handler())
	// A node that has just registered may call before this node's next
	// map read: read it once more before refusing. Only holders of a peer
	// certificate get here.
	known := func(id uint64) bool {
		if r.Map().Node(id) != nil {
			return true
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return r.ops.RefreshMap(ctx) == nil && r.Map().Node(id) != nil
	}
	return &Handler{Handler: guard(r.Config(), r.auth, known, mux), n: r}
}

// Handler is a node's HTTP surface (NewHandler).
type Handler struct {
	http.Handler
	n *node
}

// MaxRequestBytes bounds a client's request message, in bytes (a larger
// one is refused unread), and maxNodeRequestBytes a node's (NodeService).
const (
	MaxRequestBytes     = 64 << 10
	maxNodeRequestBytes = 16 << 20
)

// tenantLabels are the metric labels whose values name tenants (a quota
// pool is a key's root segment).
var tenantLabels = []string{"pool"}

// metricsHandler serves /metrics. With authentication off, to anyone.
// With it on, a caller whose credentials (a bearer token or a client
// certificate) name a principal allowed read on every key gets every
// series; any other gets none with a label that names tenants
// (tenantLabels), or, with Config.MetricsAuth, unauthenticated or
// permission_denied. So an anonymous scrape of a node with
// authentication on shows no tenant's name.
func metricsHandler(r *node) http.Handler {
	full := promhttp.Handler()
	redacted := promhttp.HandlerFor(prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := prometheus.DefaultGatherer.Gather()
		out := mfs[:0]
		for _, mf := range mfs {
			mf.Metric = slices.DeleteFunc(mf.Metric, func(m *dto.Metric) bool {
				return slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return slices.Contains(tenantLabels, l.GetName()) })
			})
			if len(mf.Metric) > 0 {
				out = append(out, mf)
			}
		}
		return out, err
	}), promhttp.HandlerOpts{})
	refuse := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		pol, err := r.auth.Policy()
		if err == nil && !pol.Enabled() {
			full.ServeHTTP(w, req)
			return
		}
		var principal string
		if err == nil {
			principal, err = authenticateWith(pol, req)
		}
		if err == nil {
			if err = authorizeWith(pol, principal, auth.Read, "", ""); err == nil {
				full.ServeHTTP(w, req)
				return
			}
		}
		if r.Config().MetricsAuth {
			_ = refuse.Write(w, req, err)
			return
		}
		redacted.ServeHTTP(w, req)
	})
}
