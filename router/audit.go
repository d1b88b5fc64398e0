package router

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// The audit log records every state-changing RPC as one JSON line
// (DESIGN.md §6). A lock call's: method, resource, request id, a hash of
// the lease id (the lease id itself is a bearer secret), fencing token,
// holder, caller (the address that sent it), principal (the
// authenticated caller; for a forwarded call, the original one) and
// outcome. A quota, admin or auth change's: method, key, its request,
// principal and outcome. Never a lease id, a token or key material.

// auditHash identifies a lease id or request id in logs without
// revealing it: the first 8 bytes of its SHA-256, in hex. A request id in
// clear would let a reader of the log replay the Acquire (with its
// resource, holder and TTL) and get the lease id back.
func auditHash(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:8])
}

// auditEntry is what one RPC contributes to its audit line.
type auditEntry struct {
	method, resource, requestID, leaseID, holder string
	token                                        uint64
	released                                     *bool // Release only
	// request is a quota, admin or auth change's request (requestText),
	// tokenID the id of the token CreateToken made.
	request, tokenID string
}

// acquireEntry is the audit entry of Acquire m, answered resp (nil when
// it failed).
func acquireEntry(m *wardenv1.AcquireRequest, resp *wardenv1.AcquireResponse) *auditEntry {
	return &auditEntry{method: "Acquire", resource: m.GetResource(), requestID: m.GetRequestId(), holder: m.GetHolder(),
		leaseID: resp.GetLeaseId(), token: resp.GetFencingToken()}
}

// renewEntry is the audit entry of renewal m under method (Renew, or
// RenewBatch for one of its renewals).
func renewEntry(method string, m *wardenv1.RenewRequest) *auditEntry {
	return &auditEntry{method: method, resource: m.GetResource(), leaseID: m.GetLeaseId()}
}

// releaseEntry is the audit entry of Release m, answered resp (nil when
// it failed).
func releaseEntry(m *wardenv1.ReleaseRequest, resp *wardenv1.ReleaseResponse) *auditEntry {
	e := &auditEntry{method: "Release", resource: m.GetResource(), leaseID: m.GetLeaseId()}
	if resp != nil {
		released := resp.GetReleased()
		e.released = &released
	}
	return e
}

// audit writes e with the RPC's caller and outcome; it does nothing
// without an audit logger.
func (r *Router) audit(ctx context.Context, peer connect.Peer, e auditEntry, err error) {
	if r.cfg.Audit == nil {
		return
	}
	attrs := []slog.Attr{
		slog.String("method", e.method),
		slog.String("resource", e.resource),
		slog.String("caller", peer.Addr),
		slog.String("principal", principalOf(ctx)),
		slog.String("outcome", outcome(err)),
	}
	if e.requestID != "" {
		attrs = append(attrs, slog.String("request_hash", auditHash(e.requestID)))
	}
	if e.leaseID != "" {
		attrs = append(attrs, slog.String("lease_hash", auditHash(e.leaseID)))
	}
	if e.token != 0 {
		attrs = append(attrs, slog.Uint64("fencing_token", e.token))
	}
	if e.released != nil {
		attrs = append(attrs, slog.Bool("released", *e.released))
	}
	if e.holder != "" {
		attrs = append(attrs, slog.String("holder", e.holder))
	}
	if e.request != "" {
		attrs = append(attrs, slog.String("request", e.request))
	}
	if e.tokenID != "" {
		attrs = append(attrs, slog.String("token_id", e.tokenID))
	}
	if err != nil {
		attrs = append(attrs, slog.String("code", classify(err).code.String()))
	}
	r.cfg.Audit.LogAttrs(ctx, slog.LevelInfo, "audit", attrs...)
}
