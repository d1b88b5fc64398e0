// Package rpctypes is the error vocabulary the Warden server and its Go
// SDK share (as etcd's api/v3rpc/rpctypes): what makes an answer worth
// retrying, and where an Unavailable answer says the shard's leader is.
// It lives in the API module so that neither side imports the other.
package rpctypes

import (
	"errors"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// Retryable reports whether err leaves a call's outcome unknown in a way
// that a retry with the same request, reservation or lease id settles:
// the server answered Unavailable, or the connection broke before the
// answer was read (the node died or restarted mid-call, which Connect
// reports as Unknown, not from the wire). The caller's own deadline or
// cancel is not retryable: it decides what the caller is told.
func Retryable(err error) bool {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return false
	}
	switch ce.Code() {
	case connect.CodeUnavailable:
		return true
	case connect.CodeUnknown:
		return !connect.IsWireError(ce)
	}
	return false
}

// LeaderAddress returns the client address ("host:port") of the shard's
// leader that an Unavailable answer names in its recovery detail
// (warden.v1.NotLeader or RangeMoved), or "" when err names none.
func LeaderAddress(err error) string {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return ""
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		switch m := v.(type) {
		case *wardenv1.NotLeader:
			return m.GetLeaderAddress()
		case *wardenv1.RangeMoved:
			return m.GetLeaderAddress()
		}
	}
	return ""
}
