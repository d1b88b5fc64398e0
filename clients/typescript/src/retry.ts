/**
 * Retry policy: which failures a retry with the same ids settles, where a
 * retry goes, and how long it waits.
 *
 * @module
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { NotLeaderSchema, RangeMovedSchema } from "./gen/warden/v1/lock_pb.js";

/** Backoff bounds between retries, in milliseconds. */
export interface RetryOptions {
  /** First backoff bound, ms (default 50). Each wait is uniform in (0, bound]: full jitter. */
  baseMs?: number;
  /** Largest backoff bound, ms (default 2000); the bound doubles per retry up to it. */
  maxMs?: number;
  /**
   * How long one attempt may go unanswered before it counts as a lost
   * answer and is retried with the same ids, ms (default 10000). A waiting
   * `lock()` gets its remaining wait on top.
   */
  attemptTimeoutMs?: number;
  /**
   * How long a call (all of its attempts) may take, ms (default 30000),
   * unless the call's own `timeoutMs` says otherwise. A waiting `lock()`
   * gets its wait on top.
   */
  callTimeoutMs?: number;
}

/** RetryOptions with every default filled in. @internal */
export type RetryPolicy = Required<RetryOptions>;

/** @internal */
export function retryPolicy(o: RetryOptions = {}): RetryPolicy {
  return {
    baseMs: o.baseMs ?? 50,
    maxMs: o.maxMs ?? 2000,
    attemptTimeoutMs: o.attemptTimeoutMs ?? 10_000,
    callTimeoutMs: o.callTimeoutMs ?? 30_000,
  };
}

/** A full-jitter wait for a backoff bound: uniform in [1, bound] ms. @internal */
export function jitter(boundMs: number): number {
  return 1 + Math.random() * Math.max(boundMs - 1, 0);
}

/**
 * Whether err never reached the server's answer: the connection failed or
 * broke before an answer was read (a Node.js system or HTTP/2 error, or a
 * fetch TypeError, as the ConnectError's cause). A server's own error
 * answer has no such cause.
 */
export function isTransportError(err: unknown): boolean {
  if (!(err instanceof ConnectError)) return false;
  // A credentials callback that failed (bearerInterceptor) — say, its own
  // token fetch — is no lost answer, whatever its cause.
  if (err.code === Code.Unauthenticated) return false;
  const seen = new Set<unknown>();
  for (let c: unknown = err.cause; c instanceof Error && !seen.has(c); c = c.cause) {
    seen.add(c);
    if (c instanceof ConnectError) continue;
    if (c instanceof TypeError) return true; // fetch: "Failed to fetch", "network error"
    const code = (c as { code?: unknown }).code;
    // ECONNRESET, ERR_HTTP2_*, …; a certificate that fails verification is
    // no passing failure: a retry would fail the same way.
    if (typeof code === "string") return !/CERT|SELF_SIGNED|UNABLE_TO_VERIFY|ERR_TLS|ERR_SSL/.test(code);
  }
  return false;
}

/**
 * Whether a retry with the same request, reservation or lease id settles
 * err's unknown outcome: the server answered Unavailable, or the answer
 * was lost (the connection failed or broke mid-call). The caller's own
 * cancel or deadline is not retryable; an attempt's timeout is decided by
 * the caller of this function.
 */
export function isRetryable(err: unknown): boolean {
  if (!(err instanceof ConnectError)) return false;
  if (err.code === Code.Unavailable) return true;
  return isTransportError(err);
}

/**
 * The client address ("host:port") of the shard's leader that an
 * Unavailable answer names in its NotLeader or RangeMoved detail, or
 * undefined when it names none. The client sends its retry there when that
 * node is among its endpoints.
 */
export function leaderAddress(err: unknown): string | undefined {
  if (!(err instanceof ConnectError) || err.code !== Code.Unavailable) return undefined;
  const nl = err.findDetails(NotLeaderSchema)[0];
  if (nl !== undefined && nl.leaderAddress !== "") return nl.leaderAddress;
  const rm = err.findDetails(RangeMovedSchema)[0];
  if (rm !== undefined && rm.leaderAddress !== "") return rm.leaderAddress;
  return undefined;
}
