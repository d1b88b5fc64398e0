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

type principalKey struct{}

// WithPrincipal returns ctx, of a call whose caller authenticated as
// principal: calls forwarded for it to other nodes carry the principal
// (PrincipalHeader), and the commands proposed for it may record it.
func WithPrincipal(ctx context.Context, principal string) context.Context {
	return context.WithValue(ctx, principalKey{}, principal)
}

// PrincipalOf is the authenticated principal of the call ctx serves (""
// when none was given).
func PrincipalOf(ctx context.Context) string {
	p, _ := ctx.Value(principalKey{}).(string)
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
