// Command warden-load drives a lock service (Warden, etcd or ZooKeeper)
// with an open-loop workload and writes report.json, report.md and
// chart.png.
//
//	warden-load run --target warden --endpoints http://127.0.0.1:7071,... --profile reference --duration 60s \
//	    --fault kill@30s --fault snapshot@35s --fault restart@45s --out loadtest/out
//	warden-load compare --out loadtest/out warden-report.json etcd-report.json zk-report.json
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kong"

	"github.com/warden-dev/warden/loadtest/harness"
	"github.com/warden-dev/warden/loadtest/targets/etcd"
	"github.com/warden-dev/warden/loadtest/targets/warden"
	"github.com/warden-dev/warden/loadtest/targets/zk"
	"github.com/warden-dev/warden/tlsconfig"
)

type runCmd struct {
	Target           string        `help:"Service under load: warden, etcd (lease + put-if-absent), etcd-mutex (concurrency.Mutex) or zk (ephemeral sequential recipe)." enum:"warden,etcd,etcd-mutex,zk" default:"warden"`
	Endpoints        []string      `help:"The service's endpoints: Warden base URLs (http://127.0.0.1:7071), etcd client URLs or ZooKeeper host:port." required:""`
	Profile          string        `help:"Workload: reference, contended or quota." enum:"reference,contended,quota" default:"reference"`
	Scale            float64       `help:"Factor on the profile's rates and held locks (1 = 20,000 held locks, 2,000 acquires/s)." default:"1"`
	Duration         time.Duration `help:"Length of the measured phase (with --find-max, of each step)." default:"60s"`
	RampTimeout      time.Duration `help:"Longest ramp to the profile's held locks." default:"2m"`
	Fault            []string      `help:"Fault to inject, kind@time after the measured phase starts (reports show it on the run's clock, which includes the ramp): kill@30s, kill-leader@30s, restart@45s, snapshot@35s, transfer-leader@40s, mass-expiry@30s (a fleet of --mass-expiry-leases leases taken at once and left to expire together, on any target). Repeatable; run in time order."`
	MassExpiryLeases int           `name:"mass-expiry-leases" help:"Leases of the mass-expiry fault's fleet." default:"20000"`
	FindMax          bool          `help:"Step the scale up by --step-factor until p99 acquire passes 200 ms or errors pass 0.1 % (a failed step is tried once more before it counts), then bisect (--precision)."`
	StepFactor       float64       `help:"Scale factor between find-max steps." default:"1.25"`
	MaxSteps         int           `help:"Most find-max steps." default:"12"`
	Precision        float64       `help:"After the first failing find-max step, bisect between it and the last that passed until they are within this fraction of each other (below 0: no bisection)." default:"0.05"`
	MaxInFlight      int           `help:"Most operations outstanding; later arrivals count as overload errors." default:"20000"`
	OpTimeout        time.Duration `help:"Bound on one operation with its retries." default:"10s"`
	Out              string        `help:"Directory for the report files." default:"loadtest/out"`
	Prefix           string        `help:"Prefix of the report file names (default: none for warden, the target's name and a dash otherwise)."`
	Conns            int           `help:"Warden target: HTTP/2 connections to each node." default:"4"`
	SingleRenew      bool          `name:"single-renewals" help:"Warden target: one Renew call per renewal instead of sharing RenewBatch calls."`
	RenewLinger      time.Duration `name:"renew-linger" help:"Warden target: how long a renewal waits to share a RenewBatch call." default:"50ms"`
	SingleCalls      bool          `name:"single-calls" help:"Warden target: one Acquire or Release call per operation instead of sharing Batch calls."`
	BatchCalls       int           `name:"batch-calls" help:"Warden target: Batch calls each endpoint keeps in flight (0: the Go SDK's client.DefaultBatchCalls)."`
	CPUProfile       string        `name:"cpuprofile" placeholder:"FILE" help:"Write the load generator's own CPU profile (pprof) to FILE."`
	ClusterScript    string        `help:"Script that kills and starts the target's nodes (deploy/local/cluster.sh, loadtest/peers/etcd.sh, loadtest/peers/zk.sh)."`
	CACert           string        `name:"cacert" placeholder:"PATH" help:"Warden target: PEM CA that verifies the nodes (https endpoints; a cluster.sh --secure cluster's secure/ca.pem)."`
	TokenFile        string        `name:"token-file" placeholder:"PATH" help:"Warden target: file holding the bearer token to call with."`
}

type compareCmd struct {
	Out     string   `help:"Directory for compare.md." default:"loadtest/out"`
	Runs    int      `help:"How many compare runs the reports make, given run after run in the same target order; each target's median run stands for it." default:"1"`
	Reports []string `arg:"" help:"report.json files, one per target of each compare run (--runs), the runs one after the other in the same target order (w1 z1 w2 z2 …); the first target (Warden) is the base of the ratios."`
}

var cli struct {
	Run     runCmd     `cmd:"" help:"Run a profile against one target."`
	Compare compareCmd `cmd:"" help:"Write the side-by-side of several reports."`
}

// generatorGOGC is the generator's GC target unless GOGC is set: it shares
// the machine's cores with the servers under test, and at the default 100
// garbage collection was 12 % of its CPU at the reference rate, for a heap
// of a few hundred MiB on a machine with gigabytes to spare.
const generatorGOGC = 400

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(generatorGOGC)
	}
	ctx := kong.Parse(&cli, kong.Description("Load harness for Warden and its peers (etcd, ZooKeeper)."))
	ctx.FatalIfErrorf(ctx.Run())
}

func (c *runCmd) Run() error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	p, err := harness.ProfileByName(c.Profile, c.Scale)
	if err != nil {
		return err
	}
	cfg := harness.Config{
		Profile: p, Duration: c.Duration, RampTimeout: c.RampTimeout,
		FindMax: c.FindMax, StepFactor: c.StepFactor, MaxSteps: c.MaxSteps, Precision: c.Precision,
		Driver:     harness.DriverConfig{MaxInFlight: c.MaxInFlight, OpTimeout: c.OpTimeout},
		MassExpiry: harness.MassExpiryConfig{Leases: c.MassExpiryLeases},
	}
	for _, f := range c.Fault {
		fs, err := harness.ParseFault(f)
		if err != nil {
			return err
		}
		if fs.Kind == "kill" || fs.Kind == "kill-leader" || fs.Kind == "restart" {
			if c.ClusterScript == "" {
				return fmt.Errorf("fault %s: needs --cluster-script to kill and start nodes", f)
			}
		}
		cfg.Faults = append(cfg.Faults, fs)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	t, err := c.target()
	if err != nil {
		return err
	}
	defer t.Close()
	cfg.Meter = c.meter()
	if c.CPUProfile != "" {
		f, err := os.Create(c.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := harness.Run(ctx, t, cfg, log)
	if err != nil {
		return err
	}
	prefix := c.Prefix
	if prefix == "" && c.Target != "warden" {
		prefix = c.Target + "-"
	}
	if err := harness.WriteFiles(c.Out, prefix, rep); err != nil {
		return err
	}
	s := rep.Safety
	fmt.Printf("%s %s ×%g: %.0f commits/s, p99 acquire %.1f ms, safety %d/%d/%d; report in %s\n",
		rep.Target, p.Name, p.Scale, rep.CommitsPerSec, rep.Ops[harness.OpAcquire].P99MS,
		s.DoubleGrants, s.TokenRegressions, s.LostAcknowledgedLeases, filepath.Join(c.Out, prefix+"report.md"))
	if rep.MaxCommitsPerSec != nil {
		fmt.Printf("max sustained: %.0f commits/s, %.0f acquires/s\n", *rep.MaxCommitsPerSec, *rep.MaxAcquiresPerSec)
	} else if p.Name == "reference" {
		fmt.Println(rep.TargetCheck())
	}
	if n := s.DoubleGrants + s.TokenRegressions + s.LostAcknowledgedLeases; n > 0 {
		return fmt.Errorf("%d safety violations: %s", n, strings.Join(s.Examples, "; "))
	}
	for _, f := range rep.Faults {
		if f.Error != "" {
			return fmt.Errorf("fault %s at %.1f s failed: %s", f.Kind, f.AtS, f.Error)
		}
	}
	return nil
}

func (c *runCmd) target() (harness.Target, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch c.Target {
	case "etcd":
		return etcd.New(ctx, etcd.Config{Endpoints: c.Endpoints, Mode: etcd.ModeLease, Script: c.ClusterScript})
	case "etcd-mutex":
		return etcd.New(ctx, etcd.Config{Endpoints: c.Endpoints, Mode: etcd.ModeMutex, Script: c.ClusterScript})
	case "zk":
		return zk.New(ctx, zk.Config{Servers: c.Endpoints, Script: c.ClusterScript})
	}
	cfg := warden.Config{Endpoints: c.Endpoints, ConnsPerEndpoint: c.Conns, SingleRenewals: c.SingleRenew, RenewLinger: c.RenewLinger, SingleCalls: c.SingleCalls, BatchCalls: c.BatchCalls, ClusterScript: c.ClusterScript}
	if c.CACert != "" {
		var err error
		if cfg.TLS, err = tlsconfig.ClientConfig(c.CACert, "", ""); err != nil {
			return nil, err
		}
	}
	if c.TokenFile != "" {
		b, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		cfg.Token = strings.TrimSpace(string(b))
	}
	return warden.New(cfg)
}

// meter measures the target's servers: their pids from the cluster
// script (none without one), and Warden's and etcd's Prometheus counters
// at their endpoints' /metrics (ZooKeeper exports none).
func (c *runCmd) meter() *harness.Meter {
	m := &harness.Meter{}
	if c.ClusterScript != "" {
		m.PIDs = harness.ScriptPIDs(c.ClusterScript)
	}
	switch c.Target {
	case "warden":
		// Proposals are made on the node of the shard's leader, one Raft
		// entry each: their sum over the nodes is the log's entries.
		m.Entries = "warden_proposal_duration_seconds"
		if strings.HasPrefix(c.Endpoints[0], "https:") && c.CACert != "" {
			tc, err := tlsconfig.ClientConfig(c.CACert, "", "")
			if err == nil { // target() checked the same file
				m.Client = &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
			}
		}
	case "etcd", "etcd-mutex":
		// Each member's count of committed entries is the whole log's.
		m.Entries, m.EntriesPerNode = "etcd_server_proposals_committed_total", true
	default:
		return m
	}
	for _, e := range c.Endpoints {
		m.MetricsURLs = append(m.MetricsURLs, strings.TrimSuffix(e, "/")+"/metrics")
	}
	return m
}

func (c *compareCmd) Run() error {
	var reps []*harness.Report
	for _, path := range c.Reports {
		r, err := harness.ReadReport(path)
		if err != nil {
			return err
		}
		if len(reps) > 0 && (r.Profile.Name != reps[0].Profile.Name || (r.Steps == nil) != (reps[0].Steps == nil)) {
			return fmt.Errorf("%s: a %s run (find-max %v) cannot be compared with %s's %s run (find-max %v)",
				path, r.Profile.Name, r.Steps != nil, reps[0].Target, reps[0].Profile.Name, reps[0].Steps != nil)
		}
		reps = append(reps, r)
	}
	runs, err := harness.GroupRuns(reps, c.Runs)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(c.Out, "compare.md"))
	if err != nil {
		return err
	}
	harness.WriteComparison(f, runs)
	return f.Close()
}
