/**
 * The SDK's errors. Every error a client method throws is a
 * {@link WardenError} (or one of its subclasses), whose `code` is the
 * Connect code of the answer that caused it; the original error, when
 * there is one, is its `cause`.
 *
 * @module
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { durationMs, timestampDate } from "@bufbuild/protobuf/wkt";
import { FieldViolationSchema, LockHeldSchema } from "./gen/warden/v1/lock_pb.js";
import { QuotaExhaustedSchema } from "./gen/warden/v1/quota_pb.js";

export { Code };

/** Base class of every error the SDK throws. */
export class WardenError extends Error {
  /** The Connect code of the answer that caused the error (e.g. `Code.Unavailable`). */
  readonly code: Code;

  /**
   * @param message - human-readable explanation
   * @param code - the Connect code
   * @param options - `cause`: the underlying error
   */
  constructor(message: string, code: Code, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.name = new.target.name;
  }
}

/**
 * The lock is held by someone else and the caller did not wait
 * (`wait` 0, the default). Code `Aborted`.
 */
export class LockHeldError extends WardenError {
  /** The locked resource. */
  readonly resource: string;
  /** The current holder's fencing token (0n when the server sent no detail). */
  readonly token: bigint;
  /** When the holder's lease ends unless renewed, on the server's clock (undefined without a detail). */
  readonly expiresAt: Date | undefined;

  /** @internal */
  constructor(resource: string, token: bigint, expiresAt: Date | undefined, cause?: unknown) {
    super(
      `warden: ${resource} is held (fencing token ${token}${expiresAt ? `, until ${expiresAt.toISOString()}` : ""})`,
      Code.Aborted,
      { cause },
    );
    this.resource = resource;
    this.token = token;
    this.expiresAt = expiresAt;
  }
}

/** The lock was not granted within the `wait` asked for. Code `DeadlineExceeded`. */
export class WaitTimeoutError extends WardenError {
  /** @internal */
  constructor(resource: string, cause?: unknown) {
    super(`warden: ${resource}: wait timed out without a grant`, Code.DeadlineExceeded, { cause });
  }
}

/**
 * A lease ended: work under it must stop at once. `LeaseLostError` itself
 * means the server said the lease is no longer current (expired, released
 * elsewhere, replaced; code `FailedPrecondition`); its subclass
 * {@link LeaseUncertainError} means renewals failed until the local
 * deadline minus the safety margin.
 */
export class LeaseLostError extends WardenError {
  /** The lease's resource. */
  readonly resource: string;
  /** The lease's fencing token. */
  readonly token: bigint;

  /** @internal */
  constructor(resource: string, token: bigint, message: string, code: Code = Code.FailedPrecondition, cause?: unknown) {
    super(message, code, { cause });
    this.resource = resource;
    this.token = token;
  }
}

/**
 * Renewals failed (the service was unreachable or unavailable) until the
 * lease's local deadline minus its safety margin: the lease may have
 * expired, and the server may grant the lock to someone else from the
 * local deadline on. Code `Unavailable` (or that of the last failure).
 */
export class LeaseUncertainError extends LeaseLostError {}

/** The lease was released by `Lease.unlock()` or `WardenClient.close()`. Code `Canceled`. */
export class LeaseReleasedError extends WardenError {
  /** @internal */
  constructor(resource: string) {
    super(`warden: lease on ${resource} released`, Code.Canceled);
  }
}

/**
 * A reservation was refused for lack of room. Code `ResourceExhausted`.
 */
export class QuotaExhaustedError extends WardenError {
  /** The key of the level that refused (e.g. "pool/tenant"). */
  readonly level: string;
  /** "LIMIT" (the level's limit has no room) or "FAIR_SHARE" (the key's fair share of its parent has none). */
  readonly reason: string;
  /** The room left at that level. */
  readonly remaining: bigint;
  /** Milliseconds to the nearest expiry of a reservation under that level; undefined when none is pending. */
  readonly retryAfterMs: number | undefined;

  /** @internal */
  constructor(level: string, reason: string, remaining: bigint, retryAfterMs: number | undefined, cause?: unknown) {
    super(`warden: quota exhausted at ${level} (${reason}): ${remaining} left`, Code.ResourceExhausted, { cause });
    this.level = level;
    this.reason = reason;
    this.remaining = remaining;
    this.retryAfterMs = retryAfterMs;
  }
}

/**
 * The server refused a request field. Code `InvalidArgument`.
 */
export class InvalidArgumentError extends WardenError {
  /** The refused field (e.g. "resource", "lease_ttl"); empty when the server named none. */
  readonly field: string;
  /** Why it was refused. */
  readonly description: string;

  /** @internal */
  constructor(field: string, description: string, message: string, cause?: unknown) {
    super(message, Code.InvalidArgument, { cause });
    this.field = field;
    this.description = description;
  }
}

/** The call carried no valid credentials (missing, malformed, revoked or wrong token). Code `Unauthenticated`. */
export class UnauthenticatedError extends WardenError {}

/** The credentials are valid but do not grant the call (e.g. a resource outside the role's prefix). Code `PermissionDenied`. */
export class PermissionDeniedError extends WardenError {}

/** The client was closed: `lock()` and other calls fail with it afterwards. Code `Canceled`. */
export class ClientClosedError extends WardenError {
  /** @internal */
  constructor() {
    super("warden: client closed", Code.Canceled);
  }
}

/**
 * Converts an error from a call into the SDK's typed errors: details
 * (LockHeld, QuotaExhausted, FieldViolation) become their classes,
 * authentication failures theirs, and everything else a WardenError with
 * the Connect code. `resource` names the lock for LockHeldError.
 * @internal
 */
export function toWardenError(err: unknown, what: string, resource = ""): WardenError {
  if (err instanceof WardenError) return err;
  const ce = ConnectError.from(err);
  switch (ce.code) {
    case Code.Aborted: {
      const held = ce.findDetails(LockHeldSchema)[0];
      if (held !== undefined) {
        return new LockHeldError(resource, held.fencingToken, held.expiresAt && timestampDate(held.expiresAt), ce);
      }
      break;
    }
    case Code.ResourceExhausted: {
      const q = ce.findDetails(QuotaExhaustedSchema)[0];
      if (q !== undefined) {
        return new QuotaExhaustedError(q.level, q.reason, q.remaining, q.retryAfter && durationMs(q.retryAfter), ce);
      }
      break;
    }
    case Code.InvalidArgument: {
      const fv = ce.findDetails(FieldViolationSchema)[0];
      return new InvalidArgumentError(fv?.field ?? "", fv?.description ?? ce.rawMessage, `warden: ${what}: ${ce.rawMessage}`, ce);
    }
    case Code.Unauthenticated:
      return new UnauthenticatedError(`warden: ${what}: unauthenticated: ${ce.rawMessage}`, ce.code, { cause: ce });
    case Code.PermissionDenied:
      return new PermissionDeniedError(`warden: ${what}: permission denied: ${ce.rawMessage}`, ce.code, { cause: ce });
  }
  return new WardenError(`warden: ${what}: [${Code[ce.code]}] ${ce.rawMessage}`, ce.code, { cause: ce });
}

/** @internal An InvalidArgumentError the SDK raises itself, before any call, naming field. */
export function invalid(field: string, description: string): InvalidArgumentError {
  return new InvalidArgumentError(field, description, `warden: ${field}: ${description}`);
}

/** @internal Checks a time option, ms: undefined, or a finite number ≥ 0 (else an InvalidArgumentError naming field). */
export function checkMs(field: string, v: number | undefined): number | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0) {
    throw invalid(field, `${field} must be a finite number of milliseconds ≥ 0, not ${String(v)}`);
  }
  return v;
}
