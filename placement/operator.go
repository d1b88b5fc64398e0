package placement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/shard"
)

// ShardClient proposes to and reads from the leader of any data shard,
// and changes its membership, wherever its replicas run. The caller sets
// the envelope's generation; the client stamps version, shard id and the
// leader's time.
type ShardClient interface {
	Propose(ctx context.Context, shardID uint64, env *shardv1.Envelope) (*shardv1.Result, error)
	Read(ctx context.Context, shardID uint64, q *shardv1.Query) (*shardv1.QueryResult, error)
	// Membership reads (MEMBERSHIP_CHANGE_NONE) or changes the shard's
	// Raft membership and returns it after the change.
	// A change carries the config_change_id of the membership it was
	// decided against; a shard with ordered_config_change refuses it if
	// the membership changed since (Aborted).
	Membership(ctx context.Context, req *placementv1.MembershipRequest) (*placementv1.MembershipResponse, error)
	// AppliedIndex returns how far node nodeID's replica of the shard has
	// applied the log.
	AppliedIndex(ctx context.Context, shardID, nodeID uint64) (uint64, error)
}

// Allocator hands out fencing-token epochs from windows it reserves in
// the placement group, EpochWindow at a time, so most allocations cost no
// Raft entry. A window is reserved by compare-and-set on the epoch limit,
// so no two allocators (an old and a new placement leader) ever share an
// epoch, and one allocator's epochs strictly increase across restarts.
// Assigning an epoch to a shard (BeginSplitCmd) also requires it to be
// above every epoch assigned before.
type Allocator struct {
	meta MetaClient
	mu   sync.Mutex
	next uint64
	end  uint64 // the window is [next, end)
}

// NewAllocator returns an allocator with no window.
func NewAllocator(meta MetaClient) *Allocator { return &Allocator{meta: meta} }

// Next returns an epoch never returned before by any allocator.
func (a *Allocator) Next(ctx context.Context) (uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.next == a.end {
		st, err := a.meta.Read(ctx)
		if err != nil {
			return 0, err
		}
		res, err := a.meta.Propose(ctx, &placementv1.Command{Command: &placementv1.Command_ReserveEpochs{ReserveEpochs: &placementv1.ReserveEpochsCmd{
			ExpectedLimit: st.GetEpochLimit(), Count: EpochWindow}}})
		if err != nil {
			return 0, err
		}
		a.next, a.end = res.GetEpochStart(), res.GetEpochStart()+EpochWindow
	}
	e := a.next
	a.next++
	return e, nil
}

// Discard drops the rest of the window (another allocator assigned a
// later epoch, so this window's epochs can no longer be assigned).
func (a *Allocator) Discard() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.next = a.end
}

// Operators runs placement operators: it begins them and drives each
// persisted step to the end. Any node may drive an operator, even two at
// once (a deposed placement leader that has not noticed yet): every step
// is idempotent in the shards, every recorded step is a compare-and-set
// in the placement group, and a rollback is recorded before the source
// is unfenced.
type Operators struct {
	Meta   MetaClient
	Shards ShardClient
	Alloc  *Allocator
	// TargetWait bounds how long a split waits for its new shard to elect
	// a leader, and a move for its new replica to catch up, before it
	// rolls back (default 30 s).
	TargetWait time.Duration
	Logger     *slog.Logger
	// ExportPage is how many records one import command carries (default 256).
	ExportPage uint32
	// OnFenced, if set, is called with how long a split kept its moving
	// range fenced, from the fence to the map commit.
	OnFenced func(time.Duration)
	// Live, if set, says whether a node answered recently; new replicas
	// go to live nodes.
	Live func(nodeID uint64) bool
	// Leads, if set, says whether this process leads the placement group:
	// Run drives an operator only while it does, and otherwise follows it
	// (the leader's loop drives it).
	Leads func() bool
	// Cluster reaches the placement group's membership and the shards'
	// leaderships, for the jobs (node removals, rebalances).
	Cluster Cluster

	mu     sync.Mutex
	active map[uint64]bool // operators a goroutine of this process drives
	copied map[uint64]Copied
}

// Copied is how much of its range a split driven by this process copied
// into its new shard so far.
type Copied struct {
	Records, Bytes uint64
}

// Copied returns how much split id has copied, as far as this process
// drove it (zero if it did not).
func (o *Operators) Copied(id uint64) Copied {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.copied[id]
}

// setCopied records split id's copy progress; a zero c forgets it.
func (o *Operators) setCopied(id uint64, c Copied) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if c == (Copied{}) {
		delete(o.copied, id)
		return
	}
	if o.copied == nil {
		o.copied = map[uint64]Copied{}
	}
	o.copied[id] = c
}

// claim marks operator id as driven by the caller; false if it already is.
func (o *Operators) claim(id uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.active[id] {
		return false
	}
	if o.active == nil {
		o.active = map[uint64]bool{}
	}
	o.active[id] = true
	return true
}

func (o *Operators) unclaim(id uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.active, id)
}

// Run drives operator id until it ends or ctx does, retrying failed steps,
// and returns the operator as it was last recorded before it ended.
func (o *Operators) Run(ctx context.Context, id uint64) (*placementv1.Operator, error) {
	var last *placementv1.Operator
	for {
		st, err := o.Meta.Read(ctx)
		if err == nil {
			op, running := FindOperator(st, id, "")
			if op != nil && !running {
				return op, nil // as it ended (kept from version 6)
			}
			if op == nil {
				return last, nil
			}
			last = op
			if o.Leads == nil || o.Leads() {
				err = o.drive(ctx, op)
			}
		}
		if err != nil {
			o.logger().Warn("placement operator step failed; retrying", "operator", id, "err", err)
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("operator %d: %w (last error: %v)", id, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// BeginSplit records a split of shard source at hash splitAt (0: the
// middle of its range) into a new shard with a fresh epoch and replicas in
// distinct zones; Drive carries it out.
//
// A requestID the split was begun with before returns that split
// (running or ended) instead: a retry after an unknown outcome does not
// split twice.
func (o *Operators) BeginSplit(ctx context.Context, source, splitAt uint64, requestID string) (*placementv1.Operator, error) {
	st, err := o.Meta.Read(ctx)
	if err != nil {
		return nil, err
	}
	src := shardByID(st, source)
	if src == nil {
		return nil, &RefusedError{fmt.Sprintf("shard_id: shard %d does not exist", source)}
	}
	nodes := pickNodes(st, len(src.GetReplicas()), o.Live)
	for attempt := 0; ; attempt++ {
		epoch, err := o.Alloc.Next(ctx)
		if err != nil {
			return nil, err
		}
		res, err := o.Meta.Propose(ctx, &placementv1.Command{Command: &placementv1.Command_BeginSplit{BeginSplit: &placementv1.BeginSplitCmd{
			Source: source, SplitAt: splitAt, Epoch: epoch, Nodes: nodes, RequestId: requestID}}})
		var refused *RefusedError
		if attempt == 0 && errors.As(err, &refused) && st.GetLastEpoch() < st.GetEpochLimit() {
			o.Alloc.Discard() // another allocator assigned a later epoch; take a new window
			continue
		}
		if err != nil {
			return nil, err
		}
		return res.GetOperator(), nil
	}
}

// pickNodes chooses n nodes in distinct zones, the least loaded (fewest
// replicas) in each zone, zones with less load first, among the live
// nodes if live is set, never one being removed.
func pickNodes(st *placementv1.State, n int, live func(uint64) bool) []uint64 {
	load := ReplicaLoad(st)
	best := map[string]*placementv1.Node{}
	for _, nd := range st.GetNodes() {
		if (live != nil && !live(nd.GetId())) || removing(st, nd.GetId()) != nil {
			continue
		}
		if b := best[nd.GetZone()]; b == nil || load[nd.GetId()] < load[b.GetId()] {
			best[nd.GetZone()] = nd
		}
	}
	// Too few zones with a live node (one missed its last clock reading,
	// as a node just started may): a zone's node that did not answer
	// takes the place before a replica is left out, since its agent
	// starts the replica when it serves, and a shard a replica short
	// stops with its next node down.
	if len(best) < n && live != nil {
		for _, nd := range st.GetNodes() {
			if removing(st, nd.GetId()) != nil || best[nd.GetZone()] != nil && live(best[nd.GetZone()].GetId()) {
				continue
			}
			if b := best[nd.GetZone()]; b == nil || load[nd.GetId()] < load[b.GetId()] {
				best[nd.GetZone()] = nd
			}
		}
	}
	var picks []*placementv1.Node
	for _, nd := range best {
		picks = append(picks, nd)
	}
	slices.SortFunc(picks, func(a, b *placementv1.Node) int {
		if d := load[a.GetId()] - load[b.GetId()]; d != 0 {
			return d
		}
		return int(a.GetId()) - int(b.GetId())
	})
	var ids []uint64
	for _, nd := range picks[:min(n, len(picks))] {
		ids = append(ids, nd.GetId())
	}
	return ids
}

// Drive carries every operator in the placement state to its end.
func (o *Operators) Drive(ctx context.Context) error {
	st, err := o.Meta.Read(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, op := range st.GetOperators() {
		if err := o.drive(ctx, op); err != nil {
			errs = append(errs, fmt.Errorf("operator %d: %w", op.GetId(), err))
		}
	}
	return errors.Join(errs...)
}

func (o *Operators) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.Default()
	}
	return o.Logger
}

// drive carries op from its recorded step to the end (or back), unless
// another goroutine of this process is at it.
func (o *Operators) drive(ctx context.Context, op *placementv1.Operator) error {
	if !o.claim(op.GetId()) {
		return nil
	}
	defer o.unclaim(op.GetId())
	switch {
	case isJob(op):
		if err := o.driveJob(ctx, op.GetId()); !errors.Is(err, errHandedOff) {
			return err
		}
		return nil
	case op.GetMove() != nil:
		return o.driveMove(ctx, op.GetId())
	}
	return o.driveSplit(ctx, op.GetId())
}

// advance records that split op reached step to.
func (o *Operators) advance(ctx context.Context, op uint64, to placementv1.SplitStep) error {
	_, err := o.Meta.Propose(ctx, &placementv1.Command{Command: &placementv1.Command_AdvanceSplit{AdvanceSplit: &placementv1.AdvanceSplitCmd{OperatorId: op, To: to}}})
	return err
}

// propose sends a range command to a shard and turns a refusal into an error.
func (o *Operators) propose(ctx context.Context, shardID, generation uint64, env *shardv1.Envelope) (*shardv1.Result, error) {
	env.Generation = generation
	res, err := o.Shards.Propose(ctx, shardID, env)
	if err != nil {
		return nil, err
	}
	if res.GetCode() != shardv1.Code_CODE_OK {
		return res, fmt.Errorf("shard %d refused %T: %v %s", shardID, env.GetCommand(), res.GetCode(), res.GetReason())
	}
	return res, nil
}

// driveSplit carries split op from its recorded step to the end (or back).
func (o *Operators) driveSplit(ctx context.Context, opID uint64) error {
	var fencedAt time.Time
	for {
		st, err := o.Meta.Read(ctx)
		if err != nil {
			return err
		}
		op, _ := operatorByID(st, opID)
		s := op.GetSplit()
		if s == nil {
			return nil // done (by us or another driver)
		}
		src := rangeOf(st, s.GetSource())
		if src < 0 {
			return fmt.Errorf("source shard %d owns no range", s.GetSource())
		}
		r := st.GetRanges()[src]
		log := o.logger().With("operator", opID, "source", s.GetSource(), "target", s.GetTarget(), "split_at", fmt.Sprintf("%#x", s.GetSplitAt()))
		if s.GetRollingBack() {
			// The rollback is recorded, so no driver can commit the split
			// any more: the source may take writes to the range again.
			if _, err := o.propose(ctx, s.GetSource(), st.GetGeneration(), &shardv1.Envelope{Command: &shardv1.Envelope_UnfenceRange{UnfenceRange: &shardv1.UnfenceRangeCmd{OperatorId: opID}}}); err != nil {
				return err
			}
			log.Warn("split rolled back")
			return o.end(ctx, opID, false)
		}
		switch s.GetStep() {
		case placementv1.SplitStep_SPLIT_STEP_PREPARED:
			if err := o.awaitLeader(ctx, s.GetTarget()); err != nil {
				if ctx.Err() != nil {
					return err // the caller left; the next driver waits again
				}
				log.Warn("split: the new shard elected no leader; rolling back", "err", err)
				return o.rollback(ctx, opID)
			}
			fence := &shardv1.RangeFence{OperatorId: opID, Start: s.GetSplitAt(), End: r.GetEnd()}
			if res, err := o.propose(ctx, s.GetSource(), st.GetGeneration(), &shardv1.Envelope{Command: &shardv1.Envelope_FenceRange{FenceRange: &shardv1.FenceRangeCmd{Fence: fence}}}); err != nil {
				if res != nil { // refused, not lost: it will not pass
					log.Warn("split: the source refused the fence; rolling back", "err", err)
					return o.rollback(ctx, opID)
				}
				return err
			}
			fencedAt = time.Now()
			if err := o.advance(ctx, opID, placementv1.SplitStep_SPLIT_STEP_FENCED); err != nil {
				return err
			}
		case placementv1.SplitStep_SPLIT_STEP_FENCED:
			if err := o.copyRange(ctx, opID, s, r); err != nil {
				return err
			}
			if err := o.advance(ctx, opID, placementv1.SplitStep_SPLIT_STEP_ACTIVATED); err != nil {
				return err
			}
		case placementv1.SplitStep_SPLIT_STEP_ACTIVATED:
			if err := o.advance(ctx, opID, placementv1.SplitStep_SPLIT_STEP_COMMITTED); err != nil {
				return err
			}
			if !fencedAt.IsZero() && o.OnFenced != nil {
				o.OnFenced(time.Since(fencedAt))
			}
			log.Info("split committed", "generation", s.GetGeneration(), "fenced_for", time.Since(fencedAt))
		case placementv1.SplitStep_SPLIT_STEP_COMMITTED:
			// The map already shows the source's kept range.
			if _, err := o.propose(ctx, s.GetSource(), s.GetGeneration(), &shardv1.Envelope{Command: &shardv1.Envelope_ReleaseRange{ReleaseRange: &shardv1.ReleaseRangeCmd{OperatorId: opID, Keep: r}}}); err != nil {
				return err
			}
			return o.end(ctx, opID, false)
		default:
			return fmt.Errorf("unknown split step %v", s.GetStep())
		}
	}
}

// rollback records that operator opID is abandoned, with a context of its
// own: the step's may be spent by the wait that decided it.
func (o *Operators) rollback(ctx context.Context, opID uint64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return o.end(ctx, opID, true)
}

func (o *Operators) end(ctx context.Context, opID uint64, rollback bool) error {
	_, err := o.Meta.Propose(ctx, &placementv1.Command{Command: &placementv1.Command_EndOperator{EndOperator: &placementv1.EndOperatorCmd{OperatorId: opID, Rollback: rollback}}})
	return err
}

// awaitLeader waits until shard id answers a linearizable read.
func (o *Operators) awaitLeader(ctx context.Context, id uint64) error {
	wait := o.TargetWait
	if wait == 0 {
		wait = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		_, err := o.Shards.Read(ctx, id, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}})
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// copyRange copies the fenced records of the source's range r from the
// split point on into the target, and activates the target.
func (o *Operators) copyRange(ctx context.Context, opID uint64, s *placementv1.SplitOp, r *shardv1.RangeDescriptor) error {
	page := o.ExportPage
	if page == 0 {
		page = 256
	}
	var after []byte
	var copied Copied // from the start: a resumed copy imports again (idempotent)
	defer o.setCopied(opID, Copied{})
	for {
		q, err := o.Shards.Read(ctx, s.GetSource(), &shardv1.Query{Query: &shardv1.Query_Export{Export: &shardv1.ExportQuery{
			Start: s.GetSplitAt(), End: r.GetEnd(), After: after, Limit: page}}})
		if err != nil {
			return err
		}
		if f := q.GetMeta().GetFence(); f.GetOperatorId() != opID {
			return fmt.Errorf("source shard %d is not fenced by this split (fence %v)", s.GetSource(), f)
		}
		if recs := q.GetRecords(); shard.RecordCount(recs) > 0 {
			if _, err := o.propose(ctx, s.GetTarget(), s.GetGeneration(), &shardv1.Envelope{Command: &shardv1.Envelope_ImportRange{ImportRange: &shardv1.ImportRangeCmd{
				OperatorId: opID, Records: recs}}}); err != nil {
				return err
			}
			copied.Records += uint64(shard.RecordCount(recs))
			copied.Bytes += uint64(proto.Size(recs))
			o.setCopied(opID, copied)
		}
		if after = q.GetNext(); len(after) == 0 {
			meta := q.GetMeta()
			_, err := o.propose(ctx, s.GetTarget(), s.GetGeneration(), &shardv1.Envelope{Command: &shardv1.Envelope_ActivateRange{ActivateRange: &shardv1.ActivateRangeCmd{
				OperatorId: opID,
				Range:      &shardv1.RangeDescriptor{ShardId: s.GetTarget(), Start: s.GetSplitAt(), End: r.GetEnd(), Generation: s.GetGeneration()},
				Epoch:      s.GetEpoch(), Config: meta.GetConfig(), SourceLastNowUnixNano: meta.GetLastNowUnixNano()}}})
			return err
		}
	}
}

// BeginMove records a move of shardID's replica on node from to node to;
// Drive carries it out.
//
// A move of a live replica is refused (RefusedError) while another voter
// of the shard is down (o.Live): the move adds a fourth voter before it
// removes the third, so until it ends every live node would have to stay
// up, and the leader removing its own replica would leave the others
// unable to elect one. Moving the down voter's replica first repairs the
// shard (driveMove removes a down source before it promotes the new
// replica). A request id the move was begun with before skips the check.
func (o *Operators) BeginMove(ctx context.Context, shardID, from, to uint64, requestID string) (*placementv1.Operator, error) {
	if err := o.voterDown(ctx, shardID, from, requestID); err != nil {
		return nil, err
	}
	res, err := o.Meta.Propose(ctx, &placementv1.Command{Command: &placementv1.Command_BeginMove{BeginMove: &placementv1.BeginMoveCmd{
		Shard: shardID, FromNode: from, ToNode: to, RequestId: requestID}}})
	if err != nil {
		return nil, err
	}
	return res.GetOperator(), nil
}

// voterDown refuses (RefusedError) a move of shardID's live replica on
// node from while another voter of the shard does not answer (o.Live),
// unless requestID began an operator already (BeginMove).
func (o *Operators) voterDown(ctx context.Context, shardID, from uint64, requestID string) error {
	if o.Live == nil || from == 0 || !o.Live(from) {
		return nil
	}
	st, err := o.Meta.Read(ctx)
	if err != nil {
		return err
	}
	if op, _ := FindOperator(st, 0, requestID); op != nil {
		return nil
	}
	for _, r := range NewMap(st).Voters(shardID) {
		if id := r.GetNodeId(); id != from && !o.Live(id) {
			return &RefusedError{fmt.Sprintf("shard %d's voter on node %d does not answer: moving node %d's replica now would need every other node up until the move ends; move node %d's replica first, or wait until it answers",
				shardID, id, from, id)}
		}
	}
	return nil
}

func (o *Operators) advanceMove(ctx context.Context, op uint64, to placementv1.MoveStep) error {
	_, err := o.Meta.Propose(ctx, &placementv1.Command{Command: &placementv1.Command_AdvanceMove{AdvanceMove: &placementv1.AdvanceMoveCmd{OperatorId: op, To: to}}})
	return err
}

// IsMember reports whether replica is a voting (voting) or a voting or
// non-voting (member) member of membership m.
func IsMember(m *placementv1.MembershipResponse, replica uint64) (voting, member bool) {
	_, voting = m.GetVoting()[replica]
	_, nonVoting := m.GetNonVoting()[replica]
	return voting, voting || nonVoting
}

// driveMove carries move op from its recorded step to the end (or back):
// one Raft membership change per step, each checked against the current
// membership first, so a resumed step is not repeated.
func (o *Operators) driveMove(ctx context.Context, opID uint64) error {
	for {
		st, err := o.Meta.Read(ctx)
		if err != nil {
			return err
		}
		op, _ := operatorByID(st, opID)
		m := op.GetMove()
		if m == nil {
			return nil
		}
		p := &movePass{opID: opID, m: m, to: nodeByID(st, m.GetToNode()),
			log: o.logger().With("operator", opID, "shard", m.GetShard(), "from_node", m.GetFromNode(), "to_node", m.GetToNode())}
		p.mem, err = o.Shards.Membership(ctx, &placementv1.MembershipRequest{ShardId: m.GetShard(), Change: placementv1.MembershipChange_MEMBERSHIP_CHANGE_NONE})
		if err != nil {
			return err
		}
		if m.GetRollingBack() {
			return o.rollBackMove(ctx, p)
		}
		switch m.GetStep() {
		case placementv1.MoveStep_MOVE_STEP_PLANNED:
			err = o.addNewReplica(ctx, p)
		case placementv1.MoveStep_MOVE_STEP_ADDED:
			var ended bool
			if ended, err = o.promoteNewReplica(ctx, p); ended {
				return err
			}
		case placementv1.MoveStep_MOVE_STEP_PROMOTED:
			err = o.removeSource(ctx, p)
		case placementv1.MoveStep_MOVE_STEP_REMOVED:
			return o.end(ctx, opID, false)
		default:
			return fmt.Errorf("unknown move step %v", m.GetStep())
		}
		if err != nil {
			return err
		}
	}
}

// movePass is what one pass of driveMove decides on: the move as
// recorded and the shard's membership read after it.
type movePass struct {
	opID uint64
	m    *placementv1.MoveOp
	to   *placementv1.Node // the new replica's node (nil for a dropped replica)
	mem  *placementv1.MembershipResponse
	log  *slog.Logger
}

// changeMember makes one change decided against p.mem: compare-and-set
// on its config change id, so a change another driver (an old placement
// leader) made since is never overwritten by this one.
func (o *Operators) changeMember(ctx context.Context, p *movePass, c placementv1.MembershipChange, replica uint64, addr string) error {
	_, err := o.Shards.Membership(ctx, &placementv1.MembershipRequest{
		ShardId: p.m.GetShard(), Change: c, ReplicaId: replica, Address: addr, ConfigChangeId: p.mem.GetConfigChangeId()})
	return err
}

// rollBackMove removes the new replica, if the group has it, and ends
// the move. The rollback is recorded, so no driver can advance the move
// any more (advanceMove refuses it); ending it drops the replica from
// the map.
func (o *Operators) rollBackMove(ctx context.Context, p *movePass) error {
	if _, member := IsMember(p.mem, p.m.GetToReplica()); member && p.m.GetToReplica() != 0 {
		if err := o.changeMember(ctx, p, placementv1.MembershipChange_MEMBERSHIP_CHANGE_REMOVE, p.m.GetToReplica(), ""); err != nil {
			return err
		}
	}
	p.log.Warn("replica move rolled back")
	return o.end(ctx, p.opID, false)
}

// addNewReplica adds the new replica as non-voting, unless the group
// has it already, and records MOVE_STEP_ADDED.
func (o *Operators) addNewReplica(ctx context.Context, p *movePass) error {
	// A dropped replica (no to) has nothing to add or promote.
	if _, member := IsMember(p.mem, p.m.GetToReplica()); !member && p.m.GetToReplica() != 0 {
		if err := o.changeMember(ctx, p, placementv1.MembershipChange_MEMBERSHIP_CHANGE_ADD_NON_VOTING, p.m.GetToReplica(), p.to.GetRaftAddr()); err != nil {
			return err
		}
	}
	return o.advanceMove(ctx, p.opID, placementv1.MoveStep_MOVE_STEP_ADDED)
}

// promoteNewReplica waits for the new replica to catch up and makes it a
// voter, unless it is one already, and records MOVE_STEP_PROMOTED. A
// source that is down is removed first, and nothing recorded: the next
// pass decides on the membership without it. ended reports that the move
// ended here (rolled back, or the rollback failed with err).
func (o *Operators) promoteNewReplica(ctx context.Context, p *movePass) (ended bool, err error) {
	m := p.m
	// A source that is down leaves before the new replica votes:
	// promoted first, the new replica would make a fourth voter
	// with one down, and the shard would stall should it fail
	// before the source is removed. Once the source is out of the
	// group the move goes on without waiting (a driver before us
	// waited), and is never rolled back: the map must not keep a
	// replica the group removed.
	_, fromMember := IsMember(p.mem, m.GetFromReplica())
	sourceOut := m.GetFromReplica() != 0 && !fromMember
	if voting, _ := IsMember(p.mem, m.GetToReplica()); !voting && m.GetToReplica() != 0 {
		if !sourceOut {
			if err := o.awaitCatchUp(ctx, m.GetShard(), m.GetToNode()); err != nil {
				if ctx.Err() != nil {
					return false, err
				}
				p.log.Warn("replica move: the new replica did not catch up; rolling back", "err", err)
				return true, o.rollback(ctx, p.opID)
			}
		}
		if fromMember && m.GetFromReplica() != 0 && o.Live != nil && !o.Live(m.GetFromNode()) {
			if err := o.changeMember(ctx, p, placementv1.MembershipChange_MEMBERSHIP_CHANGE_REMOVE, m.GetFromReplica(), ""); err != nil {
				return false, err
			}
			p.log.Info("replica move: the source does not answer; removed it before promoting the new replica", "replica", m.GetFromReplica())
			return false, nil
		}
		if err := o.changeMember(ctx, p, placementv1.MembershipChange_MEMBERSHIP_CHANGE_ADD_VOTING, m.GetToReplica(), p.to.GetRaftAddr()); err != nil {
			return false, err
		}
	}
	return false, o.advanceMove(ctx, p.opID, placementv1.MoveStep_MOVE_STEP_PROMOTED)
}

// removeSource removes the source replica, if the group still has it,
// handing the lead off it first, and records MOVE_STEP_REMOVED.
func (o *Operators) removeSource(ctx context.Context, p *movePass) error {
	m := p.m
	// An added replica (no from) has nothing to remove.
	if _, member := IsMember(p.mem, m.GetFromReplica()); member && m.GetFromReplica() != 0 {
		o.handOffLead(ctx, p)
		if err := o.changeMember(ctx, p, placementv1.MembershipChange_MEMBERSHIP_CHANGE_REMOVE, m.GetFromReplica(), ""); err != nil {
			return err
		}
	}
	if err := o.advanceMove(ctx, p.opID, placementv1.MoveStep_MOVE_STEP_REMOVED); err != nil {
		return err
	}
	switch moveKind(m) {
	case placementv1.JobStepKind_JOB_STEP_KIND_ADD_REPLICA:
		p.log.Info("replica added", "replica", m.GetToReplica())
	case placementv1.JobStepKind_JOB_STEP_KIND_DROP_REPLICA:
		p.log.Info("replica dropped", "replica", m.GetFromReplica())
	default:
		p.log.Info("replica moved", "replica", m.GetToReplica())
	}
	return nil
}

// handOffLead hands the shard's lead to the new replica's node if the
// source's node holds it. The leader does not remove its own replica: it
// would close at once, before telling the others the removal committed,
// and they, still counting it a voter, could not elect a leader with one
// other voter down. A failed hand-off is logged, and the removal goes
// ahead as before.
func (o *Operators) handOffLead(ctx context.Context, p *movePass) {
	if o.Cluster == nil || p.m.GetToNode() == 0 {
		return
	}
	// Bounded: a stopped node asked for a leader or the transfer may
	// answer nothing.
	hand, cancel := context.WithTimeout(ctx, handOffWait)
	defer cancel()
	if o.Cluster.Leaders(hand)[p.m.GetShard()] == p.m.GetFromNode() {
		if err := o.Cluster.TransferLeader(hand, p.m.GetShard(), p.m.GetToNode()); err != nil {
			p.log.Warn("replica move: could not hand the lead to the new replica; removing the leader's replica", "err", err)
		}
	}
}

// handOffWait bounds a move's hand-off of the lead before it removes the
// leader's replica.
const handOffWait = 10 * time.Second

// targetDownWait is how long a move's new replica's node may go without
// answering (o.Live) while it catches up before the move rolls back.
const targetDownWait = 3 * time.Second

// awaitCatchUp waits until node's replica of shardID has applied what the
// leader had applied when the wait began. It fails after TargetWait, or
// once node has not answered (o.Live) for targetDownWait.
func (o *Operators) awaitCatchUp(ctx context.Context, shardID, node uint64) error {
	wait := o.TargetWait
	if wait == 0 {
		wait = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var target uint64 // the leader's applied index when first read
	read := false
	var downSince time.Time // since when node has not answered (zero: it does)
	for {
		switch {
		case o.Live == nil || o.Live(node):
			downSince = time.Time{}
		case downSince.IsZero():
			downSince = time.Now()
		case time.Since(downSince) > targetDownWait:
			return fmt.Errorf("node %d has not answered for %v", node, targetDownWait)
		}
		var idx uint64
		var err error
		if !read {
			var q *shardv1.QueryResult
			if q, err = o.Shards.Read(ctx, shardID, &shardv1.Query{Query: &shardv1.Query_Meta{Meta: &shardv1.MetaQuery{}}}); err == nil {
				target, read = q.GetAppliedIndex(), true
			}
		}
		if read {
			// Each call is bounded: a stopped node may take the
			// connection and answer nothing.
			call, cancel := context.WithTimeout(ctx, time.Second)
			idx, err = o.Shards.AppliedIndex(call, shardID, node)
			cancel()
			if err == nil && idx >= target {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (applied %d of %d; last error: %v)", ctx.Err(), idx, target, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
