/**
 * Leases: held locks that renew themselves in the background.
 *
 * @module
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { checkMs, LeaseLostError, LeaseReleasedError, LeaseUncertainError, type WardenError } from "./errors.js";
import { unref, type Renewed } from "./renewer.js";

/** Why a lease ended: the server said it is not current, renewals failed until the local deadline, or it was released. */
export type LeaseEndReason = "lost" | "uncertain" | "released";

/** What a Lease needs from its client. @internal */
export interface LeaseHost {
  /**
   * Renews the lease, retrying (and failing over) until signal aborts; a
   * background renewal's timers do not keep the process alive.
   */
  renew(resource: string, leaseId: string, ttlMs: number, signal: AbortSignal, background: boolean): Promise<Renewed>;
  /** Releases the lease, retrying while unavailable; resolves when the server answered. */
  release(resource: string, leaseId: string, timeoutMs?: number): Promise<void>;
  /** Forgets the lease (the server no longer holds it, or it was released). */
  forget(lease: Lease): void;
}

/** The grant a Lease starts from. @internal */
export interface Grant {
  resource: string;
  leaseId: string;
  token: bigint;
  ttlMs: number;
  marginMs: number;
  /** performance.now() when the first Acquire attempt was sent. */
  firstSentAt: number;
  serverExpiresAt: Date | undefined;
}

/**
 * A held lock. It renews itself every TTL/3 (±10 % jitter); the renewals
 * of one client's leases that fall due together share one RenewBatch call.
 *
 * **The abort rule.** The lease's local deadline is the time the request
 * that last extended it was *sent* (the first Acquire attempt, then each
 * successful renewal's call), plus the TTL, on this process's monotonic
 * clock — never the time its answer arrived. When renewals fail, the lease
 * keeps trying until that deadline minus the safety margin, then
 * {@link Lease.signal} aborts with a {@link LeaseUncertainError}. The
 * server cannot grant the lock to anyone else before its own expiry (which
 * is later than the local deadline) plus its max clock skew, so the signal
 * always aborts first — provided this process is not itself paused; for
 * that, pass {@link Lease.token} to the protected resource and have it
 * refuse lower tokens.
 *
 * The signal also aborts, with a {@link LeaseLostError}, when the server
 * refuses a renewal (the lease is not current), and with a
 * {@link LeaseReleasedError} on {@link Lease.unlock}.
 */
export class Lease {
  /** The locked resource's name. */
  readonly resource: string;
  /**
   * The fencing token: strictly greater than every token issued before for
   * this resource. Pass it with every write to the protected resource.
   */
  readonly token: bigint;
  /** The lease TTL the server granted, ms. */
  readonly ttlMs: number;
  /** How long before the local deadline the signal aborts when renewals fail, ms. */
  readonly safetyMarginMs: number;

  private readonly host: LeaseHost;
  private readonly leaseId: string;
  private readonly controller = new AbortController();
  private deadline: number; // performance.now() ms
  private serverExpiry: Date | undefined;
  private renewTimer: ReturnType<typeof setTimeout> | undefined;
  private cutoffTimer: ReturnType<typeof setTimeout> | undefined;
  private renewing: AbortController | undefined;
  private endReason: LeaseEndReason | undefined;
  private released = false;

  /** @internal */
  constructor(host: LeaseHost, g: Grant) {
    this.host = host;
    this.resource = g.resource;
    this.leaseId = g.leaseId;
    this.token = g.token;
    this.ttlMs = g.ttlMs;
    this.safetyMarginMs = g.marginMs;
    this.deadline = g.firstSentAt + g.ttlMs;
    this.serverExpiry = g.serverExpiresAt;
  }

  /**
   * Aborts when the lease ends: lost, uncertain (at the local deadline
   * minus the safety margin) or released. Its `reason` is the
   * {@link Lease.err}. Stop work under the lease at once when it aborts.
   */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** Why the lease ended, or undefined while it is held. */
  get reason(): LeaseEndReason | undefined {
    return this.endReason;
  }

  /** The error the signal aborted with, or undefined while the lease is held. */
  get err(): WardenError | undefined {
    return this.controller.signal.aborted ? (this.controller.signal.reason as WardenError) : undefined;
  }

  /**
   * The local deadline as a wall-clock Date: the send time of the request
   * that last extended the lease plus the TTL. The signal aborts at this
   * time minus {@link Lease.safetyMarginMs} unless a renewal succeeds
   * first.
   */
  get expiresAt(): Date {
    return new Date(Date.now() + (this.deadline - performance.now()));
  }

  /** The server's expiry of the lease as of its last answer, on the server's clock (informational). */
  get serverExpiresAt(): Date | undefined {
    return this.serverExpiry;
  }

  /** Starts the background renewals and the deadline timer. @internal */
  start(): void {
    this.armCutoff();
    this.scheduleRenewal();
  }

  /**
   * Renews once now, before the lease is handed out (after a long wait
   * used up much of the first deadline, or for a caller-supplied request
   * id whose grant may be older than this call). The renewal runs with a
   * fresh cutoff, its own send time + TTL − margin (as the Go SDK's Lock):
   * the old deadline may have passed already, and nobody has seen the
   * lease yet, so no work depends on it. On success the deadline is the
   * renewal's send time + TTL. Rejects with the lease's end error when it
   * fails.
   * @internal
   */
  async renewNow(): Promise<void> {
    this.armCutoff(performance.now() + this.ttlMs - this.safetyMarginMs);
    await this.renewOnce(false);
    if (this.err !== undefined) throw this.err;
  }

  /** performance.now() at which the signal must abort unless a renewal succeeds first. */
  private cutoff(): number {
    return this.deadline - this.safetyMarginMs;
  }

  /** (Re)arms the cutoff timer at `at` (performance.now() ms; default the lease's cutoff). */
  private armCutoff(at: number = this.cutoff()): void {
    clearTimeout(this.cutoffTimer);
    this.cutoffTimer = setTimeout(() => {
      this.end(
        "uncertain",
        new LeaseUncertainError(
          this.resource,
          this.token,
          `warden: lease on ${this.resource} uncertain: no renewal succeeded before the local deadline minus ${this.safetyMarginMs} ms`,
          Code.Unavailable,
        ),
      );
    }, Math.max(at - performance.now(), 0));
    unref(this.cutoffTimer);
  }

  private scheduleRenewal(): void {
    const period = this.ttlMs / 3;
    const jitter = (Math.random() * 0.2 - 0.1) * period;
    this.renewTimer = setTimeout(() => {
      void this.renewOnce(true).then(() => {
        if (this.endReason === undefined) this.scheduleRenewal();
      });
    }, period + jitter);
    unref(this.renewTimer);
  }

  /** One renewal, retried until it succeeds, the server refuses it, or the cutoff passes. */
  private async renewOnce(background: boolean): Promise<void> {
    const ctl = new AbortController();
    this.renewing = ctl;
    try {
      const r = await this.host.renew(this.resource, this.leaseId, this.ttlMs, ctl.signal, background);
      if (this.endReason !== undefined) return;
      this.deadline = Math.max(this.deadline, r.sentAt + this.ttlMs);
      this.serverExpiry = r.expiresAt ?? this.serverExpiry;
      this.armCutoff();
    } catch (err) {
      if (this.endReason !== undefined) return; // ended meanwhile (cutoff, unlock)
      const ce = err instanceof ConnectError ? err : undefined;
      if (ce?.code === Code.FailedPrecondition) {
        this.end("lost", new LeaseLostError(this.resource, this.token, `warden: lease on ${this.resource} lost: ${ce.rawMessage}`, ce.code, ce));
      } else {
        const code = ce?.code ?? Code.Unknown;
        const msg = err instanceof Error ? err.message : String(err);
        this.end("uncertain", new LeaseUncertainError(this.resource, this.token, `warden: renewing ${this.resource}: ${msg}`, code, err));
      }
    } finally {
      if (this.renewing === ctl) this.renewing = undefined;
    }
  }

  /** Ends the lease once: stops the timers and any renewal in flight, aborts the signal. */
  private end(reason: LeaseEndReason, err: WardenError): void {
    if (this.endReason !== undefined) return;
    this.endReason = reason;
    clearTimeout(this.renewTimer);
    clearTimeout(this.cutoffTimer);
    this.renewing?.abort();
    this.controller.abort(err);
    if (reason === "lost") this.host.forget(this); // nothing left to release
  }

  /**
   * Stops renewing and releases the lease, retrying while the service is
   * unavailable (up to `timeoutMs`, default the client's call timeout).
   * The signal aborts with a {@link LeaseReleasedError} unless it had
   * aborted before. A lease the server no longer holds is not an error.
   * When the release fails, a later `unlock()` or `client.close()` tries
   * again; once one succeeded, `unlock()` resolves at once.
   *
   * @throws WardenError when the release could not be completed in time.
   * @throws InvalidArgumentError (`field` "timeoutMs") for a timeout that is not a finite number ≥ 0 (nothing is done)
   */
  async unlock(timeoutMs?: number): Promise<void> {
    checkMs("timeoutMs", timeoutMs);
    if (this.released) return;
    this.end("released", new LeaseReleasedError(this.resource));
    await this.host.release(this.resource, this.leaseId, timeoutMs);
    this.released = true;
    this.host.forget(this);
  }
}
