package router

import (
	"context"
	"slices"
	"time"

	"connectrpc.com/connect"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/shard"
)

// AdminServer implements wardenv1connect.AdminServiceHandler on a Router.
type AdminServer struct {
	r *Router
}

var _ wardenv1connect.AdminServiceHandler = (*AdminServer)(nil)

// NewAdminServer returns the AdminService handler of r.
func NewAdminServer(r *Router) *AdminServer { return &AdminServer{r: r} }

// Bounds of HotResources' limit.
const (
	defaultHotLimit = 10
	maxHotLimit     = 100
)

// HotResources implements AdminService.HotResources.
func (s *AdminServer) HotResources(ctx context.Context, req *connect.Request[wardenv1.HotResourcesRequest]) (*connect.Response[wardenv1.HotResourcesResponse], error) {
	start := time.Now()
	resp, err := s.hotResources(ctx, req.Msg)
	return resp, observe("HotResources", start, err)
}

func (s *AdminServer) hotResources(ctx context.Context, m *wardenv1.HotResourcesRequest) (*connect.Response[wardenv1.HotResourcesResponse], error) {
	limit := int(m.GetLimit())
	switch {
	case limit == 0:
		limit = defaultHotLimit
	case limit > maxHotLimit:
		return nil, &shard.FieldError{Field: "limit", Reason: "must be at most 100"}
	}
	out := &wardenv1.HotResourcesResponse{}
	var locks []*shardv1.LockRecord
	for _, id := range s.r.shardIDs() {
		q, err := s.r.readShard(ctx, id, &shardv1.Query{Query: &shardv1.Query_Hot{Hot: &shardv1.HotQuery{Limit: uint32(limit)}}})
		if err != nil {
			return nil, err
		}
		locks = append(locks, q.GetHot()...)
	}
	slices.SortStableFunc(locks, func(a, b *shardv1.LockRecord) int { return int(b.GetWaiters()) - int(a.GetWaiters()) })
	for _, l := range locks[:min(limit, len(locks))] {
		out.ByWaiters = append(out.ByWaiters, &wardenv1.HotResource{Resource: l.GetResource(), Waiters: l.GetWaiters()})
	}
	for _, rr := range s.r.acquires.top(limit) {
		out.ByAcquireRate = append(out.ByAcquireRate, &wardenv1.HotResource{Resource: rr.resource, AcquiresPerSecond: rr.perSec})
	}
	return connect.NewResponse(out), nil
}
