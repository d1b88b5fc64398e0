/**
 * The SDK against a real three-process cluster: failover when the node the
 * client talks to dies, and the lease's signal when the whole cluster is
 * paused.
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { LeaseUncertainError, type WardenClient } from "../src/index.js";
import { createClient } from "../src/node.js";
import { startCluster, type WardenCluster } from "./harness.js";
import { aborted, waitFor } from "./util.js";

describe("three-process cluster", { timeout: 600_000 }, () => {
  let cluster: WardenCluster;
  let n = 0;
  const res = (what: string) => `ts/${what}/${process.pid}-${++n}`;
  const clients: WardenClient[] = [];
  const newClient = () => {
    const c = createClient({ endpoints: cluster.endpoints, retry: { attemptTimeoutMs: 2_000 } });
    clients.push(c);
    return c;
  };

  before(async () => {
    cluster = await startCluster({ nodes: 3 });
  });

  after(async () => {
    await Promise.allSettled(clients.map((c) => c.close(2_000)));
    await cluster?.stop();
  });

  test("the signal aborts before the server's expiry when every node is SIGSTOPped; no one gets a lower token", { timeout: 120_000 }, async () => {
    const c = newClient();
    const r = res("paused");
    const ttl = 3_000;
    const sent = Date.now();
    const lease = await c.lock(r, { ttl });
    const got = Date.now();
    // The local deadline starts from the send time (between sent and got,
    // however long a busy machine took), so it is not after the server's
    // expiry (commit time + TTL). 5 ms: expiresAt maps the monotonic
    // clock onto the wall clock.
    const local = lease.expiresAt.getTime();
    assert.ok(sent + ttl - 5 <= local && local <= got + ttl + 5, `local deadline ${local}: sent ${sent}, answered ${got}, TTL ${ttl}`);
    // Let one renewal happen, then freeze the cluster.
    await waitFor("a renewal", () => lease.expiresAt.getTime() > sent + ttl + 200, 10_000);
    const before = await c.describe(r);
    assert.equal(before.token, lease.token);
    const localDeadline = lease.expiresAt.getTime();
    const serverExpiry = before.expiresAt!.getTime();
    for (let i = 1; i <= 3; i++) cluster.pause(i);
    let abortedAt: number;
    try {
      abortedAt = await aborted(lease.signal, 2 * ttl);
    } finally {
      for (let i = 1; i <= 3; i++) cluster.resume(i);
    }
    assert.ok(lease.err instanceof LeaseUncertainError, String(lease.err));
    assert.ok(abortedAt < serverExpiry, `aborted at ${abortedAt}, after the server's expiry ${serverExpiry}`);
    assert.ok(abortedAt <= localDeadline - lease.safetyMarginMs + 500, `aborted at ${abortedAt}, local deadline ${localDeadline}`);
    await cluster.waitReady();
    // Whoever gets the lock next gets a higher token.
    const other = newClient();
    const next = await other.lock(r, { ttl: 5_000, wait: 30_000 });
    assert.ok(next.token > lease.token, `token ${next.token} after ${lease.token}`);
    assert.equal((await other.describe(r)).token, next.token);
    await next.unlock();
  });

  test("a client fails over when its node is SIGKILLed; held leases keep renewing", { timeout: 120_000 }, async () => {
    const c = newClient();
    assert.equal(c.currentEndpoint, cluster.url(1));
    const r = res("failover");
    const ttl = 5_000;
    const lease = await c.lock(r, { ttl });
    await cluster.kill(1);
    const killedAt = Date.now();
    try {
      const other = await c.lock(res("failover-new"), { ttl });
      assert.notEqual(c.currentEndpoint, cluster.url(1));
      await other.unlock();
      // Renewals go on through the other nodes: the local deadline moves
      // past the kill by more than a TTL.
      await waitFor("renewals after the kill", () => lease.expiresAt.getTime() > killedAt + ttl + 500, 20_000);
      assert.equal(lease.signal.aborted, false, `lease ended: ${lease.err}`);
      assert.equal((await c.describe(r)).token, lease.token);
      await lease.unlock();
      assert.equal((await c.describe(r)).held, false);
    } finally {
      await cluster.restart(1);
    }
  });
});
