package router

import (
	"context"

	"connectrpc.com/connect"
)

// ForwardedReq is a request for another node, forwarded once.
func ForwardedReq[T any](m *T) *connect.Request[T] {
	req := connect.NewRequest(m)
	req.Header().Set(ForwardedHeader, "1")
	return req
}

// PrincipalHeader carries the principal of a forwarded call's original
// caller; guard honours it only from another node.
const PrincipalHeader = "Warden-Principal"

type PrincipalKey struct{}

// CredentialKey holds, in a client call's context, the request whose
// credentials (a token, a certificate, or none) guard authenticated, so
// that a newer auth state can check them again (watchCall).
type CredentialKey struct{}

// PrincipalOf is the authenticated principal of the call ctx serves (""
// when none was given).
func PrincipalOf(ctx context.Context) string {
	p, _ := ctx.Value(PrincipalKey{}).(string)
	return p
}

// forwardedHeader marks a request one node forwarded to another, with
// the number of hops so far. A node that hosts no replica of the shard
// forwards to one that does, which may forward once more to the leader;
// after maxHops a node serves the request itself or answers Unavailable.
const (
	ForwardedHeader = "Warden-Forwarded"
	MaxHops         = 2
)
