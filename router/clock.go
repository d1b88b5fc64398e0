package router

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	"github.com/warden-dev/warden/shard"
)

// clockWatch is a node's view of its clock against the others'
// (DESIGN.md "Time"): lease safety rests on the pairwise offset staying
// under max_clock_skew, so each node measures it.
type clockWatch struct {
	mu sync.Mutex
	// offsets holds, per peer, its last good reading.
	offsets map[uint64]reading
	down    map[uint64]bool // peers whose last reading failed
	missed  map[uint64]int  // readings each peer failed in a row
	// versions holds the shard command version each peer's binary
	// applies, from its last clock reading.
	versions map[uint64]uint32
	// diskLow holds the peers whose last clock reading said their data
	// directory is below its reserve (ClockResponse.disk_low).
	diskLow map[uint64]bool
	// unsafe is set while this node's clock is more than MaxClockSkew/2
	// from the majority's.
	unsafe atomic.Bool
	// readAt holds, per peer, when the round of its last good reading
	// began (monotonic); roundc is closed, and replaced, whenever a
	// reading arrives.
	readAt map[uint64]time.Time
	roundc chan struct{}
	// kick asks watchClock for a round now (a term began here).
	kick chan struct{}
}

// ErrClockUnconfirmed: this node leads the shard but its clock is not
// confirmed within max_clock_skew/2 of a quorum's by a reading taken in
// this term, so it may not stamp a command with it (DESIGN.md "Time").
// It maps to Unavailable, like ErrNoLeader: safe to retry with the same
// ids.
var ErrClockUnconfirmed = errors.New("router: the shard leader's clock is not confirmed within the skew bound")

// reading is one clock reading of a peer: its clock minus ours as
// estimated at the midpoint of the round trip, and the round trip.
type reading struct{ off, rtt time.Duration }

// readings returns, for each peer, its last good reading and the start
// of its round, and a channel closed by the next reading.
func (w *clockWatch) readings() (map[uint64]reading, map[uint64]time.Time, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.roundc == nil {
		w.roundc = make(chan struct{})
	}
	return maps.Clone(w.offsets), maps.Clone(w.readAt), w.roundc
}

// confirmed reports whether the readings confirm this node's clock for
// term t: a quorum of the shard's voters' clocks (this node's included)
// agree with ours within MaxClockSkew/2, by readings taken in rounds
// begun after the term began. The new replica of a move in progress
// does not count until it is promoted (placement.Map.Voters): with it, a
// shard of three voters, one of them down, would need three of four
// clocks, and a target that stops answering would stall the shard.
//
// A reading agrees by the farthest offset it allows (farthestOffset):
// its whole uncertainty must lie within the bound.
func (r *Router) confirmed(t leaderTerm, offsets map[uint64]reading, readAt map[uint64]time.Time) bool {
	reps := r.Map().Voters(t.shardID)
	agree := 0
	for _, rep := range reps {
		id := rep.GetNodeId()
		if rep.GetReplicaId() == t.replicaID || r.IsLocal(id) { // the leader's own clock
			agree++
			continue
		}
		if at, ok := readAt[id]; ok && at.After(t.anchor) && farthestOffset(offsets[id].off, offsets[id].rtt).Abs() <= r.cfg.MaxClockSkew/2 {
			agree++
		}
	}
	return agree > len(reps)/2
}

// requestRound asks for a measurement round without waiting for it.
func (r *Router) requestRound() {
	select {
	case r.clock.kick <- struct{}{}:
	default:
	}
}

// awaitClock returns nil once this node's clock may stamp commands of
// term t: readings of a quorum of the shard's voters' nodes, taken in
// rounds begun after the term began, put it within MaxClockSkew/2 of
// their majority (confirmed). A leader that took office with a clock far
// ahead would otherwise stamp client commands with it, making leases due
// within the offset grantable at once, and the shard's time high-water
// mark (max(now, last)) would then hold the jump for every later leader.
// A shard whose replicas all run in this process (a dev cluster, one
// clock) counts as confirmed. It fails with ErrClockUnconfirmed when the
// clock is known to be out of bounds or no confirmation comes within
// LeaderWait, and with ctx's error.
//
// Once confirmed, the term remembers it (Leadership.clockConfirmed), and
// later proposals check only that the clock has not since been found out
// of bounds.
func (r *Router) awaitClock(ctx context.Context, n *LocalNode, t leaderTerm) error {
	unsafe := func() error {
		return fmt.Errorf("%w: it is more than %v from the majority's; leadership is being handed away", ErrClockUnconfirmed, r.cfg.MaxClockSkew/2)
	}
	if r.clock.unsafe.Load() {
		return unsafe()
	}
	if t.clockOK || !r.hasPeers(t.shardID) || r.cfg.Knobs.OneClock {
		return nil
	}
	timeout := time.NewTimer(r.cfg.LeaderWait)
	defer timeout.Stop()
	for {
		if r.clock.unsafe.Load() {
			return unsafe()
		}
		offsets, readAt, next := r.clock.readings()
		if r.confirmed(t, offsets, readAt) {
			n.Leadership.clockConfirmed(t.shardID, t.term)
			return nil
		}
		r.requestRound()
		select {
		case <-next:
		case <-ctx.Done():
			return ctx.Err()
		case <-timeout.C:
			return fmt.Errorf("%w: no quorum of the shard's nodes answered a clock reading in this term", ErrClockUnconfirmed)
		}
	}
}

// hasPeers reports whether a replica of shardID runs outside this process.
func (r *Router) hasPeers(shardID uint64) bool {
	for _, rep := range r.Map().Shard(shardID).GetReplicas() {
		if !r.IsLocal(rep.GetNodeId()) {
			return true
		}
	}
	return false
}

// Now is this node's wall clock, as the leader clock and Clock see it.
func (r *Router) Now() time.Time { return time.Now().Add(r.cfg.Knobs.ClockOffset) }

// watchClock measures the offsets every ClockInterval, and at once when
// a term begins here, until Stop.
func (r *Router) watchClock() {
	tick := time.NewTicker(r.cfg.ClockInterval)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		case <-r.clock.kick:
		}
		r.measureClocks()
		r.handOffLowDisk()
	}
}

// measureClocks asks every other node for its clock, in parallel, as NTP
// does: the offset is the peer's reading minus the midpoint of our send
// and receive times, good to half the round trip. The readings confirm
// this node's clock for the terms begun before the round (awaitClock).
func (r *Router) measureClocks() {
	var peers []*placementv1.Node
	for _, n := range r.Map().State().GetNodes() {
		if !r.IsLocal(n.GetId()) {
			peers = append(peers, n)
		}
	}
	if len(peers) == 0 {
		return // every node runs in this process, on one clock
	}
	start := time.Now()
	readings := make(chan *time.Duration, len(peers))
	for _, n := range peers {
		go func() {
			if off, rtt, ok := r.readClock(n, start); ok {
				least := leastOffset(off, rtt)
				readings <- &least
				return
			}
			readings <- nil
		}()
	}
	offsets := []time.Duration{0} // ours
	for range peers {
		if off := <-readings; off != nil {
			offsets = append(offsets, *off)
		}
	}
	off := fromMajority(offsets)
	unsafe := off.Abs() > r.cfg.MaxClockSkew/2
	if unsafe != r.clock.unsafe.Swap(unsafe) {
		if unsafe {
			r.cfg.Logger.Error("this node's clock is too far from the others'; it stops proposing and hands its leaderships away",
				"offset_from_majority", -off, "bound", r.cfg.MaxClockSkew/2)
		} else {
			r.cfg.Logger.Info("this node's clock is back within bounds", "offset_from_majority", -off)
		}
	}
	if unsafe {
		for i := range r.nodes {
			r.handLeadershipAway(&r.nodes[i], false, "its clock is out of bounds")
		}
	}
}

// leastOffset is the smallest offset a reading of offset off taken in a
// round trip of rtt allows: the peer read its clock somewhere within the
// round trip, so the offset is known only to ±rtt/2 around off (NTP's
// bound). This node judges its own clock out of bounds by these, so that
// one slow answer (a peer busy starting, a pause) does not make it hand
// its leaderships away; a reading confirms a term only if its farthest
// offset is within the bound (confirmed), so a slow one confirms less.
func leastOffset(off, rtt time.Duration) time.Duration {
	slack := rtt / 2
	switch {
	case off > slack:
		return off - slack
	case off < -slack:
		return off + slack
	}
	return 0
}

// farthestOffset is the offset farthest from 0 that a reading of offset
// off taken in a round trip of rtt allows (see leastOffset): what a
// confirmation must hold within the bound.
func farthestOffset(off, rtt time.Duration) time.Duration {
	if off < 0 {
		return off - rtt/2
	}
	return off + rtt/2
}

// fromMajority returns the majority's time relative to ours: the median
// of every clock's offset from ours, ours (0) included.
func fromMajority(offsets []time.Duration) time.Duration {
	sorted := slices.Sorted(slices.Values(offsets))
	return sorted[len(sorted)/2]
}

// readClock reads peer n's clock in the round begun at round, records
// the offset, its liveness and its binary's command version, wakes the
// proposals waiting for a confirmation (awaitClock: each reading may
// complete a shard's quorum, so a peer that is down does not hold them
// for the whole reading timeout), and returns the offset and the round
// trip it was measured in.
func (r *Router) readClock(n *placementv1.Node, round time.Time) (off, rtt time.Duration, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ClockInterval)
	defer cancel()
	sent := r.Now()
	resp, err := r.peers.Get(n.GetListenAddr()).Node.Clock(ctx, connect.NewRequest(&placementv1.ClockRequest{}))
	got := r.Now()
	r.clock.mu.Lock()
	defer r.clock.mu.Unlock()
	if r.clock.down == nil {
		r.clock.down = map[uint64]bool{}
	}
	r.clock.down[n.GetId()] = err != nil
	if r.clock.missed == nil {
		r.clock.missed = map[uint64]int{}
	}
	if err != nil {
		r.clock.missed[n.GetId()]++
		return 0, 0, false
	}
	r.clock.missed[n.GetId()] = 0
	rtt = got.Sub(sent)
	off = time.Unix(0, resp.Msg.GetUnixNano()).Sub(sent.Add(rtt / 2))
	metrics.clockOffset.WithLabelValues(strconv.FormatUint(n.GetId(), 10)).Set(off.Seconds())
	if r.clock.offsets == nil {
		r.clock.offsets = map[uint64]reading{}
	}
	r.clock.offsets[n.GetId()] = reading{off, rtt}
	if r.clock.versions == nil {
		r.clock.versions = map[uint64]uint32{}
	}
	r.clock.versions[n.GetId()] = max(resp.Msg.GetCommandVersion(), 1)
	if r.clock.diskLow == nil {
		r.clock.diskLow = map[uint64]bool{}
	}
	r.clock.diskLow[n.GetId()] = resp.Msg.GetDiskLow()
	if r.clock.readAt == nil {
		r.clock.readAt = map[uint64]time.Time{}
	}
	r.clock.readAt[n.GetId()] = round
	if r.clock.roundc != nil {
		close(r.clock.roundc)
	}
	r.clock.roundc = make(chan struct{})
	return off, rtt, true
}

// Applies reports whether every replica of shardID is on a node whose
// binary applies command envelope version v: this node's, or a peer
// whose peerVersion says so. A command of a newer version than
// some replica applies would stop that replica's whole process, and go on
// stopping it while it replays its log, so the router proposes one only
// once every replica's node has been upgraded (a rolling upgrade keeps
// using the older commands until then).
func (r *Router) Applies(shardID uint64, v uint32) bool {
	if v <= 1 {
		return true
	}
	s := r.Map().Shard(shardID)
	if s == nil {
		return false
	}
	r.clock.mu.Lock()
	defer r.clock.mu.Unlock()
	for _, rep := range s.GetReplicas() {
		if !r.IsLocal(rep.GetNodeId()) && r.peerVersion(rep.GetNodeId()) < v {
			return false
		}
	}
	return true
}

// sharedVersion is the newest envelope version every replica of shardID
// applies: this binary's for local replicas, and peerVersion for a
// peer's. Commands travel in it, so a rule that changed in a newer
// version (shard.CommandVersion) takes effect only once no replica would
// apply the entry by the old one.
func (r *Router) sharedVersion(shardID uint64) uint32 {
	v := uint32(shard.CommandVersion)
	r.clock.mu.Lock()
	defer r.clock.mu.Unlock()
	for _, rep := range r.Map().Shard(shardID).GetReplicas() {
		if !r.IsLocal(rep.GetNodeId()) {
			v = min(v, r.peerVersion(rep.GetNodeId()))
		}
	}
	return v
}

// peerVersion is the envelope version peer id's binary applies: what its
// last clock reading reported, else what it registered in the placement
// map at its last start (a node down since before this router started),
// else 1. The caller holds r.clock.mu.
func (r *Router) peerVersion(id uint64) uint32 {
	if v, ok := r.clock.versions[id]; ok {
		return v
	}
	return max(r.Map().Node(id).GetCommandVersion(), 1)
}

// HeardFrom reports whether node id is up (local, or it answered its last
// clock reading) and when this node last heard from it (nil: never).
func (r *Router) HeardFrom(id uint64) (bool, *timestamppb.Timestamp) {
	if r.IsLocal(id) {
		return true, timestamppb.Now()
	}
	r.clock.mu.Lock()
	defer r.clock.mu.Unlock()
	at, heard := r.clock.readAt[id]
	if !heard {
		return false, nil
	}
	// readAt is monotonic time: its wall reading is when the round began.
	return !r.clock.down[id], timestamppb.New(at)
}

// Live reports whether node id answered its last clock reading (a node
// not read yet counts as live; local nodes always do).
func (r *Router) Live(id uint64) bool {
	r.clock.mu.Lock()
	defer r.clock.mu.Unlock()
	return !r.clock.down[id]
}

// peerDownAfter is how many clock readings in a row a peer must fail
// before the calls forwarded to it are given up (callLive): one failed
// reading may be a pause of a busy node, and a waiting Acquire given up
// on it would leave its place in the queue.
const peerDownAfter = 2

// Unresponsive reports whether node id failed its last peerDownAfter
// clock readings.
func (r *Router) Unresponsive(id uint64) bool {
	r.clock.mu.Lock()
	defer r.clock.mu.Unlock()
	return r.clock.missed[id] >= peerDownAfter
}

// handLeadershipAway asks every shard local node n leads (the data
// shards, and the placement group too when meta) to elect the replica of
// another voter that can lead (canLead), and logs each hand-off with
// why. A shard with no such voter stays led by n.
func (r *Router) handLeadershipAway(n *LocalNode, meta bool, why string) {
	m := r.Map()
	for _, t := range n.Leadership.led() {
		var to, replica uint64
		if t.shardID == placement.MetaShardID {
			if !meta {
				continue
			}
			// The placement group's replica ids are its nodes' ids.
			ms, err := r.PlacementMembership(context.Background())
			if err != nil {
				continue
			}
			for _, v := range slices.Sorted(maps.Keys(ms.GetVoting())) {
				if v != n.ID && r.canLead(v) {
					to, replica = v, v
					break
				}
			}
		} else {
			for _, rep := range m.Voters(t.shardID) { // a non-voter cannot lead
				if id := rep.GetNodeId(); id != n.ID && r.canLead(id) {
					to, replica = id, rep.GetReplicaId()
					break
				}
			}
		}
		if to == 0 {
			continue
		}
		if err := n.Raft.TransferLeader(t.shardID, replica); err == nil {
			r.cfg.Logger.Info("leadership handed away", "shard", t.shardID, "from", n.ID, "to", to, "why", why)
		}
	}
}

// canLead reports whether node id may be handed a leadership: it
// answered its last clock reading and its data directory is not below
// its reserve (as it last said).
func (r *Router) canLead(id uint64) bool {
	return r.Live(id) && !r.DiskLow(id)
}

// DiskLow reports whether node id's data directory is below its reserve
// (placement.Node.WritesRefused), for a peer as its last clock reading
// said.
func (r *Router) DiskLow(id uint64) bool {
	if n := r.LocalNode(id); n != nil {
		return n.Node != nil && n.Node.WritesRefused() != nil
	}
	r.clock.mu.Lock()
	defer r.clock.mu.Unlock()
	return r.clock.diskLow[id]
}

// handOffLowDisk hands away every leadership, the placement group's
// included, of each local node whose data directory is below its reserve
// (DESIGN.md §5): such a node proposes nothing, so while it led a shard
// every write to the shard through any node would fail. It runs each
// clock round (ClockInterval, as often as the disk is checked), so a node
// re-elected meanwhile gives the lead away again.
func (r *Router) handOffLowDisk() {
	for i := range r.nodes {
		if n := &r.nodes[i]; r.DiskLow(n.ID) {
			r.handLeadershipAway(n, true, "its data directory is below its reserve (--disk-reserve)")
		}
	}
}
