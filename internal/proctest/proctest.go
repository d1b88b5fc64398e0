// Package proctest holds what the tests that run wardend processes (the
// process-cluster tests of cmd/wardend and the nemesis suite) share.
package proctest

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// WaitServing waits, for at most within, until locks answers a Describe:
// the node's router has a map and the shard of the resource "probe" a
// leader, wherever it is. It returns an error at once when the process
// exits: exited receives the process's Wait error, which is put back
// for whoever waits on it next (exited must have room for it).
func WaitServing(locks wardenv1connect.LockServiceClient, exited chan error, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := locks.Describe(ctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: "probe"}))
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("did not serve within %v: %w", within, err)
		}
		select {
		case werr := <-exited:
			exited <- werr
			return fmt.Errorf("exited (%v)", werr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
