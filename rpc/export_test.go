package rpc

import (
	"context"

	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
)

// ProposeAcquire proposes the Acquire command of req with no RPC waiting
// on its answer, as a waiter whose call is gone leaves it, for the tests
// outside the package (which start clusters through package server, which
// the package's own tests cannot import).
func ProposeAcquire(ctx context.Context, r *router.Router, req *wardenv1.AcquireRequest) (*shardv1.Result, error) {
	cmd, err := newLockServer(newNode(r)).acquireCmd(ctx, req)
	if err != nil {
		return nil, err
	}
	return r.Propose(ctx, req.GetResource(), &shardv1.Envelope{Command: &shardv1.Envelope_Acquire{Acquire: cmd}})
}
