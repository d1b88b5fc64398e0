/**
 * Test harness: starts real `wardend` processes — a whole dev cluster in
 * one process ({@link startDev}) or a three-process cluster
 * ({@link startCluster}, optionally with TLS and authentication) — on free
 * loopback ports with temporary data directories, and controls them
 * (SIGKILL, SIGSTOP/SIGCONT, restart).
 *
 * Binaries come from the environment variables `WARDEND` and `WARDEN`,
 * defaulting to `bin/wardend` and `bin/warden` of the repository root
 * ({@link repoRoot}: the directory whose go.mod declares
 * `module github.com/warden-dev/warden`, found upward from this file, so
 * also when a bundler copied the harness elsewhere in the repository);
 * `make build` at the repository root makes them.
 *
 * Every process the harness spawns dies with the test process: on a normal
 * exit, on SIGINT/SIGTERM/SIGHUP, and — through a small watchdog per
 * process — when the test process is SIGKILLed. Set `WARDEN_KEEP=1` to keep
 * the data directories and logs (`node-N.log`) after `stop()`.
 */
import { spawn, execFile, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import * as http from "node:http";
import * as https from "node:https";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const rootModule = /^module\s+github\.com\/warden-dev\/warden\s*$/m;

/**
 * The repository root: the nearest directory above `from` whose go.mod
 * declares `module github.com/warden-dev/warden` (not the SDK's
 * `…/warden/client`), or undefined.
 */
function findRepoRoot(from: string): string | undefined {
  for (let dir = resolve(from); ; ) {
    try {
      if (rootModule.test(readFileSync(join(dir, "go.mod"), "utf8"))) return dir;
    } catch {
      // no go.mod here
    }
    const up = dirname(dir);
    if (up === dir) return undefined;
    dir = up;
  }
}

/**
 * The repository root, found from this file's location (so that it is
 * right whether this runs from test/, dist/test/ or bundled elsewhere in
 * the repository, e.g. ui/test-build/), else from the working directory.
 */
export const repoRoot = findRepoRoot(dirname(fileURLToPath(import.meta.url))) ?? findRepoRoot(process.cwd()) ?? process.cwd();

/** Path of the wardend binary ($WARDEND, default <repo>/bin/wardend). */
export const wardendPath = process.env.WARDEND ?? join(repoRoot, "bin/wardend");
/** Path of the warden CLI binary ($WARDEN, default <repo>/bin/warden). */
export const wardenPath = process.env.WARDEN ?? join(repoRoot, "bin/warden");

function requireBinary(path: string, env: string): void {
  if (!existsSync(path)) {
    throw new Error(
      `harness: ${path} does not exist. Run \`make build\` in ${repoRoot} (or set ${env} to the binary).`,
    );
  }
}

// ---------------------------------------------------------------------------
// Process bookkeeping: everything spawned dies with this process.

const live = new Set<ChildProcess>();
const tempDirs = new Set<string>();

function killAllSync(): void {
  for (const c of live) {
    if (c.pid === undefined) continue;
    try {
      process.kill(c.pid, "SIGCONT");
      process.kill(c.pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
  live.clear();
  if (!process.env.WARDEN_KEEP) {
    for (const d of tempDirs) rmSync(d, { recursive: true, force: true });
  }
  tempDirs.clear();
}

let hooksInstalled = false;
function installExitHooks(): void {
  if (hooksInstalled) return;
  hooksInstalled = true;
  process.on("exit", killAllSync);
  for (const [sig, n] of [["SIGINT", 2], ["SIGTERM", 15], ["SIGHUP", 1]] as const) {
    process.once(sig, () => {
      killAllSync();
      process.exit(128 + n);
    });
  }
}

/**
 * Starts a watchdog that SIGKILLs pid once this process is gone (even
 * when it was SIGKILLed and no exit hook ran); it ends when pid ends.
 */
function watchdog(pid: number): void {
  const script =
    `while kill -0 ${process.pid} 2>/dev/null && kill -0 ${pid} 2>/dev/null; do sleep 0.5; done; ` +
    `kill -CONT ${pid} 2>/dev/null; kill -KILL ${pid} 2>/dev/null`;
  spawn("sh", ["-c", script], { stdio: "ignore", detached: true }).unref();
}

/** Makes a temporary directory that is removed at exit (unless WARDEN_KEEP is set). */
export function tempDir(prefix = "warden-ts-"): string {
  installExitHooks();
  const d = mkdtempSync(join(tmpdir(), prefix));
  tempDirs.add(d);
  return d;
}

/** Returns a free TCP port on 127.0.0.1 (binds port 0, reads it, closes). */
export function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.unref();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      if (a === null || typeof a === "string") {
        s.close();
        rej(new Error("harness: no port"));
        return;
      }
      s.close(() => res(a.port));
    });
  });
}

/** Resolves after ms milliseconds (a ref'd timer: keeps the process alive). */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

// ---------------------------------------------------------------------------
// Public types.

/** TLS and authentication material of a secure cluster (absolute paths and token values). */
export interface SecureMaterial {
  /** Directory written by `warden tls local`. */
  dir: string;
  /** PEM of the CA that signed the nodes' client-API certificates (and client.pem). */
  ca: string;
  /** Path of ca.pem. */
  caPath: string;
  /** Client certificate PEM (principal "client", role orders: lock under orders/). */
  clientCert: string;
  /** Client key PEM. */
  clientKey: string;
  /** Bearer token of principal "admin" (role operator: every permission). */
  adminToken: string;
  /** Bearer token of principal "orders" (role orders: lock under "orders/" only). */
  ordersToken: string;
  /** Path of admin.token (for `warden --token-file`). */
  adminTokenPath: string;
}

/** Result of a CLI run. */
export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** A running set of wardend processes: a dev cluster (size 1) or a multi-process cluster. */
export interface WardenCluster {
  /** Root temporary directory (data dirs, logs, TLS material). */
  readonly dir: string;
  /** Number of processes (1 for dev). */
  readonly size: number;
  /** Base URLs of the nodes, node 1 first ("http://127.0.0.1:PORT" or "https://…"). */
  readonly endpoints: string[];
  /** TLS and token material when started with `secure: true`. */
  readonly secure?: SecureMaterial;
  /** Base URL of node n (1-based). */
  url(n?: number): string;
  /** "host:port" of node n's client API. */
  addr(n?: number): string;
  /** pid of node n's process, undefined when it is not running. */
  pid(n?: number): number | undefined;
  /** The log (stdout+stderr) of node n so far. */
  log(n?: number): string;
  /** SIGKILLs node n and waits for it to exit. */
  kill(n?: number): Promise<void>;
  /** SIGSTOPs node n. */
  pause(n?: number): void;
  /** SIGCONTs node n. */
  resume(n?: number): void;
  /** Stops node n if it runs (SIGTERM, then SIGKILL after 5 s), starts it again with the same data dir, waits until ready. */
  restart(n?: number): Promise<void>;
  /** Waits until node n (default: every running node) is ready. */
  waitReady(n?: number, timeoutMs?: number): Promise<void>;
  /** Runs `warden --addr url(1) [TLS/token flags] ...args` with a timeout (default 20 s). */
  cli(args: string[], opts?: { timeoutMs?: number; node?: number; noAuth?: boolean }): Promise<CliResult>;
  /** Stops every node (SIGCONT, SIGTERM, then SIGKILL after 5 s) and removes the directory (unless WARDEN_KEEP is set). */
  stop(): Promise<void>;
}

/** Options of {@link startDev}. */
export interface StartDevOptions {
  /** Extra wardend flags. */
  extraArgs?: string[];
  /** How long to wait for readiness, ms (default 60000). */
  readyTimeoutMs?: number;
}

/** Options of {@link startCluster}. */
export interface StartClusterOptions {
  /** Number of nodes (default 3). */
  nodes?: number;
  /**
   * Extra wardend flags for node n (1-based), called at each start of the
   * node (restarts too). `endpoints` are every node's base URL, node 1
   * first, known before any node starts: e.g.
   * `(n, endpoints) => ["--cors-allowed-origins", endpoints.filter((_, i) => i !== n - 1).join(",")]`.
   */
  extraArgs?: (n: number, endpoints: string[]) => string[];
  /** Serve TLS with authentication on (like `deploy/local/cluster.sh start --secure`). */
  secure?: boolean;
  /** How long to wait for readiness, ms (default 90000). */
  readyTimeoutMs?: number;
}

// ---------------------------------------------------------------------------
// Implementation.

interface NodeSpec {
  n: number;
  listen: string;
  args: (first: boolean) => string[];
  logPath: string;
  proc?: ChildProcess;
  exited?: Promise<void>;
  started: boolean;
}

function httpGet(url: string, ca: string | undefined, timeoutMs: number): Promise<{ status: number; body: string }> {
  return new Promise((res, rej) => {
    const u = new URL(url);
    const mod = u.protocol === "https:" ? https : http;
    const req = mod.request(u, { method: "GET", ca, timeout: timeoutMs, agent: false }, (resp) => {
      let body = "";
      resp.setEncoding("utf8");
      resp.on("data", (d: string) => (body += d));
      resp.on("end", () => res({ status: resp.statusCode ?? 0, body }));
      resp.on("error", rej);
    });
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", rej);
    req.end();
  });
}

function runCli(args: string[], timeoutMs: number): Promise<CliResult> {
  return new Promise((res) => {
    execFile(wardenPath, args, { timeout: timeoutMs, killSignal: "SIGKILL" }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof err.code === "number" ? err.code : 1;
      res({ code, stdout, stderr });
    });
  });
}

class Cluster implements WardenCluster {
  readonly endpoints: string[];
  readonly size: number;

  constructor(
    readonly dir: string,
    private readonly nodes: NodeSpec[],
    private readonly scheme: "http" | "https",
    readonly secure: SecureMaterial | undefined,
    private readonly readyTimeoutMs: number,
  ) {
    this.size = nodes.length;
    this.endpoints = nodes.map((s) => `${scheme}://${s.listen}`);
  }

  private node(n = 1): NodeSpec {
    const s = this.nodes[n - 1];
    if (s === undefined) throw new Error(`harness: no node ${n} (cluster of ${this.size})`);
    return s;
  }

  url(n = 1): string {
    return `${this.scheme}://${this.node(n).listen}`;
  }

  addr(n = 1): string {
    return this.node(n).listen;
  }

  pid(n = 1): number | undefined {
    return this.node(n).proc?.pid;
  }

  log(n = 1): string {
    try {
      return readFileSync(this.node(n).logPath, "utf8");
    } catch {
      return "";
    }
  }

  start(n: number): void {
    const s = this.node(n);
    const fd = openSync(s.logPath, "a");
    const proc = spawn(wardendPath, s.args(!s.started), { stdio: ["ignore", fd, fd] });
    closeSync(fd);
    s.started = true;
    if (proc.pid === undefined) throw new Error(`harness: could not spawn ${wardendPath}`);
    proc.unref();
    live.add(proc);
    watchdog(proc.pid);
    s.proc = proc;
    s.exited = new Promise((r) =>
      proc.once("exit", () => {
        live.delete(proc);
        if (s.proc === proc) s.proc = undefined;
        r();
      }),
    );
  }

  /** Waits for node n's exit, at most ms; a ref'd timer keeps the process alive meanwhile. */
  private async waitExit(s: NodeSpec, ms: number): Promise<boolean> {
    if (s.proc === undefined || s.exited === undefined) return true;
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<boolean>((r) => (timer = setTimeout(() => r(false), ms)));
    const ok = await Promise.race([s.exited.then(() => true), timedOut]);
    clearTimeout(timer);
    return ok;
  }

  private signal(n: number, sig: NodeJS.Signals): void {
    const s = this.node(n);
    if (s.proc?.pid === undefined) throw new Error(`harness: node ${n} is not running`);
    process.kill(s.proc.pid, sig);
  }

  async kill(n = 1): Promise<void> {
    const s = this.node(n);
    if (s.proc === undefined) return;
    this.signal(n, "SIGKILL");
    if (!(await this.waitExit(s, 10_000))) throw new Error(`harness: node ${n} did not exit after SIGKILL`);
  }

  pause(n = 1): void {
    this.signal(n, "SIGSTOP");
  }

  resume(n = 1): void {
    this.signal(n, "SIGCONT");
  }

  private async terminate(s: NodeSpec): Promise<void> {
    const pid = s.proc?.pid;
    if (pid === undefined) return;
    try {
      process.kill(pid, "SIGCONT");
      process.kill(pid, "SIGTERM");
    } catch {
      return;
    }
    if (await this.waitExit(s, 5_000)) return;
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      return;
    }
    await this.waitExit(s, 10_000);
  }

  async restart(n = 1): Promise<void> {
    const s = this.node(n);
    await this.terminate(s);
    this.start(n);
    await this.waitReady(n);
  }

  async waitReady(n?: number, timeoutMs = this.readyTimeoutMs): Promise<void> {
    const which = n === undefined ? this.nodes.filter((s) => s.proc !== undefined).map((s) => s.n) : [n];
    const deadline = Date.now() + timeoutMs;
    for (const i of which) {
      const s = this.node(i);
      let last = "";
      for (;;) {
        if (s.proc === undefined) {
          throw new Error(`harness: node ${i} exited before it was ready; log:\n${tail(this.log(i))}`);
        }
        try {
          const r = await httpGet(`${this.url(i)}/readyz`, this.secure?.ca, 2_000);
          last = `${r.status} ${r.body.trim()}`;
          if (r.status === 200 && (JSON.parse(r.body) as { status?: string }).status === "ready") break;
        } catch (e) {
          last = String(e);
        }
        if (Date.now() > deadline) {
          throw new Error(`harness: node ${i} not ready within ${timeoutMs} ms (last: ${last}); log:\n${tail(this.log(i))}`);
        }
        await sleep(100);
      }
      // Readiness is per local replica; the admin API answering proves the node serves clients.
      for (;;) {
        const r = await this.cli(["--timeout", "2s", "admin", "nodes"], { node: i, timeoutMs: 5_000 });
        if (r.code === 0) break;
        if (Date.now() > deadline) {
          throw new Error(`harness: node ${i}: admin nodes failed within ${timeoutMs} ms: ${r.stderr}; log:\n${tail(this.log(i))}`);
        }
        await sleep(100);
      }
    }
  }

  cli(args: string[], opts: { timeoutMs?: number; node?: number; noAuth?: boolean } = {}): Promise<CliResult> {
    const flags = ["--addr", this.url(opts.node ?? 1)];
    if (this.secure !== undefined) {
      flags.push("--cacert", this.secure.caPath);
      if (!opts.noAuth) flags.push("--token-file", this.secure.adminTokenPath);
    }
    return runCli([...flags, ...args], opts.timeoutMs ?? 20_000);
  }

  async stop(): Promise<void> {
    await Promise.all(this.nodes.map((s) => this.terminate(s)));
    if (!process.env.WARDEN_KEEP) {
      rmSync(this.dir, { recursive: true, force: true });
      tempDirs.delete(this.dir);
    }
  }
}

function tail(log: string, lines = 40): string {
  return log.split("\n").slice(-lines).join("\n");
}

/**
 * Starts `wardend --dev` (a whole 3-replica dev cluster in one process) on
 * a free loopback port with a temporary data dir and waits until it is
 * ready. The result has size 1: use `url()`, `kill()`, `pause()`… without
 * a node number.
 */
export async function startDev(opts: StartDevOptions = {}): Promise<WardenCluster> {
  requireBinary(wardendPath, "WARDEND");
  requireBinary(wardenPath, "WARDEN");
  const dir = tempDir("warden-dev-");
  const port = await freePort();
  const listen = `127.0.0.1:${port}`;
  const spec: NodeSpec = {
    n: 1,
    listen,
    logPath: join(dir, "node-1.log"),
    started: false,
    args: () => ["--dev", "--data-dir", join(dir, "data"), "--listen", listen, ...(opts.extraArgs ?? [])],
  };
  const c = new Cluster(dir, [spec], "http", undefined, opts.readyTimeoutMs ?? 60_000);
  c.start(1);
  try {
    await c.waitReady(1);
  } catch (e) {
    await c.stop();
    throw e;
  }
  return c;
}

const authJSON = `{
  "roles": [
    {"name": "operator", "grants": [{"permission": "admin"}, {"permission": "read"}, {"permission": "lock"},
                                    {"permission": "quota.use"}, {"permission": "quota.admin"}]},
    {"name": "orders", "grants": [{"permission": "lock", "prefix": "orders/"}]}
  ],
  "bindings": [
    {"principal": "admin", "role": "operator"},
    {"principal": "orders", "role": "orders"},
    {"principal": "client", "role": "orders"}
  ],
  "tokens": [
    {"principal": "admin", "file": "admin.token", "description": "harness operator"},
    {"principal": "orders", "file": "orders.token", "description": "harness orders/ locks"}
  ]
}
`;

async function mustCli(args: string[]): Promise<void> {
  const r = await runCli(args, 30_000);
  if (r.code !== 0) throw new Error(`harness: warden ${args.join(" ")} failed (${r.code}): ${r.stderr}`);
}

/**
 * Starts a cluster of separate wardend processes (default 3) on free
 * loopback ports, like deploy/local/cluster.sh: zones az1..azN, a shared
 * cluster secret (cleartext) or, with `secure`, TLS from `warden tls local`
 * and authentication on with two tokens (see {@link SecureMaterial}).
 * Waits until every node is ready.
 */
export async function startCluster(opts: StartClusterOptions = {}): Promise<WardenCluster> {
  requireBinary(wardendPath, "WARDEND");
  requireBinary(wardenPath, "WARDEN");
  const size = opts.nodes ?? 3;
  const dir = tempDir("warden-cluster-");
  const listens: string[] = [];
  const rafts: string[] = [];
  for (let i = 0; i < size; i++) {
    listens.push(`127.0.0.1:${await freePort()}`);
    rafts.push(`127.0.0.1:${await freePort()}`);
  }
  const members = listens.map((l, i) => `${i + 1}=${rafts[i]}=${l}`).join(",");
  const endpoints = listens.map((l) => `${opts.secure ? "https" : "http"}://${l}`);
  let secure: SecureMaterial | undefined;
  const secretPath = join(dir, "cluster-secret");
  if (opts.secure) {
    const sd = join(dir, "secure");
    await mustCli(["tls", "local", "--dir", sd, "--nodes", String(size), "--host", "127.0.0.1"]);
    await mustCli(["auth", "token", "generate", "--out", join(sd, "admin.token")]);
    await mustCli(["auth", "token", "generate", "--out", join(sd, "orders.token")]);
    writeFileSync(join(sd, "auth.json"), authJSON);
    const read = (f: string) => readFileSync(join(sd, f), "utf8");
    secure = {
      dir: sd,
      ca: read("ca.pem"),
      caPath: join(sd, "ca.pem"),
      clientCert: read("client.pem"),
      clientKey: read("client-key.pem"),
      adminToken: read("admin.token").trim(),
      ordersToken: read("orders.token").trim(),
      adminTokenPath: join(sd, "admin.token"),
    };
  } else {
    writeFileSync(secretPath, Array.from({ length: 24 }, () => Math.floor(Math.random() * 256).toString(16).padStart(2, "0")).join(""), {
      mode: 0o600,
    });
  }
  const specs: NodeSpec[] = listens.map((listen, i) => {
    const n = i + 1;
    return {
      n,
      listen,
      logPath: join(dir, `node-${n}.log`),
      started: false,
      args: (first: boolean) => {
        const a = [
          "--node-id", String(n), "--zone", `az${n}`, "--raft-addr", rafts[i]!, "--listen", listen,
          "--data-dir", join(dir, `node-${n}`), "--initial-members", members,
        ];
        if (first) a.push("--initial-cluster-state", "new");
        if (secure !== undefined) {
          const sd = secure.dir;
          a.push(
            "--tls-cert", join(sd, `node-${n}.pem`), "--tls-key", join(sd, `node-${n}-key.pem`), "--tls-client-ca", secure.caPath,
            "--peer-ca", join(sd, "peer-ca.pem"), "--peer-cert", join(sd, `node-${n}-peer.pem`),
            "--peer-key", join(sd, `node-${n}-peer-key.pem`), "--auth-bootstrap", join(sd, "auth.json"),
          );
        } else {
          a.push("--cluster-secret-file", secretPath, "--insecure");
        }
        return [...a, ...(opts.extraArgs?.(n, [...endpoints]) ?? [])];
      },
    };
  });
  const c = new Cluster(dir, specs, secure ? "https" : "http", secure, opts.readyTimeoutMs ?? 90_000);
  for (let n = 1; n <= size; n++) c.start(n);
  try {
    await c.waitReady();
  } catch (e) {
    await c.stop();
    throw e;
  }
  return c;
}
