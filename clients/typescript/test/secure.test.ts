/**
 * The SDK against a three-process cluster serving TLS with authentication
 * on (`warden tls local` material, bearer tokens).
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { Code, PermissionDeniedError, UnauthenticatedError, WardenError } from "../src/index.js";
import { createClient, type NodeClientOptions } from "../src/node.js";
import { startCluster, type SecureMaterial, type WardenCluster } from "./harness.js";

const T = { timeout: 60_000 };

describe("secure cluster (TLS + bearer tokens)", { timeout: 600_000 }, () => {
  let cluster: WardenCluster;
  let sec: SecureMaterial;
  let n = 0;
  const res = (prefix: string) => `${prefix}${process.pid}-${++n}`;

  /** Runs fn with a client that is closed afterwards. */
  async function withClient<T>(o: Partial<NodeClientOptions>, fn: (c: ReturnType<typeof createClient>) => Promise<T>): Promise<T> {
    const c = createClient({ endpoints: cluster.endpoints, ca: sec.ca, retry: { callTimeoutMs: 5_000 }, ...o });
    try {
      return await fn(c);
    } finally {
      await c.close(2_000);
    }
  }

  before(async () => {
    cluster = await startCluster({ nodes: 3, secure: true });
    sec = cluster.secure!;
  });

  after(async () => {
    await cluster?.stop();
  });

  test("https endpoints, the cluster's CA and a valid token: lock and unlock", T, async () => {
    assert.match(cluster.url(1), /^https:/);
    await withClient({ token: sec.adminToken }, async (c) => {
      const r = res("any/");
      const lease = await c.lock(r, { ttl: 5_000 });
      assert.equal((await c.describe(r)).token, lease.token);
      await lease.unlock();
    });
  });

  test("a credentials callback supplies the token per call", T, async () => {
    let calls = 0;
    const credentials = async () => {
      calls++;
      return sec.ordersToken;
    };
    await withClient({ credentials }, async (c) => {
      const lease = await c.lock(res("orders/"), { ttl: 5_000 });
      await lease.unlock();
    });
    assert.ok(calls >= 2);
  });

  test("no token: UnauthenticatedError at once", T, async () => {
    await withClient({}, async (c) => {
      const start = Date.now();
      await assert.rejects(c.lock(res("orders/")), (e: unknown) => {
        assert.ok(e instanceof UnauthenticatedError, String(e));
        assert.equal(e.code, Code.Unauthenticated);
        return true;
      });
      assert.ok(Date.now() - start < 3_000, "not retried");
    });
  });

  test("a wrong token: UnauthenticatedError", T, async () => {
    const [prefix, id] = sec.adminToken.split(".");
    const wrong = `${prefix}.${id}.${"0".repeat(43)}`;
    for (const token of [wrong, "not-a-token"]) {
      await withClient({ token }, async (c) => {
        await assert.rejects(c.lock(res("orders/")), (e: unknown) => e instanceof UnauthenticatedError && e.code === Code.Unauthenticated);
      });
    }
  });

  test("a token whose role does not grant the resource: PermissionDeniedError", T, async () => {
    await withClient({ token: sec.ordersToken }, async (c) => {
      await assert.rejects(c.lock(res("payments/")), (e: unknown) => e instanceof PermissionDeniedError && e.code === Code.PermissionDenied);
      const lease = await c.lock(res("orders/"), { ttl: 5_000 });
      await lease.unlock();
    });
  });

  test("a client certificate authenticates without a token", T, async () => {
    await withClient({ cert: sec.clientCert, key: sec.clientKey }, async (c) => {
      const lease = await c.lock(res("orders/"), { ttl: 5_000 });
      await lease.unlock();
      await assert.rejects(c.lock(res("payments/")), PermissionDeniedError);
    });
  });

  test("without the cluster's CA the TLS handshake fails at once, naming the certificate", T, async () => {
    const c = createClient({ endpoints: cluster.endpoints, token: sec.adminToken, retry: { callTimeoutMs: 5_000 } });
    try {
      const start = Date.now();
      await assert.rejects(c.lock(res("orders/")), (e: unknown) => e instanceof WardenError && /certificate/i.test(e.message));
      assert.ok(Date.now() - start < 3_000, "not retried");
    } finally {
      await c.close();
    }
  });
});
