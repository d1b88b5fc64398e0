/**
 * The SDK against a real `wardend --dev` (a whole 3-replica cluster in one
 * process).
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { fromBinary } from "@bufbuild/protobuf";
import { AcquireRequestSchema, AcquireResponseSchema } from "../src/gen/warden/v1/lock_pb.js";
import { ReserveRequestSchema } from "../src/gen/warden/v1/quota_pb.js";
import {
  ClientClosedError,
  Code,
  InvalidArgumentError,
  LeaseReleasedError,
  LockHeldError,
  QuotaExhaustedError,
  WaitTimeoutError,
  WardenError,
  type WardenClient,
} from "../src/index.js";
import { createClient } from "../src/node.js";
import { createClient as createWebClient } from "../src/web.js";
import { sleep, startDev, type WardenCluster } from "./harness.js";
import { AnswerProxy, aborted, waitFor } from "./util.js";

const T = { timeout: 60_000 };

describe("wardend --dev", { timeout: 600_000 }, () => {
  let dev: WardenCluster;
  let client: WardenClient;
  let n = 0;
  /** A resource name unique to this run. */
  const res = (what: string) => `ts/${what}/${process.pid}-${++n}`;

  before(async () => {
    dev = await startDev();
    client = createClient({ endpoints: [dev.url()] });
  });

  after(async () => {
    await client?.close();
    await dev?.stop();
  });

  test("grants a lease whose fencing token increases with every grant", T, async () => {
    const r = res("grant");
    const a = await client.lock(r, { ttl: 5_000, holder: "ts-a" });
    assert.equal(a.resource, r);
    assert.equal(a.signal.aborted, false);
    assert.ok(a.token > 0n);
    const d = await client.describe(r);
    assert.deepEqual([d.held, d.holder, d.token], [true, "ts-a", a.token]);
    await a.unlock();
    assert.ok(a.signal.aborted);
    assert.equal(a.reason, "released");
    assert.ok(a.err instanceof LeaseReleasedError);
    assert.equal((await client.describe(r)).held, false);
    const b = await client.lock(r, { ttl: 5_000 });
    assert.ok(b.token > a.token, `second token ${b.token} must exceed ${a.token}`);
    await b.unlock();
  });

  test("a held lock fails at once with LockHeldError carrying the holder's token", T, async () => {
    const r = res("held");
    const a = await client.lock(r, { ttl: 5_000 });
    const other = createClient({ endpoints: [dev.url()] });
    try {
      await assert.rejects(other.lock(r), (e: unknown) => {
        assert.ok(e instanceof LockHeldError, String(e));
        assert.ok(e instanceof WardenError);
        assert.equal(e.code, Code.Aborted);
        assert.equal(e.token, a.token);
        assert.equal(e.resource, r);
        assert.ok(e.expiresAt instanceof Date && e.expiresAt.getTime() > Date.now());
        return true;
      });
    } finally {
      await other.close();
      await a.unlock();
    }
  });

  test("a waiter queues and is granted when the holder releases", T, async () => {
    const r = res("wait");
    const a = await client.lock(r, { ttl: 5_000 });
    const other = createClient({ endpoints: [dev.url()] });
    try {
      const pending = other.lock(r, { ttl: 5_000, wait: 20_000 });
      await waitFor("the waiter to queue", async () => (await client.describe(r)).waiters === 1);
      await a.unlock();
      const b = await pending;
      assert.ok(b.token > a.token);
      assert.equal((await client.describe(r)).token, b.token);
      await b.unlock();
    } finally {
      await other.close();
    }
  });

  test("a wait that runs out fails with WaitTimeoutError", T, async () => {
    const r = res("waitout");
    const a = await client.lock(r, { ttl: 5_000 });
    try {
      const start = Date.now();
      await assert.rejects(client.lock(r, { wait: 1_000 }), (e: unknown) => e instanceof WaitTimeoutError && e.code === Code.DeadlineExceeded);
      assert.ok(Date.now() - start >= 900);
    } finally {
      await a.unlock();
    }
  });

  test("a lease with a 2 s TTL is held through several renewals (6 s)", { timeout: 30_000 }, async () => {
    const r = res("renew");
    const lease = await client.lock(r, { ttl: 2_000 });
    const first = (await client.describe(r)).expiresAt!;
    const firstLocal = lease.expiresAt.getTime();
    await sleep(6_000); // real time must pass: three TTLs
    assert.equal(lease.signal.aborted, false, `lease ended: ${lease.err}`);
    const d = await client.describe(r);
    assert.equal(d.held, true);
    assert.equal(d.token, lease.token, "the server still shows our token");
    assert.ok(d.expiresAt!.getTime() > first.getTime() + 3_000, "the server's expiry moved on");
    assert.ok(lease.expiresAt.getTime() > firstLocal + 3_000, "the local deadline moved on");
    assert.ok(lease.expiresAt.getTime() <= d.expiresAt!.getTime() + 50, "the local deadline is not after the server's expiry");
    await lease.unlock();
  });

  test("many leases renew together through RenewBatch", { timeout: 30_000 }, async () => {
    const proxy = await AnswerProxy.start(dev.url());
    const c = createClient({ endpoints: [proxy.url] });
    try {
      const leases = await Promise.all(Array.from({ length: 20 }, (_, i) => c.lock(res(`batch-${i}`), { ttl: 1_500 })));
      await waitFor("two rounds of renewals", () => proxy.seen("/RenewBatch").length >= 2, 10_000);
      assert.equal(proxy.seen("/Renew").length, 0, "no single Renew calls");
      assert.ok(proxy.seen("/RenewBatch").length < 20, "renewals share calls");
      for (const l of leases) assert.equal(l.signal.aborted, false);
      await Promise.all(leases.map((l) => l.unlock()));
    } finally {
      await c.close();
      await proxy.close();
    }
  });

  test("an invalid field fails with InvalidArgumentError naming it", T, async () => {
    await assert.rejects(client.lock(""), (e: unknown) => e instanceof InvalidArgumentError && e.field === "resource" && e.code === Code.InvalidArgument);
    await assert.rejects(client.lock(res("ttl"), { ttl: 10 }), (e: unknown) => e instanceof InvalidArgumentError && e.field === "lease_ttl");
  });

  test("withLock releases after fn, also when fn throws", T, async () => {
    const r = res("with");
    const token = await client.withLock(r, { ttl: 5_000 }, async (lease) => {
      assert.equal((await client.describe(r)).token, lease.token);
      return lease.token;
    });
    assert.equal((await client.describe(r)).held, false);
    await assert.rejects(
      client.withLock(r, { ttl: 5_000 }, () => {
        throw new Error("boom");
      }),
      /boom/,
    );
    const d = await client.describe(r);
    assert.equal(d.held, false);
    assert.ok(d.token > token);
  });

  test("close() releases held leases; calls fail with ClientClosedError afterwards", T, async () => {
    const c = createClient({ endpoints: [dev.url()] });
    const r1 = res("close");
    const r2 = res("close");
    const l1 = await c.lock(r1, { ttl: 30_000 });
    const l2 = await c.lock(r2, { ttl: 30_000 });
    await c.close();
    assert.ok(l1.signal.aborted && l2.signal.aborted);
    assert.equal((await client.describe(r1)).held, false);
    assert.equal((await client.describe(r2)).held, false);
    await assert.rejects(c.lock(res("closed")), ClientClosedError);
  });

  test("an Acquire answer lost after the grant is replayed with the same request id: same lease", T, async () => {
    for (const fate of ["reset", "held"] as const) {
      const proxy = await AnswerProxy.start(dev.url());
      proxy.decide = (path, k) => (path.endsWith("/Acquire") && k === 1 ? fate : "forward");
      const c = createClient({ endpoints: [proxy.url], retry: { attemptTimeoutMs: 1_000 } });
      try {
        const r = res(`lost-${fate}`);
        const lease = await c.lock(r, { ttl: 10_000 });
        const acq = proxy.seen("/Acquire");
        assert.ok(acq.length >= 2, `attempts: ${acq.length}`);
        assert.equal(acq[0]!.fate, fate);
        const ids = new Set(acq.map((e) => fromBinary(AcquireRequestSchema, e.request).requestId));
        assert.equal(ids.size, 1, "every attempt carries the same request id");
        const lost = fromBinary(AcquireResponseSchema, acq[0]!.response!);
        assert.equal(lease.token, lost.fencingToken, "the retry returned the lease the lost answer carried");
        assert.equal((await client.describe(r)).token, lease.token);
        await lease.unlock();
        assert.equal((await client.describe(r)).held, false, "the one lease is released");
      } finally {
        await c.close();
        await proxy.close();
      }
    }
  });

  test("a grant answered after the caller gave up is released (orphan)", T, async () => {
    const proxy = await AnswerProxy.start(dev.url());
    proxy.delayMs = (path) => (path.endsWith("/Acquire") ? 800 : 0);
    const c = createClient({ endpoints: [proxy.url] });
    try {
      const r = res("orphan");
      await assert.rejects(c.lock(r, { ttl: 30_000, signal: AbortSignal.timeout(200) }), (e: unknown) => e instanceof WardenError && e.code === Code.Canceled);
      const granted = await waitFor("the late grant", () => proxy.seen("/Acquire")[0]?.response);
      const token = fromBinary(AcquireResponseSchema, granted).fencingToken;
      await waitFor("the orphan's release", async () => {
        const d = await client.describe(r);
        return d.token === token && !d.held;
      });
    } finally {
      await c.close();
      await proxy.close();
    }
  });

  test("quota: reserve is idempotent under its reservation id, exhaustion is typed, commit repeats", T, async () => {
    const pool = `tspool${process.pid}${++n}`;
    const key = `${pool}/tenant`;
    await client.setLimit(pool, 100);
    const proxy = await AnswerProxy.start(dev.url());
    proxy.decide = (path, k) => (path.endsWith("/Reserve") && k === 1 ? "reset" : "forward");
    const c = createClient({ endpoints: [proxy.url] });
    try {
      const r1 = await c.reserve(key, 60, { reservationId: "res-1", ttl: 60_000 });
      assert.equal(r1.id, "res-1");
      assert.equal(r1.remaining, 40n);
      const reserves = proxy.seen("/Reserve");
      assert.equal(reserves.length, 2, "the lost answer was retried");
      assert.deepEqual(
        reserves.map((e) => fromBinary(ReserveRequestSchema, e.request).reservationId),
        ["res-1", "res-1"],
      );
      const again = await c.reserve(key, 60, { reservationId: "res-1", ttl: 60_000 });
      assert.equal(again.remaining, 40n, "the same reservation, not a second one");
      const levels = await c.query(key);
      assert.equal(levels[0]!.key, pool);
      assert.equal(levels[0]!.reserved, 60n, "charged once");
      await assert.rejects(c.reserve(key, 50), (e: unknown) => {
        assert.ok(e instanceof QuotaExhaustedError, String(e));
        assert.equal(e.code, Code.ResourceExhausted);
        assert.equal(e.level, pool);
        assert.equal(e.remaining, 40n);
        assert.equal(e.reason, "LIMIT");
        return true;
      });
      assert.equal(await r1.commit(), 60n);
      assert.equal(await r1.commit(), 60n, "a repeated commit returns the first result");
      const after = await c.query(key);
      assert.deepEqual([after[0]!.committed, after[0]!.reserved, after[0]!.remaining], [60n, 0n, 40n]);
      const r2 = await c.reserve(key, 10);
      assert.equal(await r2.release(), true);
      assert.equal(await r2.release(), false);
      await assert.rejects(r1.release(), (e: unknown) => e instanceof WardenError && e.code === Code.FailedPrecondition);
    } finally {
      await c.close();
      await proxy.close();
    }
  });

  test("web transport (fetch): Connect and gRPC-Web protocols", T, async () => {
    for (const protocol of ["connect", "grpc-web"] as const) {
      const c = createWebClient({ endpoints: [dev.url()], protocol });
      try {
        const r = res(`web-${protocol}`);
        const lease = await c.lock(r, { ttl: 5_000 });
        await assert.rejects(c.lock(r), (e: unknown) => e instanceof LockHeldError && e.token === lease.token);
        await lease.unlock();
        assert.equal((await c.describe(r)).held, false);
      } finally {
        await c.close();
      }
    }
  });

  test("the node client's gRPC protocol and HTTP/1.1 work too", T, async () => {
    for (const o of [{ protocol: "grpc" as const }, { httpVersion: "1.1" as const }]) {
      const c = createClient({ endpoints: [dev.url()], ...o });
      try {
        const lease = await c.lock(res("proto"), { ttl: 5_000 });
        await lease.unlock();
      } finally {
        await c.close();
      }
    }
  });

  test("an unreachable cluster fails the call at its timeout, with the last answer", T, async () => {
    const c = createClient({ endpoints: ["http://127.0.0.1:1"], retry: { callTimeoutMs: 1_000 } });
    try {
      const start = Date.now();
      await assert.rejects(c.lock(res("unreachable")), (e: unknown) => e instanceof WardenError && e.code === Code.DeadlineExceeded && /last answer/.test(e.message));
      assert.ok(Date.now() - start < 5_000);
    } finally {
      await c.close();
    }
  });

  test("a wait longer than the TTL: the lease is renewed at once with a fresh cutoff, and held", { timeout: 30_000 }, async () => {
    const r = res("longwait");
    const a = await client.lock(r, { ttl: 3_000 });
    const other = createClient({ endpoints: [dev.url()] });
    try {
      const unlockA = sleep(5_000).then(() => a.unlock());
      const start = Date.now();
      const b = await other.lock(r, { ttl: 3_000, wait: 30_000 });
      await unlockA;
      assert.ok(Date.now() - start >= 4_500, `granted after ${Date.now() - start} ms`);
      assert.ok(b.token > a.token);
      assert.equal(b.signal.aborted, false, `lease ended: ${b.err}`);
      await sleep(4_000); // more than a TTL: renewals keep it
      assert.equal(b.signal.aborted, false, `lease ended: ${b.err}`);
      const d = await client.describe(r);
      assert.deepEqual([d.held, d.token], [true, b.token]);
      await b.unlock();
    } finally {
      await other.close();
    }
  });

  test("a caller-supplied requestId that returns an earlier grant: the local deadline is not after the server's expiry", T, async () => {
    const r = res("reqid");
    const requestId = `ts-reqid-${process.pid}-${++n}`;
    const cli = await dev.cli(["lock", "acquire", r, "--request-id", requestId, "--ttl", "10s"]);
    assert.equal(cli.code, 0, cli.stderr);
    const granted = (await client.describe(r)).token;
    await sleep(3_000);
    const lease = await client.lock(r, { ttl: 10_000, requestId });
    assert.equal(lease.token, granted, "the earlier grant");
    const d = await client.describe(r);
    assert.ok(
      lease.expiresAt.getTime() <= d.expiresAt!.getTime() + 50,
      `local deadline ${lease.expiresAt.toISOString()} is after the server's expiry ${d.expiresAt!.toISOString()}`,
    );
    assert.equal(lease.signal.aborted, false);
    await lease.unlock();
  });

  test("a lease's signal aborts before the server's expiry when the server is paused", { timeout: 30_000 }, async () => {
    const r = res("pause");
    const lease = await client.lock(r, { ttl: 2_000 });
    const serverExpiry = (await client.describe(r)).expiresAt!.getTime();
    dev.pause();
    let abortedAt: number;
    try {
      abortedAt = await aborted(lease.signal, 10_000);
    } finally {
      dev.resume();
    }
    assert.equal(lease.reason, "uncertain");
    assert.ok(abortedAt < serverExpiry, `aborted at ${abortedAt}, server expiry ${serverExpiry}`);
    await dev.waitReady();
    await lease.unlock().catch(() => undefined);
  });
});
