package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
)

func (g *globals) admin() wardenv1connect.AdminServiceClient {
	return wardenv1connect.NewAdminServiceClient(g.http, g.base)
}

type nodesCmd struct{}

// Run sends AdminService.ListNodes.
func (*nodesCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.admin().ListNodes(ctx, connect.NewRequest(&wardenv1.ListNodesRequest{}))
	if err != nil {
		return fmt.Errorf("nodes: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		fmt.Fprintf(w, "%-4s %-8s %-5s %-10s %-10s %-22s %-22s %s\n", "ID", "ZONE", "STATE", "HEARD", "PLACEMENT", "RAFT", "LISTEN", "VERSION")
		for _, n := range resp.Msg.GetNodes() {
			role := placementRole(n.GetPlacement())
			if n.GetId() == resp.Msg.GetPlacementLeaderId() {
				role = "leader"
			}
			state, heard := "down", "never"
			if n.GetUp() {
				state = "up"
			}
			if n.GetLastHeard() != nil {
				heard = time.Since(n.GetLastHeard().AsTime()).Round(time.Second).String() + " ago"
			}
			fmt.Fprintf(w, "%-4d %-8s %-5s %-10s %-10s %-22s %-22s %s\n", n.GetId(), n.GetZone(), state, heard, role, n.GetRaftAddr(), n.GetListenAddr(), n.GetVersion())
		}
	})
}

// placementRole is how `warden admin nodes` shows a node's part in the
// placement group ("?" when the answering node could not read it; the
// voter that leads shows as "leader").
func placementRole(r wardenv1.PlacementRole) string {
	switch r {
	case wardenv1.PlacementRole_PLACEMENT_ROLE_NONE:
		return "-"
	case wardenv1.PlacementRole_PLACEMENT_ROLE_VOTER:
		return "voter"
	case wardenv1.PlacementRole_PLACEMENT_ROLE_NON_VOTING:
		return "non-voting"
	}
	return "?"
}

type shardsCmd struct{}

// Run sends AdminService.ListShards.
func (*shardsCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.admin().ListShards(ctx, connect.NewRequest(&wardenv1.ListShardsRequest{}))
	if err != nil {
		return fmt.Errorf("shards: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		fmt.Fprintf(w, "placement generation %d, epoch limit %d\n", resp.Msg.GetGeneration(), resp.Msg.GetEpochLimit())
		fmt.Fprintf(w, "%-5s %-7s %-40s %-6s %-7s %-6s %-7s %s\n", "SHARD", "STATE", "HASH RANGE", "EPOCH", "LEADER", "LOCKS", "WAITERS", "REPLICAS (replica@node/zone:state)")
		for _, s := range resp.Msg.GetShards() {
			rng := "-"
			if s.GetState() == "active" {
				end := "2^64"
				if s.GetRangeEnd() != 0 {
					end = fmt.Sprintf("%#016x", s.GetRangeEnd())
				}
				rng = fmt.Sprintf("[%#016x, %s)", s.GetRangeStart(), end)
			}
			var reps []string
			for _, r := range s.GetReplicas() {
				reps = append(reps, fmt.Sprintf("%d@%d/%s:%s", r.GetReplicaId(), r.GetNodeId(), r.GetZone(), r.GetState()))
			}
			fmt.Fprintf(w, "%-5d %-7s %-40s %-6d %-7s %-6d %-7d %s\n", s.GetId(), s.GetState(), rng, s.GetEpoch(),
				leader(s.GetLeaderNodeId()), s.GetHeldLocks(), s.GetQueuedWaiters(), strings.Join(reps, " "))
		}
	})
}

func leader(node uint64) string {
	if node == 0 {
		return "none"
	}
	return "node " + strconv.FormatUint(node, 10)
}

type splitCmd struct {
	ShardID uint64 `arg:"" name:"shard-id" help:"Shard to split."`
	At      string `help:"First hash of the new shard's range (decimal or 0x hex); default the middle of the range."`
	opFlags
}

// opFlags are the flags of a command that begins an operation.
type opFlags struct {
	RequestID string        `name:"request-id" env:"-" help:"Name the operation: run again with the same id after a timeout, and it follows the operation the first run began instead of beginning another (needs every node at placement command version 6)."`
	NoWait    bool          `name:"no-wait" help:"Print the operation id as soon as it is recorded, and return (follow it with warden admin operation ID)."`
	Deadline  time.Duration `default:"30m" help:"How long to wait for the operation to end (the global --timeout does not apply)."`
}

// ctx is the deadline of the call that begins and runs the operation:
// --deadline, or --timeout with --no-wait.
func (f *opFlags) ctx(g *globals) (context.Context, context.CancelFunc) {
	if f.NoWait {
		return g.ctx()
	}
	return context.WithTimeout(context.Background(), f.Deadline)
}

// watch shows, on stderr, the progress of the running operation that
// mine matches, read every 250 ms, until the returned stop is called
// (nothing with --no-wait or --json, nor from a node that predates
// ListOperations).
func (f *opFlags) watch(g *globals, mine func(*wardenv1.Operation) bool) (stop func()) {
	if f.NoWait || g.JSON {
		return func() {}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		shown := map[uint64]string{} // by operation: a job and its running step each
		for {
			select {
			case <-done:
				return
			case <-time.After(250 * time.Millisecond):
			}
			ctx, cancel := g.ctx()
			resp, err := g.admin().ListOperations(ctx, connect.NewRequest(&wardenv1.ListOperationsRequest{}))
			cancel()
			if connect.CodeOf(err) == connect.CodeUnimplemented {
				return
			}
			if err != nil {
				continue // a poll that failed (a leader changing): the next one shows the progress
			}
			for _, op := range resp.Msg.GetOperations() {
				if line := progressLine(op); mine(op) && op.GetState() == wardenv1.OperationState_OPERATION_STATE_RUNNING && line != shown[op.GetId()] {
					fmt.Fprintln(os.Stderr, line)
					shown[op.GetId()] = line
				}
			}
		}
	}()
	return func() { close(done); <-exited }
}

// Run sends AdminService.SplitShard.
func (s *splitCmd) Run(g *globals) error {
	var at uint64
	if s.At != "" {
		v, err := strconv.ParseUint(s.At, 0, 64)
		if err != nil {
			return fmt.Errorf("split: --at: %w", err)
		}
		at = v
	}
	ctx, cancel := s.ctx(g)
	defer cancel()
	stop := s.watch(g, func(op *wardenv1.Operation) bool { return op.GetKind() == "split" && op.GetShardId() == s.ShardID })
	resp, err := g.admin().SplitShard(ctx, connect.NewRequest(&wardenv1.SplitShardRequest{ShardId: s.ShardID, SplitAt: at, RequestId: s.RequestID, NoWait: s.NoWait}))
	stop()
	if err != nil {
		return fmt.Errorf("split: %w", unknownOutcome(err, s.RequestID))
	}
	if resp.Msg.GetNewShardId() == 0 { // --no-wait (a node that predates it answers at the end)
		return g.printBegun(resp.Msg, resp.Msg.GetOperationId())
	}
	return g.print(resp.Msg, func(w io.Writer) {
		fmt.Fprintf(w, "shard %d split at %#016x: the upper part is shard %d (placement generation %d)\n",
			s.ShardID, resp.Msg.GetSplitAt(), resp.Msg.GetNewShardId(), resp.Msg.GetGeneration())
	})
}

type leaderCmd struct {
	ShardID uint64 `arg:"" name:"shard-id"`
	NodeID  uint64 `arg:"" name:"node-id"`
}

// Run sends AdminService.TransferLeader.
func (l *leaderCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.admin().TransferLeader(ctx, connect.NewRequest(&wardenv1.TransferLeaderRequest{ShardId: l.ShardID, NodeId: l.NodeID}))
	if err != nil {
		return fmt.Errorf("leader: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		fmt.Fprintf(w, "shard %d is led from node %d\n", l.ShardID, resp.Msg.GetLeaderNodeId())
	})
}

type revokeCmd struct {
	Resource string `arg:""`
	Token    uint64 `name:"fencing-token" required:"" env:"-" help:"The fencing token of the lease to end (lock describe shows it); never read from the environment, where lock run gives its command its own lease's token."`
}

// Run sends AdminService.RevokeLease; a lease that was no longer held
// under the token is reported, not an error.
func (r *revokeCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.admin().RevokeLease(ctx, connect.NewRequest(&wardenv1.RevokeLeaseRequest{Resource: r.Resource, FencingToken: r.Token}))
	if err != nil {
		return fmt.Errorf("revoke: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		if resp.Msg.GetRevoked() {
			fmt.Fprintf(w, "revoked the lease of %s with token %d\n", r.Resource, r.Token)
		} else {
			fmt.Fprintf(w, "%s is not held under token %d: nothing revoked\n", r.Resource, r.Token)
		}
	})
}

type snapCmd struct {
	ShardID uint64 `arg:"" optional:"" name:"shard-id" help:"Shard to snapshot (default: all)."`
}

// Run sends AdminService.Snapshot.
func (s *snapCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.admin().Snapshot(ctx, connect.NewRequest(&wardenv1.SnapshotRequest{ShardId: s.ShardID}))
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		for _, r := range resp.Msg.GetSnapshots() {
			if r.GetError() != "" {
				fmt.Fprintf(w, "shard %d node %d: %s\n", r.GetShardId(), r.GetNodeId(), r.GetError())
				continue
			}
			fmt.Fprintf(w, "shard %d node %d: snapshot at index %d, log compacted\n", r.GetShardId(), r.GetNodeId(), r.GetIndex())
		}
	})
}

type configCmd struct {
	ShardID         uint64         `arg:"" name:"shard-id" help:"Shard to change (0: all). Without flags, prints the config."`
	MaxClockSkew    *time.Duration `name:"max-clock-skew" placeholder:"DURATION" help:"Clock offset bound lease safety assumes (default 500ms): a lock is grantable to others at expiry plus this."`
	MinLeaseTTL     *time.Duration `name:"min-lease-ttl" placeholder:"DURATION" help:"Shortest lease TTL accepted (default 1s)."`
	MaxLeaseTTL     *time.Duration `name:"max-lease-ttl" placeholder:"DURATION" help:"Longest lease TTL accepted (default 10m)."`
	DefaultLeaseTTL *time.Duration `name:"default-lease-ttl" placeholder:"DURATION" help:"Lease TTL of an Acquire that names none (default 30s)."`
	DedupWindow     *time.Duration `name:"dedup-window" placeholder:"DURATION" help:"How long an ended request id is remembered (default 10m)."`
	MaxWait         *time.Duration `name:"max-wait" placeholder:"DURATION" help:"Longest wait_timeout accepted (default 5m)."`
	MaxWaiters      *uint32        `name:"max-waiters" placeholder:"N" help:"Waiters per resource (default 1000)."`
	MaxTenant       *uint32        `name:"max-tenant-waiters" placeholder:"N" help:"Waiters per tenant (default 10000)."`
	DefaultResTTL   *time.Duration `name:"default-reservation-ttl" placeholder:"DURATION" help:"Quota reservation ttl when none is given (default 5m)."`
	MaxResTTL       *time.Duration `name:"max-reservation-ttl" placeholder:"DURATION" help:"Longest quota reservation ttl (default 1h)."`
	Fairness        *uint32        `name:"fairness-threshold" placeholder:"PERCENT" help:"Share of a parent's limit above which fairness applies (default 80)."`
	Retention       *time.Duration `name:"ledger-retention" placeholder:"DURATION" help:"How long quota ledger events are kept before they fold into checkpoints (default 168h; 0: forever)."`
}

func dur(d *time.Duration) *durationpb.Duration {
	if d == nil {
		return nil
	}
	return durationpb.New(*d)
}

// Run sends AdminService.SetShardConfig.
func (c *configCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.admin().SetShardConfig(ctx, connect.NewRequest(&wardenv1.SetShardConfigRequest{
		ShardId: c.ShardID, MaxClockSkew: dur(c.MaxClockSkew), MinLeaseTtl: dur(c.MinLeaseTTL), MaxLeaseTtl: dur(c.MaxLeaseTTL),
		DefaultLeaseTtl: dur(c.DefaultLeaseTTL), DedupWindow: dur(c.DedupWindow), MaxWaitTimeout: dur(c.MaxWait),
		MaxWaitersPerResource: c.MaxWaiters, MaxWaitersPerTenant: c.MaxTenant,
		DefaultReservationTtl: dur(c.DefaultResTTL), MaxReservationTtl: dur(c.MaxResTTL), FairnessThresholdPercent: c.Fairness,
		LedgerRetention: dur(c.Retention),
	}))
	if err != nil {
		return fmt.Errorf("set-config: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		for _, s := range resp.Msg.GetShards() {
			fmt.Fprintf(w, "shard %d: max_clock_skew %v, lease TTL %v..%v (default %v), dedup window %v, max wait %v, waiters %d/resource %d/tenant\n",
				s.GetShardId(), s.GetMaxClockSkew().AsDuration(), s.GetMinLeaseTtl().AsDuration(), s.GetMaxLeaseTtl().AsDuration(),
				s.GetDefaultLeaseTtl().AsDuration(), s.GetDedupWindow().AsDuration(), s.GetMaxWaitTimeout().AsDuration(),
				s.GetMaxWaitersPerResource(), s.GetMaxWaitersPerTenant())
			fmt.Fprintf(w, "  quotas: reservation ttl %v (at most %v), fairness above %d%%, ledger retention %v\n",
				s.GetDefaultReservationTtl().AsDuration(), s.GetMaxReservationTtl().AsDuration(), s.GetFairnessThresholdPercent(), s.GetLedgerRetention().AsDuration())
		}
	})
}

type moveCmd struct {
	ShardID uint64 `arg:"" name:"shard-id" help:"Shard whose replica moves."`
	From    uint64 `arg:"" name:"from-node-id" help:"Node the replica leaves (its data there is deleted)."`
	To      uint64 `arg:"" name:"to-node-id" help:"Node that takes it: in the same zone, hosting no replica of the shard."`
	opFlags
}

// Run sends AdminService.MoveReplica.
func (m *moveCmd) Run(g *globals) error {
	ctx, cancel := m.ctx(g)
	defer cancel()
	stop := m.watch(g, func(op *wardenv1.Operation) bool {
		return op.GetKind() == "move" && op.GetShardId() == m.ShardID && op.GetFromNodeId() == m.From && op.GetToNodeId() == m.To
	})
	resp, err := g.admin().MoveReplica(ctx, connect.NewRequest(&wardenv1.MoveReplicaRequest{ShardId: m.ShardID, FromNodeId: m.From, ToNodeId: m.To, RequestId: m.RequestID, NoWait: m.NoWait}))
	stop()
	if err != nil {
		return fmt.Errorf("move: %w", unknownOutcome(err, m.RequestID))
	}
	if m.NoWait && resp.Msg.GetOperationId() != 0 {
		return g.printBegun(resp.Msg, resp.Msg.GetOperationId())
	}
	return g.print(resp.Msg, func(w io.Writer) {
		fmt.Fprintf(w, "shard %d: replica moved from node %d to node %d (replica %d)\n", m.ShardID, m.From, m.To, resp.Msg.GetReplicaId())
	})
}

type rebalCmd struct {
	DryRun bool `name:"dry-run" help:"Only print the plan."`
	opFlags
}

// Run sends AdminService.Rebalance.
func (r *rebalCmd) Run(g *globals) error {
	ctx, cancel := r.ctx(g)
	defer cancel()
	stop := func() {}
	if !r.DryRun {
		stop = r.watch(g, func(op *wardenv1.Operation) bool { return op.GetKind() == "rebalance" })
	}
	resp, err := g.admin().Rebalance(ctx, connect.NewRequest(&wardenv1.RebalanceRequest{DryRun: r.DryRun, RequestId: r.RequestID, NoWait: r.NoWait}))
	stop()
	if err != nil {
		return fmt.Errorf("rebalance: %w", unknownOutcome(err, r.RequestID))
	}
	if r.NoWait && resp.Msg.GetOperationId() != 0 {
		return g.printBegun(resp.Msg, resp.Msg.GetOperationId())
	}
	return g.print(resp.Msg, func(w io.Writer) {
		if len(resp.Msg.GetActions()) == 0 {
			fmt.Fprintln(w, "balanced: nothing to do")
		}
		for _, a := range resp.Msg.GetActions() {
			state := "planned"
			switch {
			case a.GetDone():
				state = "done"
			case a.GetError() != "":
				state = "failed: " + a.GetError()
			}
			fmt.Fprintf(w, "%-19s %s: %s  %s\n", a.GetKind(), stepTarget(a.GetKind(), a.GetShardId()), nodes(a.GetFromNodeId(), a.GetToNodeId()), state)
		}
	})
}

// stepTarget names what a rebalance or removal step changes: a shard,
// or the placement group.
func stepTarget(kind string, shardID uint64) string {
	if kind == "add_placement_voter" {
		return "placement group"
	}
	return "shard " + strconv.FormatUint(shardID, 10)
}

// nodes says where a step goes: "node 1 → node 4", "→ node 4" (a replica
// added), "node 1 →" (one dropped).
func nodes(from, to uint64) string {
	s := "→"
	if from != 0 {
		s = fmt.Sprintf("node %d →", from)
	}
	if to != 0 {
		s += fmt.Sprintf(" node %d", to)
	}
	return s
}

type nodeCmd struct {
	Remove nodeRemoveCmd `cmd:"" help:"Take a node out of the cluster for good: move its replicas to other nodes of its zone, then remove it from the map (its id is never used again)."`
}

type nodeRemoveCmd struct {
	NodeID uint64 `arg:"" name:"node-id" help:"Node to take out for good (its id is never used again)."`
	Force  bool   `help:"Remove it even where a replica has no place in its zone: that replica is dropped, leaving its shard one replica short (never below two) until 'warden admin rebalance' adds one on a node of the zone; a placement group vote with no replacement is removed. Needs every node at placement command version 7."`
	opFlags
}

// Run sends AdminService.RemoveNode.
func (r *nodeRemoveCmd) Run(g *globals) error {
	ctx, cancel := r.ctx(g)
	defer cancel()
	stop := r.watch(g, func(op *wardenv1.Operation) bool {
		return (op.GetKind() == "remove_node" && op.GetNodeId() == r.NodeID) || (op.GetKind() == "move" && op.GetFromNodeId() == r.NodeID)
	})
	resp, err := g.admin().RemoveNode(ctx, connect.NewRequest(&wardenv1.RemoveNodeRequest{NodeId: r.NodeID, Force: r.Force, RequestId: r.RequestID, NoWait: r.NoWait}))
	stop()
	if err != nil {
		return fmt.Errorf("node remove: %w", unknownOutcome(err, r.RequestID))
	}
	if r.NoWait && resp.Msg.GetOperationId() != 0 {
		return g.printBegun(resp.Msg, resp.Msg.GetOperationId())
	}
	return g.print(resp.Msg, func(w io.Writer) {
		if resp.Msg.GetOperationId() == 0 && len(resp.Msg.GetMoves()) == 0 && resp.Msg.GetPlacementNodeId() == 0 {
			fmt.Fprintf(w, "node %d is not in the cluster (removed already, or by this call before an answer was lost)\n", r.NodeID)
			return
		}
		for _, m := range resp.Msg.GetMoves() {
			fmt.Fprintf(w, "shard %d: replica moved from node %d to node %d (replica %d)\n", m.GetShardId(), m.GetFromNodeId(), m.GetToNodeId(), m.GetReplicaId())
		}
		for _, id := range resp.Msg.GetDroppedShardIds() {
			fmt.Fprintf(w, "shard %d: replica on node %d dropped; the shard is one replica short until 'warden admin rebalance' adds one\n", id, r.NodeID)
		}
		if p := resp.Msg.GetPlacementNodeId(); p != 0 {
			fmt.Fprintf(w, "placement group: node %d votes in place of node %d\n", p, r.NodeID)
		}
		fmt.Fprintf(w, "node %d removed: stop its process and wipe its data directory; it cannot rejoin under id %d\n", r.NodeID, r.NodeID)
	})
}

// printBegun prints the answer resp to a --no-wait call: operation id,
// begun or (under a request id) found.
func (g *globals) printBegun(resp proto.Message, id uint64) error {
	return g.print(resp, func(w io.Writer) {
		fmt.Fprintf(w, "operation %d: follow it with warden admin operation %d\n", id, id)
	})
}

// unknownOutcome adds to err, when the call that begins an operation
// ended without an answer (a deadline, a lost connection), that the
// operation may have begun and go on, and how to find out.
func unknownOutcome(err error, requestID string) error {
	switch connect.CodeOf(err) {
	case connect.CodeDeadlineExceeded, connect.CodeCanceled, connect.CodeUnavailable, connect.CodeUnknown:
	default:
		return err
	}
	if requestID != "" {
		return fmt.Errorf("%w (the outcome is unknown: the operation may have begun and go on; run the same command again with --request-id %s to follow it)", err, requestID)
	}
	return fmt.Errorf("%w (the outcome is unknown: the operation may have begun and go on; see warden admin operations)", err)
}

// progressLine is one line of an operation's progress.
func progressLine(op *wardenv1.Operation) string {
	s := fmt.Sprintf("%s %d: %s", op.GetKind(), op.GetId(), op.GetStep())
	if t := op.GetStepsTotal(); t != 0 {
		s += fmt.Sprintf(" (step %d of %d)", op.GetStepsDone(), t)
	}
	if r := op.GetRecordsCopied(); r != 0 {
		s += fmt.Sprintf(", %d records (%d bytes) copied", r, op.GetBytesCopied())
	}
	if t := op.GetCatchUpTarget(); t != 0 {
		s += fmt.Sprintf(", new replica applied %d of %d", op.GetCaughtUp(), t)
	}
	if op.GetKind() == "remove_node" || op.GetKind() == "rebalance" {
		done := 0
		for _, st := range op.GetSteps() {
			if st.GetState() == "done" {
				done++
			}
		}
		s += fmt.Sprintf(", %d of %d planned steps done", done, op.GetStepsPlanned())
	}
	if st := op.GetState(); st != wardenv1.OperationState_OPERATION_STATE_RUNNING {
		s += ", " + stateName(st)
	}
	if e := op.GetError(); e != "" {
		s += ": " + e
	}
	return s
}

// stateName is an operation state in lower case ("rolled back").
func stateName(s wardenv1.OperationState) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.String(), "OPERATION_STATE_")), "_", " ")
}

type operationsCmd struct{}

// Run sends AdminService.ListOperations.
func (operationsCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.admin().ListOperations(ctx, connect.NewRequest(&wardenv1.ListOperationsRequest{}))
	if err != nil {
		return fmt.Errorf("operations: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		fmt.Fprintf(w, "%-5s %-11s %-13s %-20s %-6s %-44s %s\n", "ID", "KIND", "STATE", "STEP", "SHARD", "DETAIL", "REQUEST ID")
		for _, op := range resp.Msg.GetOperations() {
			step, shardID := op.GetStep(), "-"
			if t := op.GetStepsTotal(); t != 0 {
				step += fmt.Sprintf(" (%d/%d)", op.GetStepsDone(), t)
			}
			if op.GetShardId() != 0 {
				shardID = strconv.FormatUint(op.GetShardId(), 10)
			}
			fmt.Fprintf(w, "%-5d %-11s %-13s %-20s %-6s %-44s %s\n", op.GetId(), op.GetKind(), stateName(op.GetState()), step, shardID, opDetail(op), op.GetRequestId())
		}
	})
}

// opDetail says what an operation does.
func opDetail(op *wardenv1.Operation) string {
	switch op.GetKind() {
	case "split":
		return fmt.Sprintf("at %#016x into shard %d", op.GetSplitAt(), op.GetNewShardId())
	case "remove_node":
		d := fmt.Sprintf("node %d", op.GetNodeId())
		if op.GetForce() {
			d += ", forced"
		}
		if op.GetToNodeId() != 0 {
			d += fmt.Sprintf(", placement vote to node %d", op.GetToNodeId())
		}
		return d
	case "rebalance":
		if n := len(op.GetSteps()); n != 1 {
			return fmt.Sprintf("%d steps taken", n)
		}
		return "1 step taken"
	}
	d := nodes(op.GetFromNodeId(), op.GetToNodeId())
	if p := op.GetParentId(); p != 0 {
		d += fmt.Sprintf(" (step of %d)", p)
	}
	return d
}

type operationCmd struct {
	ID        uint64 `arg:"" optional:"" help:"Operation id."`
	RequestID string `name:"request-id" env:"-" help:"Find it by the request id it was begun with instead."`
}

// Run sends AdminService.GetOperation.
func (o *operationCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.admin().GetOperation(ctx, connect.NewRequest(&wardenv1.GetOperationRequest{Id: o.ID, RequestId: o.RequestID}))
	if err != nil {
		return fmt.Errorf("operation: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		op := resp.Msg.GetOperation()
		fmt.Fprintf(w, "%s, %s\n", progressLine(op), opDetail(op))
		for i, st := range op.GetSteps() {
			line := fmt.Sprintf("  %d. %s of %s: %s, %s", i+1, st.GetKind(), stepTarget(st.GetKind(), st.GetShardId()), nodes(st.GetFromNodeId(), st.GetToNodeId()), st.GetState())
			if st.GetOperationId() != 0 {
				line += fmt.Sprintf(" (operation %d)", st.GetOperationId())
			}
			if st.GetError() != "" {
				line += ": " + st.GetError()
			}
			fmt.Fprintln(w, line)
		}
	})
}
