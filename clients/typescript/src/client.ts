/**
 * The transport-independent client. Use `createClient` from
 * `@warden-dev/warden/node` or `@warden-dev/warden/web`, which build it
 * on a Connect transport.
 *
 * @module
 */
import { Code, ConnectError, createClient as createConnectClient, type CallOptions, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs, durationMs, timestampDate } from "@bufbuild/protobuf/wkt";
import { LockService, type AcquireRequestSchema, type AcquireResponse } from "./gen/warden/v1/lock_pb.js";
import { Consistency, QuotaService, type QuotaLevel as QuotaLevelMessage } from "./gen/warden/v1/quota_pb.js";
import { ClientClosedError, LockHeldError, WaitTimeoutError, WardenError, checkMs, invalid, toWardenError } from "./errors.js";
import { Lease, type LeaseHost } from "./lease.js";
import { Renewer, unref, type Renewed } from "./renewer.js";
import { isRetryable, isTransportError, jitter, leaderAddress, retryPolicy, type RetryOptions, type RetryPolicy } from "./retry.js";

/** A bearer token source, called before every request; "" sends none. */
export type Credentials = () => string | Promise<string>;

/**
 * The token source of `token` and `credentials` options: `credentials`
 * wins; neither gives undefined (no Authorization header).
 */
export function credentialsFrom(opts: { token?: string; credentials?: Credentials }): Credentials | undefined {
  const token = opts.token;
  return opts.credentials ?? (token !== undefined ? () => token : undefined);
}

/**
 * A Connect interceptor that sends `Authorization: Bearer <token>` with
 * every call, asking `credentials` for the token each time (a rotating
 * token is picked up at the next call); an empty token sends no header.
 * Every client transport of the SDK carries it: the clients of
 * `createClient` and the transports of `createWebTransport`.
 *
 * A `credentials` callback that throws (or rejects) fails the call, not
 * retried, with a `ConnectError` of code `Unauthenticated` whose cause is
 * what it threw (client methods turn it into an `UnauthenticatedError`).
 *
 * @example
 * ```ts
 * const transport = createConnectTransport({ baseUrl, interceptors: [bearerInterceptor(async () => fetchToken())] });
 * ```
 */
export function bearerInterceptor(credentials: Credentials): Interceptor {
  return (next) => async (req) => {
    let token: string;
    try {
      token = await credentials();
    } catch (e) {
      throw new ConnectError(`warden: credentials: ${e instanceof Error ? e.message : String(e)}`, Code.Unauthenticated, undefined, undefined, e);
    }
    if (token !== "") req.header.set("Authorization", `Bearer ${token}`);
    return next(req);
  };
}

/** Options common to every client, whatever its transport. */
export interface ClientOptions {
  /**
   * Base URLs of Warden nodes ("http://10.0.0.1:7070", "https://…").
   * Requests go to one and move to the next when it is unavailable, or to
   * the one an answer names as the leader.
   */
  endpoints: string[];
  /** Bearer token every call carries ("Authorization: Bearer …"); send it over https only. */
  token?: string;
  /** Bearer token source called before every call (rotating tokens); wins over `token`. An error fails the call. */
  credentials?: Credentials;
  /** Backoff and timeouts of retries (all in ms). */
  retry?: RetryOptions;
}

/**
 * The transports a client's core runs on: one per endpoint base URL, and
 * what to close when the client closes.
 */
export interface TransportFactory {
  /**
   * Makes the transport for one endpoint's base URL. The transport must run
   * `interceptors` on every call: they carry the client's bearer token
   * ({@link bearerInterceptor}; empty without `token` or `credentials`).
   */
  create(baseUrl: string, interceptors: Interceptor[]): Transport;
  /** Closes the transports' connections (called by `close()`). */
  close?(): void;
}

/** Options of {@link WardenClient.lock}. Times are in milliseconds. */
export interface LockOptions {
  /**
   * Lease TTL, ms (default: the shard's, 30 s; the shard bounds it, 1 s – 10 min by default).
   * A finite number, rounded to the nearest whole ms (1500.7 → 1501); NaN, ±Infinity or
   * less than 1 ms after rounding throw an InvalidArgumentError.
   */
  ttl?: number;
  /**
   * How long to wait in the lock's queue when it is held, ms; 0 (the default) fails at once with a LockHeldError.
   * A finite number ≥ 0, rounded to the nearest whole ms.
   */
  wait?: number;
  /** Free text shown by describe() and in the audit log (at most 256 bytes). */
  holder?: string;
  /** The caller's tenant: its waiters count against the tenant's bound (at most 128 bytes). */
  tenant?: string;
  /**
   * Idempotency key of the acquisition (default: a random one). Set it
   * only to retry with it after `lock()` gave up: a lease granted to an id
   * of yours after `lock()` gave up is not released by the SDK. Such a
   * grant may be older than this call, so with a caller-supplied id
   * `lock()` always renews the lease once before returning it and takes
   * the local deadline from that renewal's send time; if the server says
   * the lease is no longer current, `lock()` throws a LeaseLostError.
   */
  requestId?: string;
  /**
   * How long before the local deadline the lease's signal aborts when
   * renewals fail, ms (default TTL/10, at least 100). A finite number with
   * 0 ≤ safetyMargin < TTL, else an InvalidArgumentError (`field`
   * "safetyMargin"): checked against `ttl` before the call, and against
   * the TTL the server granted when `ttl` is not given (the grant is then
   * released before the error is thrown).
   */
  safetyMargin?: number;
  /** Aborting it gives up the call (its error is the signal's reason, wrapped). */
  signal?: AbortSignal;
  /** How long the call may take, ms, besides `wait` (default the client's `retry.callTimeoutMs`, 30 s); a finite number ≥ 0. */
  timeoutMs?: number;
}

/** Options of calls other than lock(). */
export interface CallOpts {
  /** Aborting it gives up the call. */
  signal?: AbortSignal;
  /** How long the call may take with its retries, ms (default the client's `retry.callTimeoutMs`, 30 s); a finite number ≥ 0. */
  timeoutMs?: number;
}

/** A lock's state, as describe() reads it (linearizable). */
export interface LockState {
  /** Whether the lock cannot be granted to anyone else now. */
  held: boolean;
  /** The holder's free text. */
  holder: string;
  /** The current (or last) lease's fencing token; 0n when the shard keeps no record. */
  token: bigint;
  /** The holder's lease expiry on the server's clock. */
  expiresAt: Date | undefined;
  /** Requests queued for the lock. */
  waiters: number;
}

/** Options of {@link WardenClient.reserve}. */
export interface ReserveOptions extends CallOpts {
  /** How long the reservation holds, ms (default: the shard's, 5 min; at most 1 h); rounded to the nearest whole ms. */
  ttl?: number;
  /** Idempotency key (default: a random one); every retry carries it, so a reserve is charged once. */
  reservationId?: string;
}

/** One level of a quota path. Amounts are bigint (int64). */
export interface QuotaLevel {
  /** The level's key ("pool", "pool/tenant", …). */
  key: string;
  /** Whether the level has a limit. */
  hasLimit: boolean;
  /** The level's limit (meaningful when hasLimit). */
  limit: bigint;
  /** The level's fairness weight among its siblings. */
  weight: number;
  /** Committed usage of the level's whole subtree. */
  committed: bigint;
  /** Reserved, not yet committed, usage of the subtree (excluding expiredPending). */
  reserved: bigint;
  /** Held by expired reservations not yet reclaimed: free capacity already. */
  expiredPending: bigint;
  /** limit − committed − reserved (0n when over). */
  remaining: bigint;
}

/** Capacity held by {@link WardenClient.reserve} until `expiresAt`. */
export class Reservation {
  /** @internal */
  constructor(
    private readonly client: WardenClient,
    /** The quota key ("pool/tenant/project"). */
    readonly key: string,
    /** The reservation id (its idempotency key). */
    readonly id: string,
    /** The amount reserved. */
    readonly amount: bigint,
    /** Room left at the tightest limited level after this reservation. */
    readonly remaining: bigint,
    /** When the reservation lapses, on the server's clock. */
    readonly expiresAt: Date | undefined,
  ) {}

  /**
   * Turns the reservation into usage: `amount` (default all of it); the
   * rest returns. A repeat returns the first commit's amount. Retries keep
   * the reservation id.
   * @returns the committed amount
   * @throws WardenError `FailedPrecondition` for an expired, released or unknown reservation
   */
  commit(amount?: number | bigint, opts?: CallOpts): Promise<bigint> {
    return this.client.commitReservation(this, amount, opts);
  }

  /**
   * Returns the reservation's capacity.
   * @returns false if it was unknown, expired or released already (possibly by a retried attempt of this call)
   * @throws WardenError `FailedPrecondition` for a committed reservation
   */
  release(opts?: CallOpts): Promise<boolean> {
    return this.client.releaseReservation(this, opts);
  }
}

interface Endpoint {
  url: string;
  host: string;
  lock: Client<typeof LockService>;
  quota: Client<typeof QuotaService>;
  renewer: Renewer;
}

/** How long an attempt that carries an SDK-generated request id goes on after its caller gave up, to release a late grant. */
const ORPHAN_LINGER_MS = 2000;

interface RetryCall<T> {
  what: string;
  signal?: AbortSignal;
  timeoutMs: number;
  /** Attempt timeout, ms (default the policy's), before extraAttemptMs. */
  attemptTimeoutMs?: number;
  /** Added to the attempt timeout (a waiting Acquire's wait). */
  extraAttemptMs?: number;
  /** A background call (renewals): its timers do not keep the process alive. */
  background?: boolean;
  /** Gets a successful answer that arrived after the caller gave up. */
  onOrphan?: (value: T) => void;
}

/** Thrown inside the retry loop when the caller gave up. */
class GaveUp {
  constructor(readonly reason: unknown) {}
}

/**
 * A Warden client: locks with self-renewing leases and fencing tokens,
 * and quota reservations. Create it with `createClient` of
 * `@warden-dev/warden/node` or `@warden-dev/warden/web`; close it with
 * {@link WardenClient.close}.
 *
 * Every call that may be retried carries the same id on every attempt:
 * an answer lost to a broken connection or a timeout, or an Unavailable
 * answer, is retried (full-jitter backoff) with that id — at the leader an
 * answer names, else at the next endpoint — so a retried Acquire returns
 * the lease the first attempt got, never a second one.
 */
export class WardenClient implements LeaseHost {
  private readonly endpoints: Endpoint[];
  private readonly policy: RetryPolicy;
  private readonly transports: TransportFactory;
  private readonly leases = new Set<Lease>();
  private next = 0;
  private closed = false;

  /**
   * Prefer `createClient` of the node or web entry point.
   * @throws InvalidArgumentError (`field` "endpoints") when there is no endpoint or one is not an http: or https: base URL;
   *   (`field` "retry.…") for a retry bound that is not a finite number ≥ 0
   */
  constructor(opts: ClientOptions, transports: TransportFactory) {
    if (!Array.isArray(opts.endpoints) || opts.endpoints.length === 0) throw invalid("endpoints", "no endpoints");
    const hosts = opts.endpoints.map((url) => {
      let u: URL | undefined;
      try {
        u = typeof url === "string" ? new URL(url) : undefined;
      } catch {
        u = undefined;
      }
      if (u === undefined || (u.protocol !== "http:" && u.protocol !== "https:")) {
        throw invalid("endpoints", `endpoint ${JSON.stringify(url)} is not an http: or https: base URL ("http://host:port")`);
      }
      return u.host;
    });
    for (const k of ["baseMs", "maxMs", "attemptTimeoutMs", "callTimeoutMs"] as const) checkMs(`retry.${k}`, opts.retry?.[k]);
    this.policy = retryPolicy(opts.retry);
    this.transports = transports;
    const credentials = credentialsFrom(opts);
    const interceptors = credentials === undefined ? [] : [bearerInterceptor(credentials)];
    this.endpoints = opts.endpoints.map((url, i) => {
      const host = hosts[i]!;
      const t = transports.create(url, interceptors);
      const lock = createConnectClient(LockService, t);
      return { url, host, lock, quota: createConnectClient(QuotaService, t), renewer: new Renewer(lock) };
    });
  }

  /** The endpoint the next call goes to first. */
  get currentEndpoint(): string {
    return this.endpoints[this.next % this.endpoints.length]!.url;
  }

  private checkOpen(): void {
    if (this.closed) throw new ClientClosedError();
  }

  /** A call's timeout: its `timeoutMs` (checked) or the policy's. */
  private callTimeout(opts: CallOpts): number {
    return checkMs("timeoutMs", opts.timeoutMs) ?? this.policy.callTimeoutMs;
  }

  /**
   * Runs f against the current endpoint until it answers something other
   * than a retryable failure, the caller's signal aborts, or timeoutMs
   * passes. f must carry the same ids on every attempt.
   */
  private async retry<T>(c: RetryCall<T>, f: (ep: Endpoint, opts: CallOptions) => Promise<T>): Promise<T> {
    const give = new AbortController();
    const onCallerAbort = () => give.abort(new GaveUp(c.signal?.reason));
    if (c.signal?.aborted) throw toGiveUpError(c.what, c.signal.reason, undefined);
    c.signal?.addEventListener("abort", onCallerAbort, { once: true });
    const overall = setTimeout(
      () => give.abort(new GaveUp(new WardenError(`warden: ${c.what}: timed out after ${c.timeoutMs} ms`, Code.DeadlineExceeded))),
      Math.min(c.timeoutMs, MAX_TIMER_MS),
    );
    const timer = c.background ? unref : () => undefined;
    timer(overall);
    const attemptMs = (c.attemptTimeoutMs ?? this.policy.attemptTimeoutMs) + (c.extraAttemptMs ?? 0);
    const gaveUp = new Promise<never>((_, reject) => give.signal.addEventListener("abort", () => reject(give.signal.reason), { once: true }));
    gaveUp.catch(() => undefined);
    let bound = this.policy.baseMs;
    let redirected = false;
    let last: unknown;
    try {
      for (;;) {
        const i = this.next % this.endpoints.length;
        const ep = this.endpoints[i]!;
        const attempt = new AbortController();
        let attemptTimedOut = false;
        const attemptTimer = setTimeout(() => {
          attemptTimedOut = true;
          attempt.abort(new ConnectError(`attempt unanswered after ${attemptMs} ms`, Code.DeadlineExceeded));
        }, Math.min(attemptMs, MAX_TIMER_MS));
        timer(attemptTimer);
        const call = Promise.resolve().then(() => f(ep, { signal: attempt.signal }));
        let outcome: { ok: true; value: T } | { ok: false; err: unknown };
        try {
          outcome = await Promise.race([
            call.then(
              (value) => ({ ok: true as const, value }),
              (err: unknown) => ({ ok: false as const, err }),
            ),
            gaveUp,
          ]);
        } catch (g) {
          clearTimeout(attemptTimer);
          this.abandon(call, attempt, c.onOrphan);
          throw toGiveUpError(c.what, (g as GaveUp).reason, last);
        }
        clearTimeout(attemptTimer);
        if (outcome.ok) return outcome.value;
        const err = outcome.err;
        // A stream canceled without this side asking is a connection the
        // peer broke (the HTTP/2 session went away): a lost answer too.
        const brokeOff = err instanceof ConnectError && err.code === Code.Canceled && !attempt.signal.aborted;
        if (!(attemptTimedOut || brokeOff || isRetryable(err))) throw err;
        last = err;
        const leader = leaderAddress(err);
        const j = leader === undefined ? -1 : this.endpoints.findIndex((e) => e.host === leader);
        if (j >= 0 && j !== i) {
          if (this.next % this.endpoints.length === i) this.next = j;
          if (!redirected) {
            // The answer said where to go: no reason to wait. Once only,
            // so two nodes naming each other still back off.
            redirected = true;
            continue;
          }
        } else if (this.next % this.endpoints.length === i) {
          this.next = (i + 1) % this.endpoints.length;
        }
        let wait: ReturnType<typeof setTimeout> | undefined;
        try {
          await Promise.race([
            new Promise((r) => {
              wait = setTimeout(r, jitter(bound));
              timer(wait);
            }),
            gaveUp,
          ]);
        } catch (g) {
          throw toGiveUpError(c.what, (g as GaveUp).reason, last);
        } finally {
          clearTimeout(wait);
        }
        bound = Math.min(2 * bound, this.policy.maxMs);
      }
    } finally {
      clearTimeout(overall);
      c.signal?.removeEventListener("abort", onCallerAbort);
    }
  }

  /**
   * The caller gave up while call was in flight. Without an orphan
   * handler the call is aborted; with one it goes on up to
   * ORPHAN_LINGER_MS (or its attempt timeout) to learn whether the server
   * granted it anyway, and hands such a grant to the handler.
   */
  private abandon<T>(call: Promise<T>, attempt: AbortController, onOrphan: ((v: T) => void) | undefined): void {
    if (onOrphan === undefined) {
      attempt.abort();
      call.catch(() => undefined);
      return;
    }
    const linger = setTimeout(() => attempt.abort(), ORPHAN_LINGER_MS);
    call.then(
      (v) => {
        clearTimeout(linger);
        onOrphan(v);
      },
      () => clearTimeout(linger),
    );
  }

  /**
   * Acquires the lock on `resource` and starts renewing its lease in the
   * background. Attempts lost to the network, timed out or answered
   * Unavailable are retried with the same request id (so the server
   * grants at most one lease), failing over across endpoints, until
   * `timeoutMs` (+ `wait`) passes or `signal` aborts. A lease granted to
   * an attempt that answers after the call gave up is released.
   *
   * @param resource - the lock's name: 1–256 bytes of UTF-8 without control characters
   * @throws LockHeldError when the lock is held and `wait` is 0
   * @throws WaitTimeoutError when not granted within `wait`
   * @throws InvalidArgumentError for a refused field (`field` names it): the server's, or before
   *   any call for `ttl`, `wait`, `timeoutMs` or `safetyMargin` out of range (see {@link LockOptions})
   * @throws LeaseLostError when the renewal of a grant to a caller-supplied `requestId` says it is no longer current
   * @throws UnauthenticatedError / PermissionDeniedError on a cluster with authentication
   * @throws ClientClosedError after `close()`
   * @throws WardenError `DeadlineExceeded` (timeout), `Canceled` (signal) or the code of another refusal
   */
  async lock(resource: string, opts: LockOptions = {}): Promise<Lease> {
    this.checkOpen();
    // Times are whole milliseconds: ttl and wait are rounded to the nearest.
    const ttl = roundMs("ttl", opts.ttl, 1);
    const wait = roundMs("wait", opts.wait) ?? 0;
    const timeoutMs = checkMs("timeoutMs", opts.timeoutMs) ?? this.policy.callTimeoutMs;
    const margin = checkMs("safetyMargin", opts.safetyMargin);
    if (margin !== undefined && ttl !== undefined && margin >= ttl) {
      throw invalid("safetyMargin", `safetyMargin ${margin} ms must be less than the ttl, ${ttl} ms`);
    }
    const own = opts.requestId === undefined;
    const requestId = opts.requestId ?? newRequestId();
    // Every attempt's grant happens after the first attempt was sent, so
    // its send time + TTL is a safe local deadline.
    const firstSentAt = performance.now();
    let resp: AcquireResponse;
    try {
      resp = await this.retry<AcquireResponse>(
        {
          what: `acquire ${resource}`,
          signal: opts.signal,
          timeoutMs: timeoutMs + wait,
          extraAttemptMs: wait,
          onOrphan: own ? (a) => this.releaseOrphan(resource, a) : undefined,
        },
        (ep, co) => {
          const req: MessageInitShape<typeof AcquireRequestSchema> = { resource, requestId, holder: opts.holder ?? "", tenant: opts.tenant ?? "" };
          if (ttl !== undefined) req.leaseTtl = durationFromMs(ttl);
          if (wait > 0) {
            const left = wait - (performance.now() - firstSentAt);
            if (left <= 0) throw new WaitTimeoutError(resource);
            req.waitTimeout = durationFromMs(Math.ceil(left));
          }
          return ep.lock.acquire(req, co);
        },
      );
    } catch (err) {
      if (wait > 0 && err instanceof ConnectError && err.code === Code.DeadlineExceeded && !isTransportError(err)) {
        throw new WaitTimeoutError(resource, err); // the server's answer: the wait ran out
      }
      const we = toWardenError(err, `acquire ${resource}`, resource);
      if (we instanceof LockHeldError || we.code !== Code.Aborted) throw we;
      throw new LockHeldError(resource, 0n, undefined, err);
    }
    const ttlMs = resp.leaseTtl ? durationMs(resp.leaseTtl) : (ttl ?? 30_000);
    if (margin !== undefined && margin >= ttlMs) {
      // The server picked a TTL the margin does not fit: the lease would
      // be uncertain at once. Nobody can use it: give it back.
      this.releaseOrphan(resource, resp);
      throw invalid("safetyMargin", `safetyMargin ${margin} ms must be less than the lease's ttl, ${ttlMs} ms (the server's)`);
    }
    const lease = new Lease(this, {
      resource,
      leaseId: resp.leaseId,
      token: resp.fencingToken,
      ttlMs,
      marginMs: margin ?? Math.max(ttlMs / 10, 100),
      firstSentAt,
      serverExpiresAt: resp.expiresAt && timestampDate(resp.expiresAt),
    });
    // A caller-supplied request id may return an earlier grant, made
    // before this call's first send (a lock() that gave up, another
    // process): firstSentAt + TTL may then be later than the server's
    // expiry. A long wait (or slow retries) used up much of the
    // conservative deadline. Either way, renew now to measure a fresh
    // one, from the renewal's own send time; nobody has seen the lease
    // yet, so no work depends on the old deadline.
    if (!own || performance.now() - firstSentAt > ttlMs / 3) {
      try {
        await lease.renewNow();
      } catch (err) {
        if (own && lease.reason !== "lost") this.releaseOrphan(resource, resp);
        throw err;
      }
    }
    if (this.closed) {
      // close() ran meanwhile: it cannot have seen this lease.
      await lease.unlock().catch(() => undefined);
      throw new ClientClosedError();
    }
    this.leases.add(lease);
    lease.start();
    return lease;
  }

  /**
   * Runs `fn` under the lock on `resource` and releases it afterwards,
   * whatever `fn` does. `fn` gets the lease: watch `lease.signal` (pass it
   * to your I/O) and send `lease.token` with every write.
   *
   * @returns what `fn` returns
   * @throws what {@link WardenClient.lock} throws, what `fn` throws, or the release's WardenError
   */
  async withLock<T>(resource: string, opts: LockOptions, fn: (lease: Lease) => Promise<T> | T): Promise<T> {
    const lease = await this.lock(resource, opts);
    try {
      return await fn(lease);
    } finally {
      await lease.unlock();
    }
  }

  /**
   * Reads a lock's state (linearizable). It never shows lease ids.
   * @throws WardenError with the answer's code (InvalidArgumentError, PermissionDeniedError, …)
   */
  async describe(resource: string, opts: CallOpts = {}): Promise<LockState> {
    this.checkOpen();
    try {
      const r = await this.retry({ what: `describe ${resource}`, signal: opts.signal, timeoutMs: this.callTimeout(opts) }, (ep, co) =>
        ep.lock.describe({ resource }, co),
      );
      return { held: r.held, holder: r.holder, token: r.fencingToken, expiresAt: r.expiresAt && timestampDate(r.expiresAt), waiters: r.waiters };
    } catch (err) {
      throw toWardenError(err, `describe ${resource}`, resource);
    }
  }

  /**
   * Reserves `amount` on every level of `key`'s path. Retries carry the
   * same reservation id, so the server charges it once.
   *
   * @param key - a slash path, "pool/tenant/project"
   * @param amount - a bigint in the int64 range or a safe-integer number (else an InvalidArgumentError naming "amount")
   * @throws QuotaExhaustedError when a level has no room (nothing is charged)
   * @throws WardenError `FailedPrecondition` when no level of the path has a limit
   * @throws InvalidArgumentError when the reservation id was used with other parameters
   */
  async reserve(key: string, amount: number | bigint, opts: ReserveOptions = {}): Promise<Reservation> {
    this.checkOpen();
    const reservationId = opts.reservationId ?? newRequestId();
    const amt = int64("amount", amount);
    const ttl = roundMs("ttl", opts.ttl, 1);
    const timeoutMs = this.callTimeout(opts);
    try {
      const r = await this.retry({ what: `reserve ${key}`, signal: opts.signal, timeoutMs }, (ep, co) =>
        ep.quota.reserve({ key, amount: amt, reservationId, ttl: ttl === undefined ? undefined : durationFromMs(ttl) }, co),
      );
      return new Reservation(this, key, reservationId, amt, r.remaining, r.expiresAt && timestampDate(r.expiresAt));
    } catch (err) {
      throw toWardenError(err, `reserve ${key}`);
    }
  }

  /** {@link Reservation.commit}. @internal */
  async commitReservation(r: Reservation, amount: number | bigint | undefined, opts: CallOpts = {}): Promise<bigint> {
    this.checkOpen();
    const amt = amount === undefined ? 0n : int64("amount", amount);
    const timeoutMs = this.callTimeout(opts);
    try {
      const resp = await this.retry({ what: `commit ${r.key}`, signal: opts.signal, timeoutMs }, (ep, co) =>
        ep.quota.commit({ key: r.key, reservationId: r.id, amount: amt }, co),
      );
      return resp.committed;
    } catch (err) {
      throw toWardenError(err, `commit ${r.key}`);
    }
  }

  /** {@link Reservation.release}. @internal */
  async releaseReservation(r: Reservation, opts: CallOpts = {}): Promise<boolean> {
    this.checkOpen();
    try {
      const resp = await this.retry({ what: `release ${r.key}`, signal: opts.signal, timeoutMs: this.callTimeout(opts) }, (ep, co) =>
        ep.quota.release({ key: r.key, reservationId: r.id }, co),
      );
      return resp.released;
    } catch (err) {
      throw toWardenError(err, `release ${r.key}`);
    }
  }

  /**
   * Reads every level of `key`'s path, root first.
   * @param opts.stale - read this node's replica (possibly behind) instead of a linearizable read
   * @throws WardenError with the answer's code
   */
  async query(key: string, opts: CallOpts & { stale?: boolean } = {}): Promise<QuotaLevel[]> {
    this.checkOpen();
    try {
      const r = await this.retry({ what: `query ${key}`, signal: opts.signal, timeoutMs: this.callTimeout(opts) }, (ep, co) =>
        ep.quota.query({ key, consistency: opts.stale ? Consistency.STALE : Consistency.LINEARIZABLE }, co),
      );
      return r.levels.map(level);
    } catch (err) {
      throw toWardenError(err, `query ${key}`);
    }
  }

  /**
   * Sets a quota level's limit and fairness weight (idempotent).
   * @param opts.weight - the level's share among its siblings (default 1, at most 1000)
   * @returns the level after the change
   * @throws InvalidArgumentError for a bad key, limit or weight
   */
  async setLimit(key: string, limit: number | bigint, opts: CallOpts & { weight?: number } = {}): Promise<QuotaLevel | undefined> {
    this.checkOpen();
    const lim = int64("limit", limit);
    const timeoutMs = this.callTimeout(opts);
    try {
      const r = await this.retry({ what: `set limit ${key}`, signal: opts.signal, timeoutMs }, (ep, co) =>
        ep.quota.setLimit({ key, limit: lim, weight: opts.weight ?? 0 }, co),
      );
      return r.level && level(r.level);
    } catch (err) {
      throw toWardenError(err, `set limit ${key}`);
    }
  }

  /**
   * Releases every lease of this client that the server may still hold
   * (held ones, those whose renewals became uncertain, those whose release
   * failed before), stops their timers, then closes the transports'
   * connections. Every call fails with ClientClosedError afterwards.
   *
   * @throws WardenError (with an AggregateError cause) when some releases failed; those leases end at their TTL
   */
  async close(timeoutMs?: number): Promise<void> {
    checkMs("timeoutMs", timeoutMs);
    if (this.closed) return;
    this.closed = true;
    const results = await Promise.allSettled([...this.leases].map((l) => l.unlock(timeoutMs)));
    this.transports.close?.();
    const failed = results.flatMap((r) => (r.status === "rejected" ? [r.reason as unknown] : []));
    if (failed.length > 0) {
      throw new WardenError(`warden: close: ${failed.length} lease(s) not released`, Code.Unavailable, { cause: new AggregateError(failed) });
    }
  }

  /**
   * @internal LeaseHost: renew through the current endpoint's Renewer,
   * retrying until signal aborts; an attempt unanswered for a third of the
   * TTL is retried (at the next endpoint).
   */
  renew(resource: string, leaseId: string, ttlMs: number, signal: AbortSignal, background: boolean): Promise<Renewed> {
    const attemptTimeoutMs = Math.max(Math.min(this.policy.attemptTimeoutMs, ttlMs / 3), 100);
    return this.retry({ what: `renew ${resource}`, signal, timeoutMs: 2 ** 31 - 1, attemptTimeoutMs, background }, (ep, co) => {
      // The attempt's own signal ends the renewal's wait in the batch.
      return ep.renewer.renew(resource, leaseId, co.signal ?? signal);
    });
  }

  /** @internal LeaseHost: release, retrying while unavailable. */
  async release(resource: string, leaseId: string, timeoutMs?: number): Promise<void> {
    const t = checkMs("timeoutMs", timeoutMs) ?? this.policy.callTimeoutMs;
    try {
      await this.retry({ what: `release ${resource}`, timeoutMs: t }, (ep, co) =>
        ep.lock.release({ resource, leaseId }, co),
      );
    } catch (err) {
      throw toWardenError(err, `release ${resource}`, resource);
    }
  }

  /** @internal LeaseHost */
  forget(lease: Lease): void {
    this.leases.delete(lease);
  }

  /**
   * Releases a lease granted to a lock() call after it gave up (nobody
   * can use it), retrying until the lease would have expired anyway.
   */
  private releaseOrphan(resource: string, a: AcquireResponse): void {
    const ttl = a.leaseTtl ? durationMs(a.leaseTtl) : 30_000;
    this.release(resource, a.leaseId, ttl).catch(() => undefined);
  }
}

function level(l: QuotaLevelMessage): QuotaLevel {
  return {
    key: l.key,
    hasLimit: l.hasLimit,
    limit: l.limit,
    weight: l.weight,
    committed: l.committed,
    reserved: l.reserved,
    expiredPending: l.expiredPending,
    remaining: l.remaining,
  };
}

/** The error of a call whose caller gave up (signal or timeout); `last` is the last retryable failure. */
function toGiveUpError(what: string, reason: unknown, last: unknown): WardenError {
  const lastMsg = last === undefined ? "" : ` (last answer: ${last instanceof Error ? last.message : String(last)})`;
  if (reason instanceof WardenError) {
    return new WardenError(reason.message + lastMsg, reason.code, { cause: last ?? reason });
  }
  return new WardenError(`warden: ${what}: canceled${lastMsg}`, Code.Canceled, { cause: reason });
}

/** A random request id: 96 bits, hex. */
function newRequestId(): string {
  const b = new Uint8Array(12);
  crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/** The longest delay setTimeout honours (a longer one fires at once). */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Checks a time option sent to the server and rounds it to the nearest whole ms, at least min. */
function roundMs(field: string, v: number | undefined, min = 0): number | undefined {
  const ms = checkMs(field, v);
  if (ms === undefined) return undefined;
  const r = Math.round(ms);
  if (r < min || !Number.isSafeInteger(r)) {
    throw invalid(field, `${field} must be a whole number of milliseconds from ${min} to ${Number.MAX_SAFE_INTEGER}, not ${String(v)}`);
  }
  return r;
}

const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

/** An amount as int64: a bigint in range, or a safe-integer number. */
function int64(field: string, v: number | bigint): bigint {
  if (typeof v === "bigint") {
    if (v >= INT64_MIN && v <= INT64_MAX) return v;
  } else if (typeof v === "number" && Number.isSafeInteger(v)) {
    return BigInt(v);
  }
  throw invalid(field, `${field} must be a bigint in the int64 range or a safe-integer number, not ${String(v)}`);
}
