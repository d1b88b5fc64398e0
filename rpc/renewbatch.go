package rpc

import (
	"context"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/warden-dev/warden/auth"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/shard"
)

// RenewBatch implements LockService.RenewBatch. The renewals of each
// shard go in one RenewBatchCmd to that shard's leader: proposed here
// when this node leads it, else forwarded as a smaller RenewBatch to the
// node that does. A renewal whose key left the shard on the way (a split
// or move) is sent again alone, through Renew's path. While a replica of
// the shard is on a node whose binary predates RenewBatchCmd (a rolling
// upgrade), or the leader's node does not serve RenewBatch, each renewal
// goes through Renew's path instead. Every renewal is audited, with
// method RenewBatch where this node proposed it.
func (s *LockServer) RenewBatch(ctx context.Context, req *connect.Request[wardenv1.RenewBatchRequest]) (*connect.Response[wardenv1.RenewBatchResponse], error) {
	renewals := req.Msg.GetRenewals()
	if n := len(renewals); n == 0 || n > shard.MaxRenewBatch {
		err := &shard.FieldError{Field: "renewals", Reason: fmt.Sprintf("must hold 1 to %d renewals, not %d", shard.MaxRenewBatch, n)}
		return nil, err
	}
	out := make([]*wardenv1.RenewOutcome, len(renewals))
	ids := make([][]byte, len(renewals)) // the decoded lease ids
	groups := map[uint64][]int{}         // shard id → indexes into renewals
	m := s.r.Map()
	var denied deniedOps
	defer denied.audit(ctx, s.r, req.Peer(), "RenewBatch")
	for i, rn := range renewals {
		var err error
		if ids[i], err = leaseRef(rn.GetResource(), rn.GetLeaseId()); err != nil {
			// Named as Renew names it, as the shard names what it refuses:
			// the outcome's place says which renewal it is.
			out[i] = s.renewed(ctx, req.Peer(), rn, nil, err)
			continue
		}
		if err := authorize(ctx, s.r, auth.Lock, "", rn.GetResource()); err != nil {
			denied.add(ctx, s.r, req.Peer(), "RenewBatch.renewal", rn.GetResource(), time.Time{}, err) // denied alone
			out[i] = renewOutcome(nil, err)
			continue
		}
		rg, err := m.ShardFor(rn.GetResource())
		if err != nil {
			out[i] = s.renewed(ctx, req.Peer(), rn, nil, err)
			continue
		}
		groups[rg.GetShardId()] = append(groups[rg.GetShardId()], i)
	}
	serveGroups(s.r, groups, out, func(err error) *wardenv1.RenewOutcome { return renewOutcome(nil, err) },
		func(shardID uint64, idx []int) { s.renewGroup(ctx, req, ids, shardID, idx, out) })
	return connect.NewResponse(&wardenv1.RenewBatchResponse{Outcomes: out}), nil
}

// renewGroup renews req's renewals at idx, which the map places in
// shardID, and fills their outcomes in out; ids are the renewals' decoded
// lease ids.
func (s *LockServer) renewGroup(ctx context.Context, req *connect.Request[wardenv1.RenewBatchRequest], ids [][]byte, shardID uint64, idx []int, out []*wardenv1.RenewOutcome) {
	renewals := req.Msg.GetRenewals()
	sub := &wardenv1.RenewBatchRequest{Renewals: make([]*wardenv1.RenewRequest, len(idx))}
	for j, i := range idx {
		sub.Renewals[j] = renewals[i]
	}
	fr := sameHopReq(sub, req.Header())
	resp, where, err := forward(ctx, s.r, fr, sub.Renewals[0].GetResource(), func(p *peer) peerCall[wardenv1.RenewBatchRequest, wardenv1.RenewBatchResponse] {
		return p.Locks.RenewBatch
	})
	ok := where != servedHere
	if ok && connect.CodeOf(err) == connect.CodeUnimplemented {
		s.renewEach(ctx, req, idx, out) // the leader's node predates RenewBatch
		return
	}
	if ok {
		// The node that served them audited and counted them.
		spreadForwarded(idx, out, err, func() []*wardenv1.RenewOutcome { return resp.Msg.GetOutcomes() },
			func(err error) *wardenv1.RenewOutcome { return renewOutcome(nil, err) })
		return
	}
	cmd := &shardv1.RenewBatchCmd{Items: make([]*shardv1.RenewCmd, len(idx))}
	for j, i := range idx {
		cmd.Items[j] = &shardv1.RenewCmd{Resource: renewals[i].GetResource(), LeaseId: ids[i]}
	}
	env := &shardv1.Envelope{Command: &shardv1.Envelope_RenewBatch{RenewBatch: cmd}}
	if !s.r.Applies(shardID, shard.VersionOf(env)) {
		s.renewEach(ctx, req, idx, out) // a replica's node predates RenewBatchCmd
		return
	}
	res, err := s.r.Propose(ctx, sub.Renewals[0].GetResource(), env)
	if err == nil && len(res.GetItems()) != len(idx) {
		err = fmt.Errorf("router: shard answered %d results for %d renewals", len(res.GetItems()), len(idx))
	}
	for j, i := range idx {
		rn := sub.Renewals[j]
		switch {
		case err != nil:
			out[i] = s.renewed(ctx, req.Peer(), rn, nil, err)
		case router.MovedOn(res.Items[j].GetCode()):
			// The key left this shard after the map was read: Renew
			// finds its new shard (and audits and counts it).
			out[i] = s.renewOne(ctx, req, rn)
		case res.Items[j].GetCode() != shardv1.Code_CODE_OK:
			out[i] = s.renewed(ctx, req.Peer(), rn, nil, &router.ResultError{Res: res.Items[j]})
		default:
			out[i] = s.renewed(ctx, req.Peer(), rn, res.Items[j], nil)
		}
	}
}

// renewOne renews one of req's renewals through Renew's path (its route,
// then its handler), which finds its shard and leader, and audits and
// counts it unless another node served it.
func (s *LockServer) renewOne(ctx context.Context, req *connect.Request[wardenv1.RenewBatchRequest], rn *wardenv1.RenewRequest) *wardenv1.RenewOutcome {
	start := time.Now()
	r, where, err := renewRoute.run(ctx, s.r, sameHopReq(rn, req.Header()), s.Renew)
	if where != servedThere {
		record(ctx, s.r, req.Peer(), "Renew", start, renewEntry("Renew", rn), err)
	}
	return renewOutcome(r, err)
}

// renewEach renews req's renewals at idx one by one, concurrently,
// through Renew's path.
func (s *LockServer) renewEach(ctx context.Context, req *connect.Request[wardenv1.RenewBatchRequest], idx []int, out []*wardenv1.RenewOutcome) {
	var wg sync.WaitGroup
	for _, i := range idx {
		goServe(s.r.Config().Logger, &wg, func() { out[i] = s.renewOne(ctx, req, req.Msg.GetRenewals()[i]) }, func(err error) { out[i] = renewOutcome(nil, err) })
	}
	wg.Wait()
}

// renewed audits and counts one renewal of a RenewBatch served here
// (method RenewBatch.renewal) and returns its outcome: res is the shard's
// result when err is nil.
func (s *LockServer) renewed(ctx context.Context, p connect.Peer, rn *wardenv1.RenewRequest, res *shardv1.Result, err error) *wardenv1.RenewOutcome {
	record(ctx, s.r, p, "RenewBatch.renewal", time.Time{}, renewEntry("RenewBatch", rn), err)
	if err != nil {
		return renewOutcome(nil, err)
	}
	return &wardenv1.RenewOutcome{ExpiresAt: timestamp(res.GetLease().GetExpiresAtUnixNano())}
}

// renewOutcome is a renewal's outcome from Renew's answer or error.
func renewOutcome(resp *connect.Response[wardenv1.RenewResponse], err error) *wardenv1.RenewOutcome {
	if err == nil {
		return &wardenv1.RenewOutcome{ExpiresAt: resp.Msg.GetExpiresAt()}
	}
	ce := asConnect(err)
	return &wardenv1.RenewOutcome{Code: ce.Code().String(), Message: ce.Message()}
}
