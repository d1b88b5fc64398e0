package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

// exampleNode starts an in-memory stand-in for a Warden node and returns
// its URL, so that the examples run and their output is checked (as
// connect-go's examples call an in-memory server). Each example gets its
// own, so that its output does not depend on which ran before. It is
// never closed: it lives as long as the test binary.
//
// Its LockService is fakeLocks (close_test.go), which grants free
// resources with fencing tokens 1, 2, …, plus renewals of current leases
// and Batch; its AdminService revokes leases; its QuotaService keeps
// limits on a tree of keys (each level's limit bounds the reserved and
// committed amounts of its subtree) without expiry or fairness.
func exampleNode() string {
	locks := &exampleLocks{fakeLocks: &fakeLocks{held: map[string]string{}, released: map[string]int{}}}
	mux := http.NewServeMux()
	mux.Handle(wardenv1connect.NewLockServiceHandler(locks))
	mux.Handle(wardenv1connect.NewAdminServiceHandler(exampleAdmin{locks: locks}))
	mux.Handle(wardenv1connect.NewQuotaServiceHandler(&exampleQuotas{limits: map[string]int64{}, used: map[string]int64{}, reservations: map[string]*exampleReservation{}}))
	return httptest.NewServer(mux).URL
}

// exampleLocks is fakeLocks with Renew, RenewBatch and Batch, and the
// tokens of its leases for RevokeLease.
type exampleLocks struct {
	*fakeLocks
}

// renew renews the lease if it is current.
func (f *exampleLocks) renew(req *wardenv1.RenewRequest) (*wardenv1.RenewResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held[req.GetResource()] != req.GetLeaseId() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the lease is not current (expired, released or replaced)"))
	}
	return &wardenv1.RenewResponse{ExpiresAt: timestamppb.New(time.Now().Add(30 * time.Second))}, nil
}

func (f *exampleLocks) Renew(_ context.Context, req *connect.Request[wardenv1.RenewRequest]) (*connect.Response[wardenv1.RenewResponse], error) {
	resp, err := f.renew(req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

func (f *exampleLocks) RenewBatch(_ context.Context, req *connect.Request[wardenv1.RenewBatchRequest]) (*connect.Response[wardenv1.RenewBatchResponse], error) {
	out := &wardenv1.RenewBatchResponse{}
	for _, r := range req.Msg.GetRenewals() {
		resp, err := f.renew(r)
		o := &wardenv1.RenewOutcome{ExpiresAt: resp.GetExpiresAt()}
		if err != nil {
			o.Code, o.Message = outcome(err)
		}
		out.Outcomes = append(out.Outcomes, o)
	}
	return connect.NewResponse(out), nil
}

// outcome is err as a batched call's outcome: its code in Connect's
// spelling and its message.
func outcome(err error) (code, message string) {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code().String(), ce.Message()
	}
	return connect.CodeUnknown.String(), err.Error()
}

func (f *exampleLocks) Batch(ctx context.Context, req *connect.Request[wardenv1.BatchRequest]) (*connect.Response[wardenv1.BatchResponse], error) {
	out := &wardenv1.BatchResponse{}
	for _, op := range req.Msg.GetOps() {
		o := &wardenv1.BatchOutcome{}
		if r := op.GetRelease(); r != nil {
			resp, _ := f.Release(ctx, connect.NewRequest(r))
			o.Result = &wardenv1.BatchOutcome_Release{Release: resp.Msg}
		} else if resp, err := f.Acquire(ctx, connect.NewRequest(op.GetAcquire())); err != nil {
			o.Code, o.Message = outcome(err)
		} else {
			o.Result = &wardenv1.BatchOutcome_Acquire{Acquire: resp.Msg}
		}
		out.Outcomes = append(out.Outcomes, o)
	}
	return connect.NewResponse(out), nil
}

// exampleAdmin is an AdminService with RevokeLease alone.
type exampleAdmin struct {
	wardenv1connect.UnimplementedAdminServiceHandler
	locks *exampleLocks
}

func (a exampleAdmin) RevokeLease(_ context.Context, req *connect.Request[wardenv1.RevokeLeaseRequest]) (*connect.Response[wardenv1.RevokeLeaseResponse], error) {
	f := a.locks
	f.mu.Lock()
	defer f.mu.Unlock()
	// fakeLocks' lease ids are "lease-" and the token.
	id, ok := f.held[req.Msg.GetResource()]
	revoked := ok && id == fmt.Sprintf("lease-%d", req.Msg.GetFencingToken())
	if revoked {
		delete(f.held, req.Msg.GetResource())
	}
	return connect.NewResponse(&wardenv1.RevokeLeaseResponse{Revoked: revoked}), nil
}

// exampleQuotas is a QuotaService of limits on a tree of keys
// ("gpu/team-a/train" is under "gpu/team-a", under "gpu"): a reserve
// must fit under the limit of every limited level of its key's path,
// and is charged to all of them until it is released, or committed
// (then for the amount committed).
type exampleQuotas struct {
	wardenv1connect.UnimplementedQuotaServiceHandler
	mu           sync.Mutex
	limits       map[string]int64 // key -> limit
	used         map[string]int64 // key -> reserved and committed in its subtree
	reservations map[string]*exampleReservation
}

type exampleReservation struct {
	key                 string
	amount              int64
	committed, released bool
}

// levels are the keys of key's path, root first.
func levels(key string) []string {
	var out []string
	for i, c := range key {
		if c == '/' {
			out = append(out, key[:i])
		}
	}
	return append(out, key)
}

func (q *exampleQuotas) SetLimit(_ context.Context, req *connect.Request[wardenv1.SetLimitRequest]) (*connect.Response[wardenv1.SetLimitResponse], error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.limits[req.Msg.GetKey()] = req.Msg.GetLimit()
	return connect.NewResponse(&wardenv1.SetLimitResponse{}), nil
}

func (q *exampleQuotas) Reserve(_ context.Context, req *connect.Request[wardenv1.ReserveRequest]) (*connect.Response[wardenv1.ReserveResponse], error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	m := req.Msg
	remaining, limited := int64(0), false
	for _, l := range levels(m.GetKey()) {
		limit, ok := q.limits[l]
		if !ok {
			continue
		}
		left := limit - q.used[l]
		if left < m.GetAmount() {
			e := connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("amount: LIMIT: %s has %d left", l, left))
			if d, err := connect.NewErrorDetail(&wardenv1.QuotaExhausted{Level: l, Remaining: left, Reason: "LIMIT"}); err == nil {
				e.AddDetail(d)
			}
			return nil, e
		}
		if !limited || left-m.GetAmount() < remaining {
			remaining, limited = left-m.GetAmount(), true
		}
	}
	if !limited {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("key %s has no limit on its path", m.GetKey()))
	}
	for _, l := range levels(m.GetKey()) {
		q.used[l] += m.GetAmount()
	}
	q.reservations[m.GetReservationId()] = &exampleReservation{key: m.GetKey(), amount: m.GetAmount()}
	return connect.NewResponse(&wardenv1.ReserveResponse{ReservationId: m.GetReservationId(), Remaining: remaining,
		ExpiresAt: timestamppb.New(time.Now().Add(m.GetTtl().AsDuration()))}), nil
}

func (q *exampleQuotas) Commit(_ context.Context, req *connect.Request[wardenv1.CommitRequest]) (*connect.Response[wardenv1.CommitResponse], error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	r, ok := q.reservations[req.Msg.GetReservationId()]
	switch {
	case !ok || r.released:
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the reservation is not held"))
	case r.committed:
		return connect.NewResponse(&wardenv1.CommitResponse{Committed: r.amount}), nil
	case req.Msg.GetAmount() > r.amount:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("amount: more than reserved"))
	}
	if n := req.Msg.GetAmount(); n > 0 {
		for _, l := range levels(r.key) {
			q.used[l] -= r.amount - n
		}
		r.amount = n
	}
	r.committed = true
	return connect.NewResponse(&wardenv1.CommitResponse{Committed: r.amount}), nil
}

func (q *exampleQuotas) Release(_ context.Context, req *connect.Request[wardenv1.QuotaServiceReleaseRequest]) (*connect.Response[wardenv1.QuotaServiceReleaseResponse], error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	r, ok := q.reservations[req.Msg.GetReservationId()]
	switch {
	case !ok || r.released:
		return connect.NewResponse(&wardenv1.QuotaServiceReleaseResponse{}), nil
	case r.committed:
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the reservation is committed"))
	}
	for _, l := range levels(r.key) {
		q.used[l] -= r.amount
	}
	r.released = true
	return connect.NewResponse(&wardenv1.QuotaServiceReleaseResponse{Released: true}), nil
}
