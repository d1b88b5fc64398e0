// Command warden is Warden's command-line client.
//
//	warden lock acquire orders/42 --ttl 30s --holder worker-a
//	warden lock renew orders/42 LEASE_ID
//	warden lock release orders/42 LEASE_ID
//	warden lock describe orders/42
//	warden watch orders/42
//	warden admin shards
//	warden admin split 1
//
// Every command takes --endpoints (default http://127.0.0.1:7070; --addr
// is an alias) and --json, which prints the response as Connect JSON;
// every flag also reads WARDEN_<FLAG> (but --request-id). Errors go to
// stderr with their Connect code (JSON with --json), and the exit status
// tells the kind apart (exit.go, warden --help).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/alecthomas/kong"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/tlsconfig"
)

type globals struct {
	Endpoints []string      `default:"http://127.0.0.1:7070" sep:"," aliases:"addr" env:"WARDEN_ENDPOINTS,WARDEN_ADDR" placeholder:"URL" help:"Warden nodes to call, comma-separated (host:port or http(s)://host:port): a node that cannot be reached is skipped for the next. --addr and WARDEN_ADDR are aliases."`
	JSON      bool          `name:"json" help:"Print responses as JSON (errors too, on stderr)."`
	Timeout   time.Duration `default:"10s" help:"Deadline of the RPC."`
	CACert    string        `name:"cacert" env:"WARDEN_CACERT" placeholder:"PATH" help:"PEM CA bundle that verifies the node's certificate (https endpoints; default: the system's roots)."`
	Cert      string        `env:"WARDEN_CERT" placeholder:"PATH" help:"PEM client certificate to present, with --key."`
	Key       string        `env:"WARDEN_KEY" placeholder:"PATH" help:"PEM private key of --cert."`
	Token     string        `env:"WARDEN_TOKEN" placeholder:"TOKEN" help:"Bearer token to authenticate with (prefer --token-file or WARDEN_TOKEN: a flag shows in ps)."`
	TokenFile string        `name:"token-file" env:"WARDEN_TOKEN_FILE" placeholder:"PATH" help:"File holding the bearer token alone on one line."`
	out       io.Writer
	http      *http.Client
	// root ends on SIGINT or SIGTERM.
	root context.Context
	// base is the first endpoint's URL: the connect clients' base, whose
	// host the failover transport replaces.
	base string
	// endpoints are --endpoints parsed, and transport carries a request
	// to one of them (TLS, the bearer token), for the SDK (lock run),
	// which fails over by itself.
	endpoints []*url.URL
	transport http.RoundTripper
}

// httpClient returns the HTTP client of the global flags: the default
// one, or one with their TLS material and bearer token.
func (g *globals) httpClient() (*http.Client, error) {
	token := g.Token
	if g.TokenFile != "" {
		if token != "" {
			return nil, usage(errors.New("--token and --token-file exclude each other"))
		}
		b, err := os.ReadFile(g.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	var t http.RoundTripper = http.DefaultTransport
	if g.CACert != "" || g.Cert != "" || g.Key != "" {
		cfg, err := tlsconfig.ClientConfig(g.CACert, g.Cert, g.Key)
		if err != nil {
			return nil, err
		}
		t = &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
	}
	if token != "" {
		t = bearerTransport{token: token, next: t}
	}
	endpoints, err := parseEndpoints(g.Endpoints, g.CACert != "" || g.Cert != "")
	if err != nil {
		return nil, err
	}
	g.endpoints, g.transport, g.base = endpoints, t, endpoints[0].String()
	return &http.Client{Transport: &failover{endpoints: endpoints, next: t}}, nil
}

// bearerTransport adds the bearer token to every request.
type bearerTransport struct {
	token string
	next  http.RoundTripper
}

func (b bearerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(req)
}

type cli struct {
	globals
	Lock  lockCmd  `cmd:"" help:"Exclusive locks with leases and fencing tokens."`
	Watch watchCmd `cmd:"" help:"Print a lock's events as they happen, one line each (GRANTED, RELEASED, EXPIRED, REVOKED with the token), beginning with its holder; runs until SIGINT."`
	Quota quotaCmd `cmd:"" help:"Reserve, commit and release capacity against hierarchical limits."`
	Admin adminCmd `cmd:"" help:"Operator commands."`
	Auth  authCmd  `cmd:"" help:"Authentication and roles: turn it on, roles and bindings, tokens."`
	TLS   tlsCmd   `cmd:"" name:"tls" help:"TLS material for tests and local clusters."`
}

type adminCmd struct {
	HotResources hotCmd        `cmd:"" name:"hot-resources" help:"Locks with the most waiters and the highest acquire rate."`
	Backup       backupCmd     `cmd:"" help:"Take a consistent backup of every shard and the placement state into a new directory (wardend restore reads it); --signing-key signs it."`
	BackupKey    backupKeyCmd  `cmd:"" name:"backup-key" help:"Create an Ed25519 key pair for signing backups: FILE (private, for backup --signing-key) and FILE.pub (for wardend restore --verify-key)."`
	Nodes        nodesCmd      `cmd:"" help:"List the cluster's nodes and zones."`
	Node         nodeCmd       `cmd:"" help:"Node lifecycle: remove a node."`
	Shards       shardsCmd     `cmd:"" help:"List the data shards: ranges, epochs, replicas, leaders, load."`
	Split        splitCmd      `cmd:"" help:"Split a shard's hash range in two (at --at, default the middle)."`
	Move         moveCmd       `cmd:"" help:"Move a shard's replica from one node to another."`
	Operations   operationsCmd `cmd:"" help:"List the operations (splits, moves, node removals, rebalances) in progress and the last ones that ended."`
	Operation    operationCmd  `cmd:"" help:"Show one operation: its state, step and progress (a node removal's or rebalance's steps)."`
	Rebalance    rebalCmd      `cmd:"" help:"Add missing replicas and placement voters (after a forced removal), then even out replicas within zones and leaders across nodes (--dry-run: print the plan)."`
	Leader       leaderCmd     `cmd:"" help:"Move a shard's leadership to its replica on a node."`
	Snapshot     snapCmd       `cmd:"" help:"Snapshot a shard's replicas (all shards without an id) and compact their logs."`
	SetConfig    configCmd     `cmd:"" name:"set-config" help:"Change a shard's replicated config (all shards with id 0)."`
}

type hotCmd struct {
	Limit uint32 `default:"10" help:"How many resources in each list (at most 100)."`
}

// Run sends AdminService.HotResources.
func (h *hotCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.admin().HotResources(ctx,
		connect.NewRequest(&wardenv1.HotResourcesRequest{Limit: h.Limit}))
	if err != nil {
		return fmt.Errorf("hot-resources: %w", err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		fmt.Fprintln(w, "by waiters:")
		for _, r := range resp.Msg.GetByWaiters() {
			fmt.Fprintf(w, "  %6d  %s\n", r.GetWaiters(), r.GetResource())
		}
		fmt.Fprintln(w, "by acquires per second (this node):")
		for _, r := range resp.Msg.GetByAcquireRate() {
			fmt.Fprintf(w, "  %6.1f  %s\n", r.GetAcquiresPerSecond(), r.GetResource())
		}
	})
}

type lockCmd struct {
	Run      lockRunCmd  `cmd:"" help:"Hold a lock while a command runs (warden lock run RESOURCE -- CMD ARGS…): renews the lease, gives the command WARDEN_FENCING_TOKEN and WARDEN_RESOURCE, and stops it before the lease could pass to another."`
	Acquire  acquireCmd  `cmd:"" help:"Acquire a lock once and print its lease; it is not renewed (warden lock renew, or lock run, which renews): it ends at its TTL."`
	Renew    renewCmd    `cmd:"" help:"Renew a lease by its lease TTL."`
	Release  releaseCmd  `cmd:"" help:"Release a lease; a stale lease id is a no-op."`
	Describe describeCmd `cmd:"" help:"Show who holds a lock (never the lease id)."`
	Revoke   revokeCmd   `cmd:"" help:"End the lease a stuck holder keeps renewing (needs admin): the lease with --fencing-token, as lock describe shows it, and nothing else; the lock passes to its next waiter."`
}

type acquireCmd struct {
	Resource  string        `arg:"" help:"Resource to lock."`
	RequestID string        `name:"request-id" env:"-" help:"Idempotency key; reuse it to retry. Default: a random one, printed."`
	TTL       time.Duration `name:"ttl" help:"Lease TTL (default: the shard's, 30s)."`
	Wait      time.Duration `help:"How long to wait in the lock's queue when it is held (0: fail at once)."`
	Holder    string        `help:"Free text recorded as the holder."`
	Tenant    string        `help:"Tenant the request counts against."`
}

type renewCmd struct {
	Resource string `arg:""`
	LeaseID  string `arg:"" name:"lease-id"`
}

type releaseCmd struct {
	Resource string `arg:""`
	LeaseID  string `arg:"" name:"lease-id"`
}

type describeCmd struct {
	Resource string `arg:""`
}

func main() {
	os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
}

// runMain runs warden with args, printing its output to stdout and an
// error to stderr, and returns the exit status (exit.go).
func runMain(args []string, stdout, stderr io.Writer) int {
	root, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	asJSON, err := run(root, args, stdout)
	var ee *exitError
	if err != nil && root.Err() != nil && !errors.As(err, &ee) {
		err = fmt.Errorf("%w: %v", errInterrupted, err)
	}
	if err != nil && !(errors.As(err, &ee) && ee.err == nil) {
		printError(stderr, err, asJSON)
	}
	return exitStatus(err)
}

// run parses args and runs the command, printing its output to out, and
// says whether errors are to be JSON (--json, or WARDEN_JSON).
func run(root context.Context, args []string, out io.Writer) (asJSON bool, err error) {
	var c cli
	parser, err := kong.New(&c, kong.Name("warden"), kong.Description("Command-line client for Warden.\n\n"+exitHelp),
		kong.UsageOnError(), kong.DefaultEnvars("WARDEN"))
	if err != nil {
		return false, err
	}
	ctx, err := parser.Parse(args)
	if err != nil {
		return slices.Contains(args, "--json"), err
	}
	c.out, c.root = out, root
	if c.http, err = c.httpClient(); err != nil {
		return c.JSON, err
	}
	return c.JSON, ctx.Run(&c.globals)
}

func (g *globals) client() wardenv1connect.LockServiceClient {
	return wardenv1connect.NewLockServiceClient(g.http, g.base)
}

// ctx is the deadline of one call: --timeout, ended early by SIGINT.
func (g *globals) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(g.root, g.Timeout)
}

// print writes m as JSON with --json, else runs human.
func (g *globals) print(m proto.Message, human func(w io.Writer)) error {
	if g.JSON {
		// The server's JSON form: proto field names, zero values written.
		b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
		if err != nil {
			return err
		}
		var out bytes.Buffer
		if err := json.Compact(&out, b); err != nil {
			return err
		}
		_, err = fmt.Fprintln(g.out, out.String())
		return err
	}
	human(g.out)
	return nil
}

// Run sends Acquire with a random request id unless --request-id is given.
func (a *acquireCmd) Run(g *globals) error {
	req := &wardenv1.AcquireRequest{Resource: a.Resource, RequestId: a.RequestID, Holder: a.Holder, Tenant: a.Tenant}
	if req.RequestId == "" {
		b := make([]byte, 12)
		rand.Read(b)
		req.RequestId = hex.EncodeToString(b)
	}
	if a.TTL != 0 {
		req.LeaseTtl = durationpb.New(a.TTL)
	}
	if a.Wait != 0 {
		req.WaitTimeout = durationpb.New(a.Wait)
		g.Timeout = max(g.Timeout, a.Wait+10*time.Second)
	}
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.client().Acquire(ctx, connect.NewRequest(req))
	if a.Wait != 0 && connect.CodeOf(err) == connect.CodeDeadlineExceeded && ctx.Err() == nil {
		// The server's answer, not our deadline: the wait ended.
		return &exitError{status: exitHeld, err: fmt.Errorf("acquire %s (request id %s): waited %v without the lock: %w", a.Resource, req.RequestId, a.Wait, err)}
	}
	if err != nil {
		return fmt.Errorf("acquire %s (request id %s): %w", a.Resource, req.RequestId, err)
	}
	m := resp.Msg
	return g.print(m, func(w io.Writer) {
		fmt.Fprintf(w, "acquired %s\n", a.Resource)
		fmt.Fprintf(w, "  lease_id       %s\n", m.GetLeaseId())
		fmt.Fprintf(w, "  fencing_token  %d\n", m.GetFencingToken())
		fmt.Fprintf(w, "  expires_at     %s\n", when(m.GetExpiresAt()))
		fmt.Fprintf(w, "  lease_ttl      %s\n", m.GetLeaseTtl().AsDuration())
		fmt.Fprintf(w, "  request_id     %s\n", req.RequestId)
	})
}

// Run sends Renew.
func (r *renewCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.client().Renew(ctx, connect.NewRequest(&wardenv1.RenewRequest{Resource: r.Resource, LeaseId: r.LeaseID}))
	if err != nil {
		return fmt.Errorf("renew %s: %w", r.Resource, err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		fmt.Fprintf(w, "renewed %s until %s\n", r.Resource, when(resp.Msg.GetExpiresAt()))
	})
}

// Run sends Release.
func (r *releaseCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.client().Release(ctx, connect.NewRequest(&wardenv1.ReleaseRequest{Resource: r.Resource, LeaseId: r.LeaseID}))
	if err != nil {
		return fmt.Errorf("release %s: %w", r.Resource, err)
	}
	return g.print(resp.Msg, func(w io.Writer) {
		switch {
		case resp.Msg.GetReleased():
			fmt.Fprintf(w, "released %s\n", r.Resource)
		case resp.Msg.GetAlreadyReleased():
			fmt.Fprintf(w, "released already: a Release of that lease ended it (%s)\n", r.Resource)
		default:
			fmt.Fprintf(w, "not released: %s is not held by that lease (expired, revoked or replaced)\n", r.Resource)
		}
	})
}

// Run sends Describe.
func (d *describeCmd) Run(g *globals) error {
	ctx, cancel := g.ctx()
	defer cancel()
	resp, err := g.client().Describe(ctx, connect.NewRequest(&wardenv1.DescribeRequest{Resource: d.Resource}))
	if err != nil {
		return fmt.Errorf("describe %s: %w", d.Resource, err)
	}
	m := resp.Msg
	return g.print(m, func(w io.Writer) {
		if !m.GetHeld() {
			fmt.Fprintf(w, "%s is free (last fencing token %d)\n", d.Resource, m.GetFencingToken())
			return
		}
		fmt.Fprintf(w, "%s is held\n", d.Resource)
		fmt.Fprintf(w, "  holder         %s\n", m.GetHolder())
		fmt.Fprintf(w, "  fencing_token  %d\n", m.GetFencingToken())
		fmt.Fprintf(w, "  expires_at     %s\n", when(m.GetExpiresAt()))
		fmt.Fprintf(w, "  waiters        %d\n", m.GetWaiters())
	})
}

func when(ts *timestamppb.Timestamp) string {
	t := ts.AsTime()
	return fmt.Sprintf("%s (in %s)", t.Format(time.RFC3339Nano), time.Until(t).Round(time.Millisecond))
}

// describeErr adds a Connect error's details to its message.
func describeErr(err error) string {
	msg := err.Error()
	var unknownCA x509.UnknownAuthorityError
	var badName x509.HostnameError
	switch {
	case errors.As(err, &unknownCA):
		// connect answers a failed handshake unavailable, which reads as
		// "retry": it is a setup error.
		return msg + " (the node's certificate is not signed by a CA this client trusts: pass --cacert or WARDEN_CACERT)"
	case errors.As(err, &badName):
		return msg + " (the node's certificate does not name the host of --addr)"
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return msg
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		switch v := v.(type) {
		case *wardenv1.LockHeld:
			msg += fmt.Sprintf(" (held with fencing token %d until %s)", v.GetFencingToken(), when(v.GetExpiresAt()))
		case *wardenv1.FieldViolation:
			msg += fmt.Sprintf(" (field %s)", v.GetField())
		case *wardenv1.QuotaExhausted:
			msg += fmt.Sprintf(" (%s at %s: %d left", v.GetReason(), v.GetLevel(), v.GetRemaining())
			if v.GetRetryAfter() != nil {
				msg += fmt.Sprintf(", retry after %v", v.GetRetryAfter().AsDuration().Round(time.Millisecond))
			}
			msg += ")"
		}
	}
	return msg
}
