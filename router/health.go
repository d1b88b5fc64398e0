package router

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

// Health (DESIGN.md §6): /healthz says the process serves; /readyz and
// grpc.health.v1 say whether every replica this process hosts is ready:
// it has a leader with a quorum and has applied everything that leader
// had committed, within readyTimeout. One linearizable read per replica
// (a ReadIndex round, then the wait for the local apply) asks exactly
// that, so a replica without quorum, without a leader, or catching up
// from far behind is not ready.

// readyTimeout bounds each replica's readiness read.
const readyTimeout = time.Second

// readyCache is how long one readiness answer is reused: probes of
// several kinds (HTTP, gRPC, each service) should not each cost a read
// per replica.
const readyCache = 250 * time.Millisecond

// readiness caches the last answer of Router.Ready.
type readiness struct {
	mu      sync.Mutex
	at      time.Time
	reasons []string
}

// Ready returns why this process is not ready to serve, one reason per
// local replica that is not (none: ready).
func (r *Router) Ready(ctx context.Context) []string {
	r.ready.mu.Lock()
	defer r.ready.mu.Unlock()
	if time.Since(r.ready.at) < readyCache {
		return r.ready.reasons
	}
	var (
		mu      sync.Mutex
		reasons []string
		wg      sync.WaitGroup
	)
	add := func(reason string) {
		mu.Lock()
		reasons = append(reasons, reason)
		mu.Unlock()
	}
	check := func(what string, read func(context.Context) error) {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, readyTimeout)
			defer cancel()
			if err := read(rctx); err != nil {
				add(fmt.Sprintf("%s: no leader with a quorum, or not caught up within %v: %v", what, readyTimeout, err))
			}
		})
	}
	m := r.Map()
	for i := range r.nodes {
		n := &r.nodes[i]
		if n.Node != nil {
			if err := n.Node.WritesRefused(); err != nil {
				add(err.Error())
			}
		}
		if _, _, _, err := n.raft.leaderOf(placement.MetaShardID); err == nil && n.Node != nil {
			check(fmt.Sprintf("node %d's placement replica", n.id), func(ctx context.Context) error {
				_, err := n.Node.Meta().Read(ctx)
				return err
			})
		}
		for _, id := range m.DataShards() {
			if !slices.ContainsFunc(m.Shard(id).GetReplicas(), func(rep *placementv1.Replica) bool { return rep.GetNodeId() == n.id }) {
				continue // the map places no replica of it here
			}
			if n.Node != nil {
				if err := n.Node.ReplicaFailed(id); err != nil {
					add(err.Error())
					continue
				}
			}
			check(fmt.Sprintf("node %d's replica of shard %d", n.id, id), func(ctx context.Context) error {
				_, err := n.raft.read(ctx, id, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}})
				return err
			})
		}
	}
	wg.Wait()
	slices.Sort(reasons)
	r.ready.at, r.ready.reasons = time.Now(), reasons
	return reasons
}

// replicaFailed reports whether node, if it runs in this process, left
// its replica of shardID stopped (placement.Node.ReplicaFailed).
func (r *Router) replicaFailed(node, shardID uint64) bool {
	for i := range r.nodes {
		if n := &r.nodes[i]; n.id == node && n.Node != nil {
			return n.Node.ReplicaFailed(shardID) != nil
		}
	}
	return false
}

// healthz answers that the process serves.
func healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "serving"})
}

// readyz answers 200 when Ready has no reason, else 503 with them.
func (r *Router) readyz(w http.ResponseWriter, req *http.Request) {
	if reasons := r.Ready(req.Context()); len(reasons) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "reasons": reasons})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready"})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// healthChecker is grpc.health.v1 over Ready: every Warden service, and
// the server as a whole (""), is SERVING while the process is ready.
type healthChecker struct {
	r        *Router
	services []string
}

func (h healthChecker) Check(ctx context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	if req.Service != "" && !slices.Contains(h.services, req.Service) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("unknown service %s", logQuote(req.Service)))
	}
	if len(h.r.Ready(ctx)) > 0 {
		return &grpchealth.CheckResponse{Status: grpchealth.StatusNotServing}, nil
	}
	return &grpchealth.CheckResponse{Status: grpchealth.StatusServing}, nil
}
