package server

import (
	"context"
	"crypto/tls"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-dev/warden/placement"
	placementv1 "github.com/warden-dev/warden/proto/warden/placement/v1"
	shardv1 "github.com/warden-dev/warden/proto/warden/shard/v1"
	"github.com/warden-dev/warden/router"
	"github.com/warden-dev/warden/rpc"
	"github.com/warden-dev/warden/shard"
	"github.com/warden-dev/warden/tlsconfig"
)

// NodeSpec is a node to run in this process.
type NodeSpec struct {
	ID       uint64
	Zone     string
	RaftAddr string // host:port of its Raft transport, as the others reach it
	// RaftListenAddr, if set, is the address the Raft transport binds
	// (wardend --raft-addr when --raft-advertise-addr is given).
	RaftListenAddr string
	DataDir        string
}

// Member is one of a cluster's initial members, which host the placement
// group and the first data shard.
type Member struct {
	ID         uint64
	RaftAddr   string // host:port of its Raft transport
	ListenAddr string // host:port of its Connect API
}

// ClusterConfig describes the part of a Warden cluster that runs in this
// process: one node in production, three in dev mode.
type ClusterConfig struct {
	Nodes []NodeSpec
	// ListenAddr is the Connect address this process serves, as the other
	// nodes reach it.
	ListenAddr string
	// Members are the initial members; every node starts with the same
	// list. A node that is not one of them joins through Join instead.
	Members []Member
	// Join lists the Connect addresses of running nodes, for a node that
	// is not an initial member.
	Join []string
	// NewCluster lets an initial member initialise an empty data
	// directory (wardend --initial-cluster-state new). Without it, an
	// initial member whose data directory holds no state refuses to
	// start (placement.OpenIdentity says why). A joining node may always
	// initialise one, under an id the cluster has never had.
	NewCluster bool
	// RTT, SnapshotEntries and CompactionOverhead are passed to every node.
	RTT                time.Duration
	SnapshotEntries    uint64
	CompactionOverhead uint64
	Router             router.Config
	// Observer, if set, also sees every hand-off each replica applies.
	Observer shard.ApplyObserver
	// BootstrapTimeout bounds the wait for the placement group's quorum at
	// start (default 60 s).
	BootstrapTimeout time.Duration
	// MapInterval is the period of the placement map refresh, the node
	// agents and the operator driver (default 200 ms).
	MapInterval time.Duration
	// TLS, if set, holds the node's TLS material. Its peer certificate
	// authenticates this node to the others, on their node API and on
	// Raft (Dragonboat's mutual TLS, which reads the files once at start:
	// rotate Raft's certificates by a rolling restart); without peer
	// material the nodes authenticate by Router.ClusterSecret.
	TLS *tlsconfig.Store
	// BuildVersion is the binary's version (wardend --version), which the
	// node registers in the placement map for ListNodes.
	BuildVersion string
	// AuthBootstrap, if set, is the auth state to give a cluster that has
	// none (wardend --auth-bootstrap, auth.LoadBootstrap). The node
	// proposes it until some node's bootstrap commits, and until then
	// refuses client calls rather than serve them unauthenticated.
	AuthBootstrap *placementv1.AuthState
	// DiskReserve is the free space each node keeps on its data
	// directory's filesystem (wardend --disk-reserve,
	// placement.NodeConfig.DiskReserve); the zero value keeps none.
	DiskReserve placement.DiskReserve
	// Status, if set, is what the process answers the other starting
	// nodes until its router serves (NewStatus). StartCluster sets it to
	// StatusRunning before it starts Raft on any node: from then the
	// node may acknowledge entries, and must not be counted as new.
	Status *Status
}

// raftTLS is the Raft transport's mutual TLS from the peer material, or
// nil.
func raftTLS(s *tlsconfig.Store) *placement.RaftTLS {
	if s == nil || !s.HasPeer() {
		return nil
	}
	ca, cert, key := s.PeerFiles()
	return &placement.RaftTLS{CAFile: ca, CertFile: cert, KeyFile: key}
}

// Cluster is the running part of a Warden cluster in this process.
type Cluster struct {
	cfg   ClusterConfig
	waits *router.WaitRegistry
	// Router routes over the nodes; Nodes[i] runs cfg.Nodes[i].
	Router *router.Router
	Nodes  []router.LocalNode
	// Modes[i] is how Nodes[i] started; statuses[i] its startStatus.
	Modes    []StartMode
	statuses []string
	agents   []*placement.Agent
	// driving is set while the loop's operator driver runs.
	// peers are the addresses rememberPeers wrote last (the loop's alone).
	peers   []string
	driving atomic.Bool
	// bootstrapWarned is set once the loop said that the auth bootstrap
	// does not apply (bootstrapIgnored).
	bootstrapWarned atomic.Bool
	// ctx ends when the cluster closes.
	ctx    context.Context
	cancel context.CancelFunc
	stop   chan struct{}
	wg     sync.WaitGroup
}

// StartCluster starts (or restarts) the nodes of cfg, each in the mode
// its data directory and cfg give it (StartMode), bootstraps or joins
// the placement group, starts the replicas the map places on the nodes,
// and runs the map refresh, the node agents and, on the placement
// leader, the operator driver. It decides every node's mode before
// anything starts, so a config that cannot start one node starts none;
// on any later error it closes the nodes it started.
func StartCluster(cfg ClusterConfig) (_ *Cluster, err error) {
	cfg, peerTLS := cfg.withDefaults()
	c := &Cluster{cfg: cfg, waits: router.NewWaitRegistry(), stop: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if err := c.decideModes(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.closeNodes()
		}
	}()
	p := router.NewPeers(cfg.Router.ClusterSecret, peerTLS)
	ids := make([]placement.Identity, len(cfg.Nodes))
	for i := range cfg.Nodes {
		if ids[i], err = c.startNode(i, p); err != nil {
			return nil, err
		}
	}
	// The process reads the placement group through the replica of its
	// first node that runs one (from now, or once it joins the group),
	// else through the join addresses and the map's (startMode made sure
	// every node here has some).
	var nodes []*placement.Node
	for _, n := range c.Nodes {
		nodes = append(nodes, n.Node)
	}
	meta := placement.LocalFirst(nodes, p.Placement(cfg.Join, c.knownAddrs))
	st, err := c.bootstrap(meta, ids)
	if err != nil {
		return nil, err
	}
	rc := cfg.Router
	rc.Remote = rpc.NewRemote(p)
	c.Router = router.New(c.Nodes, meta, placement.NewMap(st), c.waits, rc, p)
	if err := c.reconcile(); err != nil {
		return nil, err
	}
	c.Router.Start()
	c.wg.Add(1)
	go c.loop()
	return c, nil
}

// withDefaults returns cfg with its zero timings defaulted and the
// router told what the cluster's config implies, and the TLS config of
// the calls to other nodes (nil without TLS).
func (cfg ClusterConfig) withDefaults() (ClusterConfig, *tls.Config) {
	if cfg.BootstrapTimeout == 0 {
		cfg.BootstrapTimeout = time.Minute
	}
	if cfg.MapInterval == 0 {
		cfg.MapInterval = 200 * time.Millisecond
	}
	var peerTLS *tls.Config
	if cfg.TLS != nil {
		peerTLS = cfg.TLS.PeerClientConfig()
	}
	cfg.Router.PeerTLS = peerTLS != nil
	cfg.Router.AuthRequired = cfg.AuthBootstrap != nil
	return cfg, peerTLS
}

// decideModes decides every node's start mode (and the status it
// reports while starting) before anything is started or written.
func (c *Cluster) decideModes() error {
	for _, spec := range c.cfg.Nodes {
		mode, err := startMode(spec, c.cfg)
		if err != nil {
			return err
		}
		c.Modes = append(c.Modes, mode)
		// Before OpenIdentity writes anything the next start would read.
		c.statuses = append(c.statuses, nodeStatus(spec, c.cfg))
	}
	return nil
}

// startNode opens node i's identity (confirming, for a new cluster or a
// restore, that the cluster has not seen it), starts its NodeHost and
// its replica of the placement group where it hosts one, and appends it
// to c.Nodes; a restarting node also checks that it was not removed
// meanwhile. It returns the node's identity.
func (c *Cluster) startNode(i int, p *router.Peers) (placement.Identity, error) {
	cfg, spec, mode := c.cfg, c.cfg.Nodes[i], c.Modes[i]
	id, err := placement.OpenIdentity(spec.DataDir, spec.ID, mode.initMode())
	if err != nil {
		return id, err
	}
	if mode == ModeNewCluster || mode == ModeRestore {
		// State the cluster has not seen: confirmed before Raft starts.
		if err := c.confirmIdentity(p, spec, id, c.statuses[i]); err != nil {
			_ = id.Forget(spec.DataDir)
			return id, err
		}
	}
	if cfg.Status != nil {
		cfg.Status.set(StatusRunning)
	}
	lead := router.NewLeadership(cfg.Router.Knobs.ClockOffset)
	hist := router.NewHistory(router.HistoryKeep)
	n, err := placement.StartNode(placement.NodeConfig{
		ID: spec.ID, Zone: spec.Zone, RaftAddr: spec.RaftAddr, RaftListenAddr: spec.RaftListenAddr, DataDir: spec.DataDir,
		RTT: cfg.RTT, SnapshotEntries: cfg.SnapshotEntries, CompactionOverhead: cfg.CompactionOverhead,
		Listener: lead, Observer: c.observe, Events: hist.Heard, EventsReset: hist.Reset, EventsClosed: hist.Close, RaftTLS: raftTLS(cfg.TLS), OnSnapshot: router.ObserveSnapshot, OnStorage: router.ObserveStorage, OnFsync: router.ObserveFsync,
		DiskReserve: cfg.DiskReserve,
	})
	if err != nil {
		return id, err
	}
	c.Nodes = append(c.Nodes, router.LocalNode{Node: n, Leadership: lead, History: hist})
	c.agents = append(c.agents, placement.NewAgent(n))
	switch {
	case c.initial(spec.ID):
		// An initial member hosts a replica of the placement group
		// from its first start.
		err = n.StartMeta(c.Members(), false)
	case n.HostsMeta():
		// One that joined it since (it replaced a member) restarts
		// its replica.
		err = n.JoinMeta()
	}
	if err == nil && mode == ModeRestart {
		// A node removed while it was down, or while it ran cut off,
		// asks the nodes of the last map it saw too: the initial
		// members may all be gone.
		err = c.probeIdentity(p, spec, id, loadPeers(spec.DataDir))
	}
	return id, err
}

// bootstrap creates, joins or reads the placement state through meta
// for each node (placement.Bootstrap, within BootstrapTimeout), ends a
// restored node's restore, and returns the state the last node read.
func (c *Cluster) bootstrap(meta placement.MetaClient, ids []placement.Identity) (*placementv1.State, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.BootstrapTimeout)
	defer cancel()
	var initial []*placementv1.Node
	for _, m := range c.cfg.Members {
		initial = append(initial, &placementv1.Node{Id: m.ID, RaftAddr: m.RaftAddr, ListenAddr: m.ListenAddr})
	}
	var st *placementv1.State
	for i, spec := range c.cfg.Nodes {
		self := &placementv1.Node{Id: spec.ID, Zone: spec.Zone, RaftAddr: spec.RaftAddr, ListenAddr: c.cfg.ListenAddr, Incarnation: ids[i].Incarnation, CommandVersion: shard.CommandVersion,
			MetaCommandVersion: placement.MetaCommandVersion, BuildVersion: c.cfg.BuildVersion}
		create, err := c.firstState(spec, c.Modes[i], initial)
		if err == nil {
			st, err = placement.Bootstrap(ctx, meta, create, self, ids[i])
		}
		if err == nil && c.Modes[i] == ModeRestore {
			err = placement.FinishRestore(spec.DataDir)
		}
		if err != nil {
			return nil, err
		}
	}
	return st, nil
}

// firstState is the placement command node spec, starting in mode, may
// create the placement state with: a restored node's RestoreCmd, with
// the addresses of the initial members; the bootstrap of a new map over
// them for any other initial member (it changes nothing once a map
// exists); none for a node that joins.
func (c *Cluster) firstState(spec NodeSpec, mode StartMode, initial []*placementv1.Node) (*placementv1.Command, error) {
	if mode != ModeRestore {
		if len(initial) == 0 {
			return nil, nil
		}
		return placement.BootstrapCommand(initial), nil
	}
	pending, err := placement.PendingRestore(spec.DataDir)
	if err != nil {
		return nil, err
	}
	return placement.RestoreCommand(pending.GetState(), initial)
}

// initial reports whether node id is one of the initial members.
func (c *Cluster) initial(id uint64) bool { return isMember(c.cfg.Members, id) }

// isMember reports whether node id is one of members.
func isMember(members []Member, id uint64) bool {
	return slices.ContainsFunc(members, func(m Member) bool { return m.ID == id })
}

// probeIdentity asks the other nodes it knows (the initial members, the
// join addresses and known), before a node restarting from its directory
// starts a data replica, whether their placement group knows it under
// another incarnation, or removed it (a node removed from the cluster,
// whose replicas were removed from their groups, would otherwise wait
// for a placement group that no longer answers it). Peers that do not
// answer (all restarting) are not waited for: the directory's Raft state
// is the node's own, and the later checks decide. A directory new in
// this start is confirmed before Raft starts instead (confirmIdentity).
func (c *Cluster) probeIdentity(p *router.Peers, spec NodeSpec, id placement.Identity, known []string) error {
	var seeds []string
	for _, m := range c.cfg.Members {
		if m.ID != spec.ID && m.ListenAddr != c.cfg.ListenAddr {
			seeds = append(seeds, m.ListenAddr)
		}
	}
	for _, a := range append(slices.Clone(c.cfg.Join), known...) {
		if a != c.cfg.ListenAddr && !slices.Contains(seeds, a) {
			seeds = append(seeds, a)
		}
	}
	if len(seeds) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	st, err := p.Placement(seeds, nil).Read(ctx)
	if err != nil {
		return nil
	}
	return placement.CheckIncarnation(st, id)
}

// knownAddrs lists the Connect addresses of the nodes in the map, once
// the router exists (before, a joining node knows only its seeds).
func (c *Cluster) knownAddrs() []string {
	if c.Router == nil {
		return nil
	}
	var out []string
	for _, n := range c.Router.Map().State().GetNodes() {
		out = append(out, n.GetListenAddr())
	}
	return out
}

// Members maps the initial members' ids to their Raft addresses.
func (c *Cluster) Members() map[uint64]string {
	m := map[uint64]string{}
	for _, mb := range c.cfg.Members {
		m[mb.ID] = mb.RaftAddr
	}
	return m
}

func (c *Cluster) observe(shardID uint64, res *shardv1.Result) {
	c.waits.Observe(shardID, res)
	if c.cfg.Observer != nil {
		c.cfg.Observer(shardID, res)
	}
}

// reconcile makes every local node run the replicas the router's map
// places on it.
func (c *Cluster) reconcile() error {
	var errs []error
	for _, a := range c.agents {
		errs = append(errs, a.Reconcile(c.Router.Map()))
	}
	return errors.Join(errs...)
}

// authBootstrap proposes the node's auth bootstrap while the cluster
// has no auth state, and says once, as an error, when the cluster runs
// without authentication that the bootstrap would have turned on
// (bootstrapIgnored).
func (c *Cluster) authBootstrap(ctx context.Context, a *placementv1.AuthState) {
	st := c.Router.Map().State().GetAuth()
	if st.GetRevision() == 0 {
		// Until every initial member has registered a binary that knows
		// auth, the placement group refuses it (ErrMetaVersion); the next
		// tick tries again.
		if err := c.Router.BootstrapAuth(ctx, a); err != nil {
			c.Router.Logger().Debug("auth bootstrap", "err", err)
		}
		return
	}
	if msg := bootstrapIgnored(st, a); msg != "" && c.bootstrapWarned.CompareAndSwap(false, true) {
		c.Router.Logger().Error(msg, "auth_revision", st.GetRevision())
	}
}

// bootstrapIgnored is what a node given the auth bootstrap boot says when
// the cluster's auth state st, set already, leaves authentication off
// although boot turns it on: a bootstrap applies only to a cluster
// without auth state, so this node serves unauthenticated calls. Either
// an operator turned authentication off on purpose, or the state was
// written while authentication was off (before any bootstrap: then
// anyone could have bound themselves a role, and enabling it as it is
// would keep those bindings). It returns "" when there is nothing to say.
func bootstrapIgnored(st, boot *placementv1.AuthState) string {
	if st.GetRevision() == 0 || st.GetEnabled() || !boot.GetEnabled() {
		return ""
	}
	return "authentication is OFF although this node was given --auth-bootstrap: the cluster's auth state was set " +
		"already, so the bootstrap does not apply; review it (warden auth show: any client could change it while " +
		"authentication was off), then turn it on (warden auth enable), or start without --auth-bootstrap if it was " +
		"turned off on purpose"
}

// loop refreshes the map, runs the node agents and, while a local node
// leads the placement group, drives the operators in progress.
func (c *Cluster) loop() {
	defer c.wg.Done()
	tick := time.NewTicker(c.cfg.MapInterval)
	defer tick.Stop()
	log := c.Router.Logger()
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := c.Router.RefreshMap(ctx); err != nil {
			log.Debug("placement map refresh", "err", err)
		}
		c.rememberPeers()
		if err := c.reconcile(); err != nil {
			log.Warn("node agent", "err", err)
		}
		if a := c.cfg.AuthBootstrap; a != nil {
			c.authBootstrap(ctx, a)
		}
		cancel()
		if len(c.Router.Map().State().GetOperators()) > 0 && c.Router.LeadsPlacement() && c.driving.CompareAndSwap(false, true) {
			// Apart from the loop: a step may wait for replicas that this
			// loop's node agent must start.
			c.wg.Go(func() {
				defer c.driving.Store(false)
				ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
				defer cancel()
				if err := c.Router.DriveOperators(ctx); err != nil {
					log.Warn("placement operator", "err", err)
				}
			})
		}
	}
}

// Close stops the loops, the router's timers and every node.
func (c *Cluster) Close() {
	c.cancel()
	close(c.stop)
	c.wg.Wait()
	c.Router.Stop()
	c.closeNodes()
}

func (c *Cluster) closeNodes() {
	c.cancel()
	for _, n := range c.Nodes {
		n.Node.Close()
	}
}
