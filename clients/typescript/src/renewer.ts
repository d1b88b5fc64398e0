/**
 * Batching of lease renewals through RenewBatch, one Renewer per endpoint.
 *
 * @module
 */
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { codeFromString } from "@connectrpc/connect/protocol-connect";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { LockService, RenewOutcome } from "./gen/warden/v1/lock_pb.js";
import { isRetryable } from "./retry.js";

/** The most renewals one RenewBatch call carries (the server's bound). */
const MAX_RENEW_BATCH = 1000;

/** Bound on a RenewBatch request's encoded size, under the server's 64 KiB request limit. */
const MAX_BATCH_BYTES = 48 << 10;

/** How long a renewal is held to share a call with others, ms (as the Go SDK's DefaultLinger). */
const LINGER_MS = 50;

/** A renewal's result: when the call that carried it was sent (performance.now() ms) and the server's new expiry. */
export interface Renewed {
  sentAt: number;
  expiresAt: Date | undefined;
}

interface Pending {
  resource: string;
  leaseId: string;
  signal: AbortSignal;
  resolve: (r: Renewed) => void;
  reject: (e: unknown) => void;
}

const encoder = new TextEncoder();

/**
 * Sends the renewals of a client's leases through one endpoint's
 * LockService in RenewBatch calls: renewals that fall due within the
 * linger period of each other share a call (at most 1,000 and 48 KiB per
 * call). A server without RenewBatch (Unimplemented), or a call refused as
 * a whole for another reason than a retryable one, gets plain Renew calls.
 * @internal
 */
export class Renewer {
  private queue: Pending[] = [];
  private timer: ReturnType<typeof setTimeout> | undefined;
  private single = false;

  constructor(private readonly locks: Client<typeof LockService>) {}

  /**
   * Renews one lease, batched with the renewals due at about the same
   * time. Resolves with the send time of the call that carried it; rejects
   * with a ConnectError carrying the code Renew would have answered, or
   * the signal's abort.
   */
  renew(resource: string, leaseId: string, signal: AbortSignal): Promise<Renewed> {
    return new Promise<Renewed>((resolve, reject) => {
      if (signal.aborted) {
        reject(ConnectError.from(signal.reason, Code.Canceled));
        return;
      }
      this.queue.push({ resource, leaseId, signal, resolve, reject });
      signal.addEventListener("abort", () => reject(ConnectError.from(signal.reason, Code.Canceled)), { once: true });
      if (this.queue.length >= MAX_RENEW_BATCH) {
        this.flush();
      } else if (this.timer === undefined) {
        // Not unref'd: a renewal someone awaits must go out.
        this.timer = setTimeout(() => this.flush(), LINGER_MS);
      }
    });
  }

  /** Sends what is queued, in calls of at most MAX_RENEW_BATCH renewals and MAX_BATCH_BYTES. */
  private flush(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    let live = this.queue.filter((p) => !p.signal.aborted);
    this.queue = [];
    while (live.length > 0) {
      let n = 0;
      let size = 0;
      while (n < live.length && n < MAX_RENEW_BATCH) {
        const p = live[n]!;
        size += encoder.encode(p.resource).length + p.leaseId.length + 8;
        if (n > 0 && size > MAX_BATCH_BYTES) break;
        n++;
      }
      const batch = live.slice(0, n);
      live = live.slice(n);
      void (this.single ? this.sendEach(batch) : this.sendBatch(batch));
    }
  }

  private async sendBatch(batch: Pending[]): Promise<void> {
    const call = callSignal(batch);
    const sentAt = performance.now();
    try {
      const resp = await this.locks.renewBatch(
        { renewals: batch.map((p) => ({ resource: p.resource, leaseId: p.leaseId })) },
        { signal: call.signal },
      );
      if (resp.outcomes.length !== batch.length) {
        const e = new ConnectError(`RenewBatch answered ${resp.outcomes.length} outcomes for ${batch.length} renewals`, Code.Internal);
        for (const p of batch) p.reject(e);
        return;
      }
      batch.forEach((p, i) => settle(p, sentAt, resp.outcomes[i]!));
    } catch (err) {
      const ce = ConnectError.from(err);
      const unimplemented = ce.code === Code.Unimplemented;
      const refused = !unimplemented && ce.code !== Code.DeadlineExceeded && ce.code !== Code.Canceled && !isRetryable(ce);
      if (unimplemented) this.single = true;
      if (unimplemented || refused) {
        await this.sendEach(batch);
        return;
      }
      for (const p of batch) p.reject(ce);
    } finally {
      call.dispose();
    }
  }

  /** Renews each of batch in its own Renew call, all at once. */
  private async sendEach(batch: Pending[]): Promise<void> {
    await Promise.all(
      batch.map(async (p) => {
        const sentAt = performance.now();
        try {
          const r = await this.locks.renew({ resource: p.resource, leaseId: p.leaseId }, { signal: p.signal });
          p.resolve({ sentAt, expiresAt: r.expiresAt && timestampDate(r.expiresAt) });
        } catch (err) {
          p.reject(err);
        }
      }),
    );
  }
}

/** Resolves or rejects p by its outcome in a RenewBatch answer. */
function settle(p: Pending, sentAt: number, o: RenewOutcome): void {
  if (o.code === "") {
    p.resolve({ sentAt, expiresAt: o.expiresAt && timestampDate(o.expiresAt) });
    return;
  }
  p.reject(new ConnectError(o.message, codeFromString(o.code) ?? Code.Unknown));
}

/**
 * A signal for a call on behalf of batch: it aborts once every one of the
 * batch's callers has given up.
 */
function callSignal(batch: Pending[]): { signal: AbortSignal; dispose: () => void } {
  const ctl = new AbortController();
  let left = batch.length;
  const onAbort = () => {
    if (--left === 0) ctl.abort();
  };
  for (const p of batch) p.signal.addEventListener("abort", onAbort, { once: true });
  return {
    signal: ctl.signal,
    dispose: () => {
      for (const p of batch) p.signal.removeEventListener("abort", onAbort);
    },
  };
}

/** Lets the process exit while t is pending (Node.js); a no-op in browsers. @internal */
export function unref(t: ReturnType<typeof setTimeout> | undefined): void {
  if (typeof t === "object" && t !== null && "unref" in t && typeof t.unref === "function") t.unref();
}
