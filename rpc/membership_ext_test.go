package rpc_test

import (
	"context"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/proto/warden/placement/v1/placementv1connect"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/server"
)

// Membership changes compare and set on a shard created once every node
// runs a binary of placement command version 2 (here, the split's): a
// change decided against a membership that has changed since is refused
// by every replica, and one naming the current config change id is
// applied by every replica alike. The bootstrap's shard predates any
// known version and keeps Dragonboat's unordered changes: there the same
// stale change is applied, which is why the flag is the shard's, fixed
// at its creation, and never one replica's.
func TestMembershipCompareAndSet(t *testing.T) {
	// A dev cluster serves the node API only with a way to authenticate
	// the nodes: here the cluster secret, which the test's calls carry.
	const secret = "test-secret-0123456789"
	c := startCluster(t, server.DevConfig{Router: router.Config{ClusterSecret: secret}})
	admin := wardenv1connect.NewAdminServiceClient(c.srv.Client(), c.srv.URL)
	nodes := placementv1connect.NewNodeServiceClient(c.srv.Client(), c.srv.URL, connect.WithInterceptors(
		connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Warden-Cluster-Secret", secret)
				return next(ctx, req)
			}
		})))
	split, err := admin.SplitShard(ctx(t), connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: shardID}))
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	ordered := split.Msg.GetNewShardId()
	if !c.dev.Router.Map().Shard(ordered).GetOrderedConfigChange() || c.dev.Router.Map().Shard(shardID).GetOrderedConfigChange() {
		t.Fatal("premise: the split's shard has ordered_config_change (every node runs this binary), the bootstrap's has not")
	}
	change := func(shard uint64, ch placementv1.MembershipChange, replica uint64, ccid uint64) (*placementv1.MembershipResponse, error) {
		resp, err := nodes.Membership(ctx(t), connect.NewRequest(&placementv1.MembershipRequest{
			ShardId: shard, Change: ch, ReplicaId: replica, Address: "127.0.0.1:1", ConfigChangeId: ccid}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	// ghost is a non-voting replica no node runs: adding it changes the
	// membership and nothing else.
	const ghost = 99
	for _, shard := range []uint64{ordered, shardID} {
		read, err := change(shard, placementv1.MembershipChange_MEMBERSHIP_CHANGE_NONE, 0, 0)
		if err != nil || read.GetConfigChangeId() == 0 {
			t.Fatalf("shard %d: read the membership: %v (config change id %d, want one)", shard, err, read.GetConfigChangeId())
		}
		before := c.replicaMemberships(shard)
		_, err = change(shard, placementv1.MembershipChange_MEMBERSHIP_CHANGE_ADD_NON_VOTING, ghost, read.GetConfigChangeId()-1)
		after := c.replicaMemberships(shard) // first: the replicas agree, whatever the answer
		if shard == ordered {
			if after != before {
				t.Fatalf("shard %d: a stale change moved the membership from %s to %s", shard, before, after)
			}
			wantCode(t, err, connect.CodeAborted)
			added, err := change(shard, placementv1.MembershipChange_MEMBERSHIP_CHANGE_ADD_NON_VOTING, ghost, read.GetConfigChangeId())
			if err != nil || added.GetNonVoting()[ghost] == "" {
				t.Fatalf("shard %d: the change at the current id: %v, %v", shard, added, err)
			}
			read = added
		} else {
			if err != nil {
				t.Fatalf("premise: the unordered shard %d ignores the config change id, but: %v", shard, err)
			}
			if read, err = change(shard, placementv1.MembershipChange_MEMBERSHIP_CHANGE_NONE, 0, 0); err != nil {
				t.Fatal(err)
			}
		}
		c.replicaMemberships(shard) // every replica holds the ghost alike
		if _, err := change(shard, placementv1.MembershipChange_MEMBERSHIP_CHANGE_REMOVE, ghost, read.GetConfigChangeId()); err != nil {
			t.Fatalf("shard %d: remove the ghost at the current id: %v", shard, err)
		}
	}
}

// replicaMemberships reads the membership each node's replica of shard
// holds (Dragonboat reads it from the local replica once it has applied
// up to the leader's commit index), fails the test unless every replica
// holds the same, and returns it.
func (c *cluster) replicaMemberships(shard uint64) string {
	c.t.Helper()
	var first string
	for i, n := range c.dev.Nodes {
		m, err := n.Node.NodeHost().SyncGetShardMembership(ctx(c.t), shard)
		if err != nil {
			c.t.Fatalf("node %d's replica of shard %d: membership: %v", n.Node.ID(), shard, err)
		}
		got := fmt.Sprintf("config change %d voting %v non-voting %v removed %v", m.ConfigChangeID, m.Nodes, m.NonVotings, m.Removed)
		if i == 0 {
			first = got
		} else if got != first {
			c.t.Fatalf("shard %d: node %d's replica holds %s, node %d's %s", shard, c.dev.Nodes[0].Node.ID(), first, n.Node.ID(), got)
		}
	}
	return first
}
