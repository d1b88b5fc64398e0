package router

import "context"

// Remote is how the routing core asks another node about, or acts on,
// replicas that only that node hosts: a node that hosts no replica of a
// shard knows neither its leader nor how to hand leadership on. The API
// layer implements it over the other node's admin API, marking each call
// forwarded so that it goes no further (rpc.NewRemote). Proposals, reads
// and Raft traffic go over the placement NodeService instead.
type Remote interface {
	// LeaderOf returns the node id that the node at addr, which hosts a
	// replica of shardID, knows as the shard's leader (0: none).
	LeaderOf(ctx context.Context, addr string, shardID uint64) (uint64, error)
	// TransferLeader asks the node at addr, which hosts a replica of
	// shardID, to move the shard's leadership to node's replica and to
	// wait for it (up to 5 s); it returns the node that leads after.
	TransferLeader(ctx context.Context, addr string, shardID, node uint64) (uint64, error)
}
