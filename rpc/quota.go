package rpc

import (
	"context"
	"encoding/base64"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/auth"
	"github.com/warden-dev/warden/keyspace"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/shard"
)

// QuotaServer implements wardenv1connect.QuotaServiceHandler on a Router.
// Quota keys route by their pool (the first segment), so a whole tree
// lives in one shard and a Reserve checks every level in one entry.
type QuotaServer struct {
	r *node
}

var _ wardenv1connect.QuotaServiceHandler = (*QuotaServer)(nil)

// newQuotaServer returns the QuotaService handler of r.
func newQuotaServer(r *node) *QuotaServer { return &QuotaServer{r: r} }

// quotaCall runs a quota RPC here (the routing interceptor has routed
// it to the node that leads the pool's shard).
func quotaCall[Req, Resp any](ctx context.Context, req *connect.Request[Req], local func(context.Context, *Req) (*Resp, error)) (*connect.Response[Resp], error) {
	out, err := local(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// propose proposes a quota command for key, routed by its pool.
func (s *QuotaServer) propose(ctx context.Context, key string, env *shardv1.Envelope) (*shardv1.Result, error) {
	return s.r.Propose(ctx, keyspace.Pool(key), env)
}

func level(q *shardv1.QuotaRecord, reserved, expired, remaining int64) *wardenv1.QuotaLevel {
	return &wardenv1.QuotaLevel{Key: q.GetKey(), HasLimit: q.GetHasLimit(), Limit: q.GetLimit(), Weight: q.GetWeight(),
		Committed: q.GetCommitted(), Reserved: reserved, ExpiredPending: expired, Remaining: remaining}
}

// SetLimit implements QuotaService.SetLimit.
func (s *QuotaServer) SetLimit(ctx context.Context, req *connect.Request[wardenv1.SetLimitRequest]) (*connect.Response[wardenv1.SetLimitResponse], error) {
	return quotaCall(ctx, req, func(ctx context.Context, m *wardenv1.SetLimitRequest) (*wardenv1.SetLimitResponse, error) {
		res, err := s.propose(ctx, m.GetKey(), &shardv1.Envelope{Command: &shardv1.Envelope_SetLimit{SetLimit: &shardv1.SetLimitCmd{
			Key: m.GetKey(), Limit: m.GetLimit(), Weight: m.GetWeight()}}})
		if err != nil {
			return nil, err
		}
		q := res.GetQuota().GetRecord()
		return &wardenv1.SetLimitResponse{Level: level(q, q.GetReserved(), 0, max(0, q.GetLimit()-q.GetCommitted()-q.GetReserved()))}, nil
	})
}

// Reserve implements QuotaService.Reserve.
func (s *QuotaServer) Reserve(ctx context.Context, req *connect.Request[wardenv1.ReserveRequest]) (*connect.Response[wardenv1.ReserveResponse], error) {
	return quotaCall(ctx, req, func(ctx context.Context, m *wardenv1.ReserveRequest) (*wardenv1.ReserveResponse, error) {
		if err := shard.CheckName("reservation_id", m.GetReservationId(), shard.MaxRequestIDBytes); err != nil {
			return nil, err
		}
		ttl, err := duration("ttl", m.GetTtl(), 0)
		if err != nil {
			return nil, err
		}
		res, err := s.propose(ctx, m.GetKey(), &shardv1.Envelope{Command: &shardv1.Envelope_Reserve{Reserve: &shardv1.ReserveCmd{
			Key: m.GetKey(), Amount: m.GetAmount(), ReservationId: m.GetReservationId(), TtlNanos: int64(ttl)}}})
		if err != nil {
			return nil, err
		}
		r := res.GetQuota().GetReservation()
		return &wardenv1.ReserveResponse{ReservationId: r.GetReservationId(), Remaining: res.GetQuota().GetRemaining(), ExpiresAt: timestamp(r.GetExpiresAtUnixNano())}, nil
	})
}

// Commit implements QuotaService.Commit.
func (s *QuotaServer) Commit(ctx context.Context, req *connect.Request[wardenv1.CommitRequest]) (*connect.Response[wardenv1.CommitResponse], error) {
	return quotaCall(ctx, req, func(ctx context.Context, m *wardenv1.CommitRequest) (*wardenv1.CommitResponse, error) {
		res, err := s.propose(ctx, m.GetKey(), &shardv1.Envelope{Command: &shardv1.Envelope_Commit{Commit: &shardv1.CommitCmd{
			Key: m.GetKey(), ReservationId: m.GetReservationId(), Amount: m.GetAmount()}}})
		if err != nil {
			return nil, err
		}
		return &wardenv1.CommitResponse{Committed: res.GetQuota().GetReservation().GetCommitted()}, nil
	})
}

// Release implements QuotaService.Release.
func (s *QuotaServer) Release(ctx context.Context, req *connect.Request[wardenv1.QuotaServiceReleaseRequest]) (*connect.Response[wardenv1.QuotaServiceReleaseResponse], error) {
	return quotaCall(ctx, req, func(ctx context.Context, m *wardenv1.QuotaServiceReleaseRequest) (*wardenv1.QuotaServiceReleaseResponse, error) {
		res, err := s.propose(ctx, m.GetKey(), &shardv1.Envelope{Command: &shardv1.Envelope_ReleaseReservation{ReleaseReservation: &shardv1.ReleaseReservationCmd{
			Key: m.GetKey(), ReservationId: m.GetReservationId()}}})
		if err != nil {
			return nil, err
		}
		return &wardenv1.QuotaServiceReleaseResponse{Released: res.GetReleased()}, nil
	})
}

// Query implements QuotaService.Query here, with a linearizable read;
// the routing interceptor sends it where it is served (serveQuery).
//
// With authentication on, a level whose key the caller may neither use
// nor read (a level above its grant's prefix, shared with other
// tenants) shows only its key and remaining (redactLevels).
func (s *QuotaServer) Query(ctx context.Context, req *connect.Request[wardenv1.QueryRequest]) (*connect.Response[wardenv1.QueryResponse], error) {
	return redacted(ctx, s.r)(quotaCall(ctx, req, func(ctx context.Context, m *wardenv1.QueryRequest) (*wardenv1.QueryResponse, error) {
		q, err := s.r.Read(ctx, keyspace.Pool(m.GetKey()), &shardv1.Query{Query: &shardv1.Query_Quota{Quota: &shardv1.QuotaQuery{Key: m.GetKey()}}})
		if err != nil {
			return nil, err
		}
		return queryResponse(q), nil
	}))
}

// checkQuery refuses Query m before it is routed.
func checkQuery(_ *node, m *wardenv1.QueryRequest) error {
	if _, known := wardenv1.Consistency_name[int32(m.GetConsistency())]; !known {
		return &shard.FieldError{Field: "consistency", Reason: "must be CONSISTENCY_LINEARIZABLE or CONSISTENCY_STALE"}
	}
	return nil
}

// serveQuery is Query's route (route.go): a stale Query is answered from
// a local replica of the pool's shard, whichever node leads it; without
// one, a linearizable read is at least as fresh. An answer another node
// gave is redacted here too, by the policy of the node that authorized
// the call.
func serveQuery(ctx context.Context, n *node, req *connect.Request[wardenv1.QueryRequest], send sender[wardenv1.QueryRequest, wardenv1.QueryResponse],
	local localCall[wardenv1.QueryRequest, wardenv1.QueryResponse]) (*connect.Response[wardenv1.QueryResponse], served, error) {
	if req.Msg.GetConsistency() == wardenv1.Consistency_CONSISTENCY_STALE {
		if q, ok := n.StaleRead(req.Msg.GetKey(), &shardv1.Query{Query: &shardv1.Query_Quota{Quota: &shardv1.QuotaQuery{Key: req.Msg.GetKey()}}}); ok {
			resp, err := redacted(ctx, n)(connect.NewResponse(queryResponse(q)), nil)
			return resp, servedHere, err
		}
	}
	resp, where, err := plain(ctx, req, send, local)
	if where == servedThere {
		resp, err = redacted(ctx, n)(resp, err)
	}
	return resp, where, err
}

// redacted returns a function that redacts (redactLevels) a Query's
// answer resp, unless the call failed (err).
func redacted(ctx context.Context, n *node) func(*connect.Response[wardenv1.QueryResponse], error) (*connect.Response[wardenv1.QueryResponse], error) {
	return func(resp *connect.Response[wardenv1.QueryResponse], err error) (*connect.Response[wardenv1.QueryResponse], error) {
		if err == nil {
			err = redactLevels(ctx, n, resp.Msg)
		}
		if err != nil {
			return nil, err
		}
		return resp, nil
	}
}

func queryResponse(q *shardv1.QueryResult) *wardenv1.QueryResponse {
	out := &wardenv1.QueryResponse{AsOf: timestamp(q.GetTimeUnixNano()), LedgerSeq: q.GetLedgerSeq(), Frozen: q.GetRestored()}
	for _, l := range q.GetLevels() {
		out.Levels = append(out.Levels, level(l.GetRecord(), l.GetReserved(), l.GetExpiredPending(), l.GetRemaining()))
	}
	return out
}

// Page sizes of the list RPCs.
const (
	defaultPage = 100
	maxPage     = 1000
)

func pageSize(field string, n uint32) (uint32, error) {
	switch {
	case n == 0:
		return defaultPage, nil
	case n > maxPage:
		return 0, &shard.FieldError{Field: field, Reason: fmt.Sprintf("must be at most %d", maxPage)}
	}
	return n, nil
}

// ListReservations implements QuotaService.ListReservations.
func (s *QuotaServer) ListReservations(ctx context.Context, req *connect.Request[wardenv1.ListReservationsRequest]) (*connect.Response[wardenv1.ListReservationsResponse], error) {
	return quotaCall(ctx, req, func(ctx context.Context, m *wardenv1.ListReservationsRequest) (*wardenv1.ListReservationsResponse, error) {
		size, err := pageSize("page_size", m.GetPageSize())
		if err != nil {
			return nil, err
		}
		rq := &shardv1.ReservationsQuery{Key: m.GetKey(), Limit: size}
		if t := m.GetPageToken(); t != "" {
			b, err := base64.RawURLEncoding.DecodeString(t)
			key, id, ok := cutNUL(b)
			if err != nil || !ok || !shard.Under(key, m.GetKey()) || shard.CheckName("page_token", id, shard.MaxRequestIDBytes) != nil {
				return nil, &shard.FieldError{Field: "page_token", Reason: "is not a token this service gave"}
			}
			rq.AfterKey, rq.AfterId = key, id
		}
		q, err := s.r.Read(ctx, keyspace.Pool(m.GetKey()), &shardv1.Query{Query: &shardv1.Query_Reservations{Reservations: rq}})
		if err != nil {
			return nil, err
		}
		out := &wardenv1.ListReservationsResponse{}
		for _, r := range q.GetReservations() {
			out.Reservations = append(out.Reservations, &wardenv1.Reservation{Key: r.GetKey(), ReservationId: r.GetReservationId(),
				Amount: r.GetAmount(), ExpiresAt: timestamp(r.GetExpiresAtUnixNano())})
		}
		if n := len(q.GetReservations()); n == int(size) {
			last := q.GetReservations()[n-1]
			out.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(last.GetKey() + "\x00" + last.GetReservationId()))
		}
		return out, nil
	})
}

func cutNUL(b []byte) (string, string, bool) {
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), string(b[i+1:]), true
		}
	}
	return "", "", false
}

// ListLedger implements QuotaService.ListLedger.
func (s *QuotaServer) ListLedger(ctx context.Context, req *connect.Request[wardenv1.ListLedgerRequest]) (*connect.Response[wardenv1.ListLedgerResponse], error) {
	return quotaCall(ctx, req, func(ctx context.Context, m *wardenv1.ListLedgerRequest) (*wardenv1.ListLedgerResponse, error) {
		size, err := pageSize("limit", m.GetLimit())
		if err != nil {
			return nil, err
		}
		q, err := s.r.Read(ctx, keyspace.Pool(m.GetKey()), &shardv1.Query{Query: &shardv1.Query_Ledger{Ledger: &shardv1.LedgerQuery{
			Key: m.GetKey(), AfterSeq: m.GetAfterSeq(), Limit: size}}})
		if err != nil {
			return nil, err
		}
		out := &wardenv1.ListLedgerResponse{}
		for _, k := range q.GetCheckpoints() {
			out.Checkpoints = append(out.Checkpoints, &wardenv1.LedgerCheckpoint{Key: k.GetKey(), ThroughSeq: k.GetThroughSeq(),
				HasLimit: k.GetHasLimit(), Limit: k.GetLimit(), Committed: k.GetCommitted()})
		}
		for _, e := range q.GetLedger() {
			out.Events = append(out.Events, &wardenv1.LedgerEvent{Seq: e.GetSeq(), Key: e.GetKey(), Kind: e.GetKind(), Amount: e.GetAmount(),
				ReservationId: e.GetReservationId(), At: timestamp(e.GetAtUnixNano()), Limit: e.GetLimit(), Returned: e.GetReturned(), ReportId: e.GetReportId(),
				ExpiresAt: timestamp(e.GetExpiresAtUnixNano())})
		}
		return out, nil
	})
}

// checkReportUsage refuses ReportUsage m before it is routed.
func checkReportUsage(n *node, m *wardenv1.ReportUsageRequest) error {
	if m.GetCorrect() && m.ObservedSeq == nil { // before routing, as below
		return &shard.FieldError{Field: "observed_seq", Reason: "is required with correct: pass the ledger_seq of the Query the observation corresponds to"}
	}
	if m.ObservedSeq != nil {
		// Before routing: a node of an older binary, leading or forwarded
		// to, would drop the field it does not know and correct against
		// now. Only once every replica's node applies version 5.
		if rg, err := n.Map().ShardFor(keyspace.Pool(m.GetKey())); err == nil && !n.Applies(rg.GetShardId(), shard.VersionObservedSeq) {
			return fmt.Errorf("%w: observed_seq needs envelope version %d, and not every replica of shard %d applies it yet (a rolling upgrade is under way)",
				router.ErrNoLeader, shard.VersionObservedSeq, rg.GetShardId())
		}
	}
	return nil
}

// ReportUsage implements QuotaService.ReportUsage here (checkReportUsage
// has refused what must be refused before routing).
func (s *QuotaServer) ReportUsage(ctx context.Context, req *connect.Request[wardenv1.ReportUsageRequest]) (*connect.Response[wardenv1.ReportUsageResponse], error) {
	return quotaCall(ctx, req, func(ctx context.Context, m *wardenv1.ReportUsageRequest) (*wardenv1.ReportUsageResponse, error) {
		res, err := s.propose(ctx, m.GetKey(), &shardv1.Envelope{Command: &shardv1.Envelope_ReportUsage{ReportUsage: &shardv1.ReportUsageCmd{
			Key: m.GetKey(), Observed: m.GetObserved(), ReportId: m.GetReportId(), Correct: m.GetCorrect(), ObservedSeq: m.ObservedSeq}}})
		if err != nil {
			return nil, err
		}
		metrics.quotaDrift.WithLabelValues(keyspace.Pool(m.GetKey())).Set(float64(res.GetQuota().GetDrift()))
		q := res.GetQuota().GetRecord()
		return &wardenv1.ReportUsageResponse{Drift: res.GetQuota().GetDrift(), Level: level(q, q.GetReserved(), 0, max(0, q.GetLimit()-q.GetCommitted()-q.GetReserved()))}, nil
	})
}

// checkUnfreeze refuses Unfreeze m before it is routed.
func checkUnfreeze(n *node, m *wardenv1.UnfreezeRequest) error {
	pool := m.GetPool()
	if err := shard.CheckQuotaKey("pool", pool); err != nil {
		return err
	}
	if keyspace.Pool(pool) != pool {
		return &shard.FieldError{Field: "pool", Reason: "must be a pool: a key of one segment"}
	}
	// Checked before forwarding: the leader may be the older binary,
	// which does not know the call.
	if rg, err := n.Map().ShardFor(pool); err == nil && !n.Applies(rg.GetShardId(), shard.VersionRestoredPools) {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("a replica of shard %d runs a binary older than Unfreeze (envelope version %d): finish the rolling upgrade first", rg.GetShardId(), shard.VersionRestoredPools))
	}
	return nil
}

// Unfreeze implements QuotaService.Unfreeze here (checkUnfreeze has
// refused what must be refused before routing).
func (s *QuotaServer) Unfreeze(ctx context.Context, req *connect.Request[wardenv1.UnfreezeRequest]) (*connect.Response[wardenv1.UnfreezeResponse], error) {
	pool := req.Msg.GetPool()
	return quotaCall(ctx, req, func(ctx context.Context, m *wardenv1.UnfreezeRequest) (*wardenv1.UnfreezeResponse, error) {
		res, err := s.propose(ctx, pool, &shardv1.Envelope{Command: &shardv1.Envelope_UnfreezePool{UnfreezePool: &shardv1.UnfreezePoolCmd{Pool: pool}}})
		if err != nil {
			return nil, err
		}
		return &wardenv1.UnfreezeResponse{Unfrozen: res.GetCount() == 1}, nil
	})
}

// quotaExhausted is the QuotaExhausted detail of a refused Reserve.
func quotaExhausted(q *shardv1.QuotaOutcome) *wardenv1.QuotaExhausted {
	d := &wardenv1.QuotaExhausted{Level: q.GetLevel(), Remaining: q.GetRemaining(), Reason: q.GetReason()}
	if q.GetRetryAfterNanos() > 0 {
		d.RetryAfter = durationpb.New(time.Duration(q.GetRetryAfterNanos()))
	}
	return d
}

// redactLevels zeroes, in q, the limit, weight and totals of each level
// whose key the call's principal may neither use (quota.use) nor read:
// they count other tenants' usage. Its key stays, and its remaining,
// which bounds the caller's own reservations (a Reserve refused would
// tell as much). It fails, as authorization does, when the node's auth
// view is too old to decide by.
func redactLevels(ctx context.Context, r *node, q *wardenv1.QueryResponse) error {
	pol, err := r.auth.Policy()
	if err != nil || !pol.Enabled() {
		return err
	}
	principal := router.PrincipalOf(ctx)
	for _, l := range q.GetLevels() {
		if pol.Allows(principal, auth.QuotaUse, l.GetKey()) || pol.Allows(principal, auth.Read, l.GetKey()) {
			continue
		}
		l.HasLimit, l.Limit, l.Weight, l.Committed, l.Reserved, l.ExpiredPending = false, 0, 0, 0, 0, 0
	}
	return nil
}
