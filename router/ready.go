package router

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
)

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
		if _, _, _, err := n.Raft.LeaderOf(placement.MetaShardID); err == nil && n.Node != nil {
			check(fmt.Sprintf("node %d's placement replica", n.ID), func(ctx context.Context) error {
				_, err := n.Node.Meta().Read(ctx)
				return err
			})
		}
		for _, id := range m.DataShards() {
			if !slices.ContainsFunc(m.Shard(id).GetReplicas(), func(rep *placementv1.Replica) bool { return rep.GetNodeId() == n.ID }) {
				continue // the map places no replica of it here
			}
			if n.Node != nil {
				if err := n.Node.ReplicaFailed(id); err != nil {
					add(err.Error())
					continue
				}
			}
			check(fmt.Sprintf("node %d's replica of shard %d", n.ID, id), func(ctx context.Context) error {
				_, err := n.Raft.Read(ctx, id, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}})
				return err
			})
		}
	}
	wg.Wait()
	slices.Sort(reasons)
	r.ready.at, r.ready.reasons = time.Now(), reasons
	return reasons
}

// ReplicaFailed reports whether node, if it runs in this process, left
// its replica of shardID stopped (placement.Node.ReplicaFailed).
func (r *Router) ReplicaFailed(node, shardID uint64) bool {
	for i := range r.nodes {
		if n := &r.nodes[i]; n.ID == node && n.Node != nil {
			return n.Node.ReplicaFailed(shardID) != nil
		}
	}
	return false
}

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
