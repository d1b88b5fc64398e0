package rpc

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"github.com/warden-dev/warden/router"
)

// Health (DESIGN.md §6): /healthz says the process serves; /readyz and
// grpc.health.v1 say whether every replica this process hosts is ready:
// it has a leader with a quorum and has applied everything that leader
// had committed, within readyTimeout. One linearizable read per replica
// (a ReadIndex round, then the wait for the local apply) asks exactly
// that, so a replica without quorum, without a leader, or catching up
// from far behind is not ready.

// healthz answers that the process serves.
func healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "serving"})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// healthChecker is grpc.health.v1 over Ready: every Warden service, and
// the server as a whole (""), is SERVING while the process is ready.
type healthChecker struct {
	r        *node
	services []string
}

func (h healthChecker) Check(ctx context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	if req.Service != "" && !slices.Contains(h.services, req.Service) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("unknown service %s", router.LogQuote(req.Service)))
	}
	if len(h.r.ops.Ready(ctx)) > 0 {
		return &grpchealth.CheckResponse{Status: grpchealth.StatusNotServing}, nil
	}
	return &grpchealth.CheckResponse{Status: grpchealth.StatusServing}, nil
}

// readyz answers 200 when Ready has no reason, else 503 with them.
func readyz(r *node, w http.ResponseWriter, req *http.Request) {
	if reasons := r.ops.Ready(req.Context()); len(reasons) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "reasons": reasons})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready"})
}
