package rpc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"time"

	"connectrpc.com/connect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/shard"
)

// The audit log records every state-changing RPC as one JSON line
// (DESIGN.md §6). A lock call's: method, resource, request id, a hash of
// the lease id (the lease id itself is a bearer secret), fencing token,
// holder, caller (the address that sent it), principal (the
// authenticated caller; for a forwarded call, the original one) and
// outcome. A quota, admin or auth change's: method, key, its request,
// principal and outcome. Never a lease id, a token or key material.
//
// What a refused call writes is bounded: the caller's text (resource or
// key, holder, principal, request) is cut to maxLogField bytes (the
// request to maxAuditRequest) with control, format and bidi characters
// escaped (shard.LogText), as is what an error message repeats of it
// (logQuote); and a Batch's or RenewBatch's denied ops write one line
// with their count (deniedOps), not one each.

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
	// alreadyReleased: a Release found the lease ended by a Release of
	// its id (an earlier call, or an attempt a router retried).
	alreadyReleased bool
	// request is a quota, admin or auth change's request (requestText),
	// tokenID the id of the token CreateToken made.
	request, tokenID string
	// denied, when set, is how many ops of a Batch or RenewBatch were
	// denied (deniedOps): resource is the first one's.
	denied int
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
		e.released, e.alreadyReleased = &released, resp.GetAlreadyReleased()
	}
	return e
}

// deniedOps gathers the ops of one Batch or RenewBatch that authorization
// denied: each is counted as its own call would be, and all are audited
// in one line (a thousand denials in one request would otherwise write
// a thousand lines).
type deniedOps struct {
	n        int
	resource string // the first denied op's
	err      error
}

// add counts op of method on resource, denied with err (its latency
// observed from start, unless zero).
func (d *deniedOps) add(ctx context.Context, r *node, peer connect.Peer, method, resource string, start time.Time, err error) {
	record(ctx, r, peer, method, start, nil, err)
	if d.n == 0 {
		d.resource, d.err = resource, err
	}
	d.n++
}

// audit writes the one audit line of the denied ops of a call of method,
// if any were.
func (d *deniedOps) audit(ctx context.Context, r *node, peer connect.Peer, method string) {
	if d.n > 0 {
		audit(ctx, r, peer, auditEntry{method: method, resource: d.resource, denied: d.n}, d.err)
	}
}

// audit writes e with the RPC's caller and outcome; it does nothing
// without an audit logger.
func audit(ctx context.Context, r *node, peer connect.Peer, e auditEntry, err error) {
	if r.Config().Audit == nil {
		return
	}
	attrs := []slog.Attr{
		slog.String("method", e.method),
		slog.String("resource", shard.LogText(e.resource, router.MaxLogField)),
		slog.String("caller", peer.Addr),
		slog.String("principal", shard.LogText(router.PrincipalOf(ctx), router.MaxLogField)),
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
	if e.alreadyReleased {
		attrs = append(attrs, slog.Bool("already_released", true))
	}
	if e.holder != "" {
		attrs = append(attrs, slog.String("holder", shard.LogText(e.holder, router.MaxLogField)))
	}
	if e.request != "" {
		attrs = append(attrs, slog.String("request", e.request))
	}
	if e.denied != 0 {
		attrs = append(attrs, slog.Int("denied_ops", e.denied))
	}
	if e.tokenID != "" {
		attrs = append(attrs, slog.String("token_id", e.tokenID))
	}
	if err != nil {
		attrs = append(attrs, slog.String("code", classify(err).code.String()))
	}
	r.Config().Audit.LogAttrs(ctx, slog.LevelInfo, "audit", attrs...)
}
