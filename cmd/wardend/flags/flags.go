// Package flags is wardend's command line: the flags and commands of
// CLI, with their WARDEN_… environment variables and the --config YAML
// file. It is a package of its own so that tools outside the server
// (deploy/kubernetes's tests) check the flags a manifest passes with
// wardend's own definitions.
package flags

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"go.yaml.in/yaml/v3"
)

// CLI is wardend's command line: its flags, each also read from a
// WARDEN_… environment variable (but --insecure and the debug flags) and
// from --config's YAML file, and its commands (serve, the default, and
// restore). Parse it with Parser.
type CLI struct {
	Config         kong.ConfigFlag  `placeholder:"FILE" env:"-" help:"Read flags from FILE (YAML: flag names without the dashes as keys, docs/operations.md). Command-line flags and WARDEN_… variables override it."`
	Version        kong.VersionFlag `env:"-" help:"Print the version and exit."`
	Dev            bool             `help:"Run a whole three-node cluster in this process (the embedded setup make run uses). Without it, run one production node (--node-id and the flags below)."`
	NodeID         uint64           `name:"node-id" placeholder:"ID" help:"This node's id (production mode), unique in the cluster, never reused."`
	NodeIDFrom     uint64           `name:"node-id-from-ordinal" placeholder:"BASE" help:"Take the node id from the pod's StatefulSet ordinal: BASE plus the number after the last dash of --pod-name (Kubernetes, one StatefulSet per zone with a BASE of its own: deploy/kubernetes). Excludes --node-id."`
	PodName        string           `name:"pod-name" placeholder:"NAME" help:"This pod's name, for --node-id-from-ordinal (default: the host name, which a StatefulSet sets to it)."`
	Zone           string           `help:"This node's availability zone; a shard's replicas go to distinct zones."`
	RaftAddr       string           `name:"raft-addr" help:"host:port the Raft transport binds (and advertises, unless --raft-advertise-addr)."`
	RaftAdvertise  string           `name:"raft-advertise-addr" placeholder:"HOST:PORT" help:"host:port the other nodes reach this node's Raft transport at, when it differs from --raft-addr (a 0.0.0.0 bind, NAT). Peer certificates name its host."`
	Advertise      string           `name:"advertise-addr" placeholder:"HOST:PORT" help:"host:port the other nodes and clients reach this node's Connect API at, when it differs from --listen (a 0.0.0.0 bind, NAT)."`
	InitialMembers string           `name:"initial-members" help:"The cluster's first nodes, id=raftaddr=listenaddr,... (the same list on each of them)."`
	Join           []string         `help:"Connect addresses of running nodes, for a node that is not an initial member."`
	InitialState   string           `name:"initial-cluster-state" enum:"new,existing" default:"existing" help:"new: this initial member may initialise an empty --data-dir, as every initial member of a cluster being created does on its first start (only then). existing (the default): a node whose data directory holds no state refuses to start, since a member that lost its data must never vote again under its id."`
	SecretFile     string           `name:"cluster-secret-file" placeholder:"PATH" help:"File holding the cluster secret, the same on every node (at least 16 characters). Required with --insecure, where it authenticates the nodes to each other in place of the peer certificates."`
	TLSCert        string           `name:"tls-cert" placeholder:"PATH" group:"TLS" help:"PEM certificate (chain) the client API presents on --listen. With --tls-key, serves TLS (HTTP/2 by ALPN, and HTTP/1.1). Reloaded on SIGHUP and when the file changes."`
	TLSKey         string           `name:"tls-key" placeholder:"PATH" group:"TLS" help:"PEM private key of --tls-cert."`
	TLSClientCA    string           `name:"tls-client-ca" placeholder:"PATH" group:"TLS" help:"PEM CA bundle that verifies client certificates; without it the client API asks for none. Health probes and /metrics need none either way."`
	PeerCA         string           `name:"peer-ca" placeholder:"PATH" group:"TLS" help:"PEM CA that signs the nodes' peer certificates, and only those (not the client CA): verifies the other nodes on the node API and on Raft."`
	PeerCert       string           `name:"peer-cert" placeholder:"PATH" group:"TLS" help:"PEM peer certificate of this node: names its node id (DNS node-<id>.peer.warden) and the host of --raft-addr; for server and client use."`
	PeerKey        string           `name:"peer-key" placeholder:"PATH" group:"TLS" help:"PEM private key of --peer-cert. Raft reads the peer files at start: rotate them with a rolling restart."`
	AuthBootstrap  string           `name:"auth-bootstrap" placeholder:"FILE" help:"Turn authentication on for a cluster that has no auth state yet, with the roles, bindings and tokens of FILE (JSON; docs/security.md). Give the same file to every initial member; the first to commit wins, and later starts ignore it. Needs TLS. Until it commits the node refuses client calls."`
	Insecure       bool             `group:"TLS" env:"-" help:"Serve every port in cleartext, with no TLS: the nodes authenticate each other by --cluster-secret-file alone, and anyone on the network can read and alter traffic. For tests and trusted networks; logged and exported as warden_insecure 1."`
	CORSOrigins    []string         `name:"cors-allowed-origins" placeholder:"ORIGIN,..." help:"Origins (scheme://host[:port], a port of * for any port; * for any origin) whose browser pages may call the API: Connect, gRPC-Web and gRPC-Web-text, with a bearer token. Other origins get no CORS headers. Default: none; --dev allows http://localhost:* and http://127.0.0.1:*."`
	ClockOffset    time.Duration    `name:"debug-clock-offset" hidden:"" env:"-" help:"Pretend this node's wall clock is off by this much (clock skew tests only)."`
	DataDir        string           `placeholder:"DIR" help:"Directory for Raft logs and state: required for a production node; --dev defaults to ./data/dev."`
	Listen         string           `default:"127.0.0.1:7070" help:"Address to serve the Connect API on."`
	LogLevel       slog.Level       `default:"info" help:"Log level: debug, info, warn, error."`
	RaftLogLevel   slog.Level       `default:"error" help:"Level below which Dragonboat's own logs are dropped (warn shows its election chatter)."`
	DiskReserve    string           `name:"disk-reserve" default:"1GiB" placeholder:"SIZE" help:"Free space to keep on the --data-dir filesystem: a size (512MiB, 2GiB, 10GB) or a percentage of the filesystem (5%); 0 keeps none. Below it the node refuses to propose (unavailable, naming the disk), hands the shards it leads to other nodes, and /readyz is not ready, while it serves reads and keeps following its leaders; it accepts writes again once space is freed. With less than a quarter of it left, the node exits (code 28) with one line naming the directory, before a write can fail. Not for --dev."`
	ShutdownWait   time.Duration    `default:"10s" help:"How long a graceful shutdown waits for RPCs in flight."`
	AuditLog       string           `help:"Write the audit log (one JSON line per state-changing call, with its principal) to this file, or - for stderr. Reopened on SIGHUP, for rotation."`
	MetricsAuth    bool             `name:"metrics-auth" help:"With authentication on, serve /metrics only to a caller allowed read on every key (without it, any other caller gets the metrics without the series that name quota pools)."`
	PprofAddr      string           `name:"pprof-addr" placeholder:"HOST:PORT" help:"Serve Go's profiler (/debug/pprof/) on this address, for performance work; keep it on loopback. Off by default."`

	Serve   struct{} `cmd:"" default:"withargs" help:"Run the node, or with --dev the whole dev cluster (the default command)."`
	Restore Restore  `cmd:"" help:"Write an empty --data-dir from a backup (warden admin backup --out), for this node's first start in the restored cluster; takes the node's usual flags (--node-id, --zone, --data-dir, or --dev). Every node of the backup restores its own directory from the same backup, then all start with --initial-members naming them."`
}

// Restore is wardend restore's own flags.
type Restore struct {
	From          string `required:"" placeholder:"DIR" help:"The backup directory (warden admin backup --out DIR)."`
	VerifyKey     string `name:"verify-key" placeholder:"FILE.pub" help:"The public key (warden admin backup-key --out FILE writes FILE.pub) whose private key signed the backup (warden admin backup --signing-key): an unsigned backup, one signed by another key, and one changed since it was signed are refused. One of --verify-key and --allow-unsigned is required."`
	AllowUnsigned bool   `name:"allow-unsigned" help:"Restore without checking a signature (a backup taken without --signing-key, or before signatures): a backup holds the auth state, so whoever can write one can plant credentials."`
	MinEpoch      uint64 `name:"min-epoch" placeholder:"EPOCH" help:"The lowest fencing-token epoch the restored shards may take: the old cluster's epoch limit (warden admin shards shows it), if it can still be read; never below the backup's. Default: the backup's epoch limit plus 65,536 (placement.RestoreEpochGap). Give every node the same value."`
}

// ResolveNodeID sets NodeID from --node-id-from-ordinal: BASE plus the
// ordinal at the end of the pod name (PodName, else hostname's), as in
// "warden-az2-0". It does nothing without the flag, and refuses it with
// --node-id, and a name that ends in no ordinal.
func (c *CLI) ResolveNodeID(hostname func() (string, error)) error {
	if c.NodeIDFrom == 0 {
		return nil
	}
	if c.NodeID != 0 {
		return errors.New("--node-id and --node-id-from-ordinal exclude each other")
	}
	name := c.PodName
	if name == "" {
		var err error
		if name, err = hostname(); err != nil {
			return fmt.Errorf("--node-id-from-ordinal: the host name: %w", err)
		}
	}
	i := strings.LastIndexByte(name, '-')
	ord, err := strconv.ParseUint(name[i+1:], 10, 32)
	if i < 0 || err != nil {
		return fmt.Errorf("--node-id-from-ordinal: pod name %q does not end in -ORDINAL (a StatefulSet's pod: give --pod-name)", name)
	}
	c.NodeID = c.NodeIDFrom + ord
	return nil
}

// Parser returns wardend's parser of c: its flags, each also read from a
// WARDEN_… environment variable (but --insecure and the debug flags) and
// from --config's file, the command line winning over the environment
// and the environment over the file. version is what --version prints.
func Parser(c *CLI, version string) (*kong.Kong, error) {
	return kong.New(c, kong.Name("wardend"), kong.Description("Warden: exclusive locks with leases and fencing tokens, replicated by Raft."),
		kong.DefaultEnvars("WARDEN"), kong.Configuration(yamlConfig), kong.Vars{"version": version})
}

// noFileSource lists the flags that only the command line may set: the
// safety overrides (--insecure and the debug flags: docs/security.md),
// and the config file itself.
var noFileSource = []string{"insecure", "debug-clock-offset", "config", "version", "help"}

// yamlConfig is the config-file loader (wardend --config): a YAML
// mapping from flag names, as on the command line without the dashes,
// to their values (lists for repeatable flags), for example
//
//	node-id: 1
//	zone: az1
//	raft-addr: 10.0.1.5:7100
//	listen: 0.0.0.0:7070
//	advertise-addr: node1.example:7070
//	join: [node2.example:7070, node3.example:7070]
//
// A key that is not a flag, or names one without a file source, is
// refused naming it.
func yamlConfig(r io.Reader) (kong.Resolver, error) {
	var values map[string]any
	if err := yaml.NewDecoder(r).Decode(&values); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("--config: %w", err)
	}
	return fileResolver(values), nil
}

type fileResolver map[string]any

// Validate refuses keys that are no flag, or a flag without a file
// source.
func (f fileResolver) Validate(app *kong.Application) error {
	flags := map[string]bool{}
	for _, fl := range app.Flags {
		flags[fl.Name] = true
	}
	for key := range f {
		switch {
		case slices.Contains(noFileSource, key):
			return fmt.Errorf("--config: %q can only be given on the command line", key)
		case !flags[key]:
			return fmt.Errorf("--config: %q is not a wardend flag (keys are flag names without the dashes)", key)
		}
	}
	return nil
}

// Resolve returns the file's value of flag, if any, unless the flag's
// environment variable is set: kong applies resolvers before the
// environment, and the environment is to win over the file (as the
// command line wins over both).
func (f fileResolver) Resolve(_ *kong.Context, _ *kong.Path, flag *kong.Flag) (any, error) {
	if slices.Contains(noFileSource, flag.Name) {
		return nil, nil
	}
	for _, e := range flag.Envs {
		if _, set := os.LookupEnv(e); set {
			return nil, nil
		}
	}
	v, ok := f[flag.Name]
	if !ok {
		return nil, nil
	}
	if list, ok := v.([]any); ok {
		// kong takes a repeatable flag's values joined by its separator.
		parts := make([]string, len(list))
		for i, x := range list {
			parts[i] = fmt.Sprint(x)
		}
		return strings.Join(parts, ","), nil
	}
	return v, nil
}
