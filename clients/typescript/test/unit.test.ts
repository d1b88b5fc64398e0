/**
 * The client core on in-memory transports (Connect's router transport):
 * behaviours a real cluster shows only by chance — a NotLeader redirect, a
 * server without RenewBatch.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { durationFromMs, timestampNow } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient as createConnectClient, createRouterTransport, type ConnectRouter } from "@connectrpc/connect";
import { LockService, NotLeaderSchema } from "../src/gen/warden/v1/lock_pb.js";
import { AdminService, ListNodesRequestSchema, ListNodesResponseSchema } from "../src/gen/warden/v1/admin_pb.js";
import { QuotaService } from "../src/gen/warden/v1/quota_pb.js";
import { InvalidArgumentError, LeaseLostError, LeaseUncertainError, Reservation, UnauthenticatedError, WardenClient, type TransportFactory } from "../src/index.js";
import { createClient as createNodeClient } from "../src/node.js";
import { createClient as createWebClient, createWebTransport } from "../src/web.js";
import { sleep } from "./harness.js";
import { aborted, waitFor } from "./util.js";

/** A factory whose endpoint `base` is served by routes(base). */
function fake(routes: (base: string) => (router: ConnectRouter) => void): TransportFactory {
  return { create: (base, interceptors) => createRouterTransport(routes(base), { transport: { interceptors } }) };
}

const grant = { leaseId: "0123456789abcdef0123456789abcdef", fencingToken: 7n, expiresAt: timestampNow(), leaseTtl: durationFromMs(1_000) };

test("a NotLeader answer sends the retry, with the same request id, straight to the named leader", { timeout: 10_000 }, async () => {
  const seen: Array<[string, string]> = [];
  const client = new WardenClient(
    { endpoints: ["http://a:1", "http://c:3", "http://b:2"] },
    fake((base) => (router) =>
      router.service(LockService, {
        acquire(req) {
          seen.push([base, req.requestId]);
          if (base !== "http://b:2") {
            throw new ConnectError("not the leader", Code.Unavailable, undefined, [
              { desc: NotLeaderSchema, value: create(NotLeaderSchema, { shardId: 1n, leaderNodeId: 2n, leaderAddress: "b:2" }) },
            ]);
          }
          return grant;
        },
        release: () => ({ released: true }),
      }),
    ),
  );
  const lease = await client.lock("r", { ttl: 1_000 });
  assert.equal(lease.token, 7n);
  assert.deepEqual(
    seen.map(([b]) => b),
    ["http://a:1", "http://b:2"],
  );
  assert.equal(seen[0]![1], seen[1]![1], "same request id");
  assert.equal(client.currentEndpoint, "http://b:2");
  await client.close();
});

test("a server without RenewBatch gets plain Renew calls", { timeout: 10_000 }, async () => {
  let batches = 0;
  let renews = 0;
  const client = new WardenClient(
    { endpoints: ["http://a:1"] },
    fake(() => (router) =>
      router.service(LockService, {
        acquire: () => grant,
        renewBatch() {
          batches++;
          throw new ConnectError("no", Code.Unimplemented);
        },
        renew() {
          renews++;
          return { expiresAt: timestampNow() };
        },
        release: () => ({ released: true }),
      }),
    ),
  );
  const lease = await client.lock("r", { ttl: 1_000 });
  while (renews < 3) await sleep(50);
  assert.equal(batches, 1, "RenewBatch is not asked again");
  assert.equal(lease.signal.aborted, false);
  await client.close();
});

test("a renewal the server refuses ends the lease with LeaseLostError", { timeout: 10_000 }, async () => {
  const client = new WardenClient(
    { endpoints: ["http://a:1"] },
    fake(() => (router) =>
      router.service(LockService, {
        acquire: () => grant,
        renewBatch: () => ({ outcomes: [{ code: "failed_precondition", message: "lease is not current" }] }),
        release: () => ({ released: false }),
      }),
    ),
  );
  const lease = await client.lock("r", { ttl: 1_000 });
  await aborted(lease.signal, 5_000); // a ref'd wait: the lease's own timers do not keep the process alive
  assert.equal(lease.reason, "lost");
  assert.equal(lease.err?.code, Code.FailedPrecondition);
  await client.close();
});

test("the bearer interceptor asks credentials at every call, renewals too, and a failing callback is not retried", { timeout: 10_000 }, async () => {
  const seen: string[] = [];
  let n = 0;
  const client = new WardenClient(
    { endpoints: ["http://a:1", "http://b:2"], token: "ignored", credentials: () => `t${++n}` },
    fake(() => (router) =>
      router.service(LockService, {
        acquire: (_req, ctx) => {
          seen.push(`acquire ${ctx.requestHeader.get("authorization")}`);
          return grant;
        },
        renewBatch: (req, ctx) => {
          seen.push(`renew ${ctx.requestHeader.get("authorization")}`);
          return { outcomes: req.renewals.map(() => ({ code: "", expiresAt: timestampNow() })) };
        },
        release: (_req, ctx) => {
          seen.push(`release ${ctx.requestHeader.get("authorization")}`);
          return { released: true };
        },
      }),
    ),
  );
  const lease = await client.lock("r", { ttl: 1_000 });
  while (seen.length < 2) await sleep(50);
  await lease.unlock();
  assert.deepEqual(seen.slice(0, 2), ["acquire Bearer t1", "renew Bearer t2"]);
  assert.match(seen.at(-1)!, /^release Bearer t\d+$/);
  await client.close();

  let calls = 0;
  let attempts = 0;
  const failing = new WardenClient(
    {
      endpoints: ["http://a:1", "http://b:2"],
      credentials: async () => {
        calls++;
        throw new TypeError("Failed to fetch the token"); // looks like a lost answer: still not retried
      },
    },
    fake(() => (router) => router.service(LockService, { acquire: () => (attempts++, grant) })),
  );
  await assert.rejects(failing.lock("r"), (e: unknown) => {
    assert.ok(e instanceof UnauthenticatedError, String(e));
    assert.match(e.message, /credentials: Failed to fetch the token/);
    return true;
  });
  assert.equal(calls, 1, "not retried");
  assert.equal(attempts, 0, "nothing sent");
  await failing.close();
});

test("createWebTransport: Connect binary by default, the bearer token, more interceptors; no token, no header", { timeout: 10_000 }, async () => {
  const sent: Array<{ url: string; contentType: string | null; authorization: string | null; extra: string | null }> = [];
  const fetch: typeof globalThis.fetch = async (input, init) => {
    const h = new Headers(init?.headers);
    sent.push({ url: String(input), contentType: h.get("content-type"), authorization: h.get("authorization"), extra: h.get("x-extra") });
    fromBinary(ListNodesRequestSchema, new Uint8Array(await new Response(init?.body).arrayBuffer()));
    const body = toBinary(ListNodesResponseSchema, create(ListNodesResponseSchema, { placementLeaderId: 3n }));
    return new Response(body, { status: 200, headers: { "content-type": "application/proto" } });
  };
  const admin = createConnectClient(
    AdminService,
    createWebTransport({
      baseUrl: "http://n1:7070",
      token: "tok",
      fetch,
      interceptors: [(next) => (req) => (req.header.set("x-extra", req.header.get("authorization") ?? "none"), next(req))],
    }),
  );
  assert.equal((await admin.listNodes({})).placementLeaderId, 3n);
  assert.deepEqual(sent[0], {
    url: "http://n1:7070/warden.v1.AdminService/ListNodes",
    contentType: "application/proto",
    authorization: "Bearer tok",
    extra: "Bearer tok", // the bearer interceptor runs first
  });
  const anon = createConnectClient(AdminService, createWebTransport({ baseUrl: "http://n1:7070", fetch, credentials: () => "" }));
  await anon.listNodes({});
  assert.equal(sent[1]!.authorization, null);
});

test("endpoints must be http: or https: base URLs: anything else throws InvalidArgumentError naming endpoints at once", { timeout: 10_000 }, () => {
  const none = fake(() => () => undefined);
  for (const endpoints of [[], ["localhost:7070"], ["ftp://x"], ["http://ok:1", "file:///etc/passwd"], ["not a url"]]) {
    assert.throws(
      () => new WardenClient({ endpoints }, none),
      (e: unknown) => e instanceof InvalidArgumentError && e.field === "endpoints" && e.code === Code.InvalidArgument,
      JSON.stringify(endpoints),
    );
  }
  for (const make of [createNodeClient, createWebClient]) {
    assert.throws(() => make({ endpoints: ["localhost:7070"] }), (e: unknown) => e instanceof InvalidArgumentError && e.field === "endpoints");
    assert.throws(() => make({ endpoints: ["ftp://x"] }), (e: unknown) => e instanceof InvalidArgumentError && e.field === "endpoints");
  }
  void new WardenClient({ endpoints: ["http://a:1", "https://b:2/prefix"] }, none).close();
});

test("bad numbers are refused with InvalidArgumentError naming the field, before anything is sent; ttl rounds to whole ms", { timeout: 10_000 }, async () => {
  const sent: string[] = [];
  const ttls: number[] = [];
  const client = new WardenClient(
    { endpoints: ["http://a:1"] },
    fake(() => (router) => {
      router.service(LockService, {
        acquire(req) {
          sent.push("acquire");
          const ms = Number(req.leaseTtl!.seconds) * 1000 + req.leaseTtl!.nanos / 1e6;
          ttls.push(ms);
          return { ...grant, leaseTtl: req.leaseTtl };
        },
        renewBatch: (req) => ({ outcomes: req.renewals.map(() => ({ code: "", expiresAt: timestampNow() })) }),
        release: () => ({ released: true }),
      });
      router.service(QuotaService, {
        reserve: () => (sent.push("reserve"), { remaining: 1n }),
        commit: () => (sent.push("commit"), { committed: 1n }),
        setLimit: () => (sent.push("setLimit"), {}),
      } as never);
    }),
  );
  const refused = async (what: string, p: Promise<unknown>, field: string) =>
    assert.rejects(p, (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError, `${what}: ${String(e)}`);
      assert.equal(e.field, field, what);
      assert.equal(e.code, Code.InvalidArgument);
      return true;
    });
  for (const v of [NaN, Infinity, -Infinity, -1000, 0, 0.2]) await refused(`ttl ${v}`, client.lock("r", { ttl: v }), "ttl");
  for (const v of [NaN, Infinity, -1]) await refused(`wait ${v}`, client.lock("r", { ttl: 5_000, wait: v }), "wait");
  for (const v of [NaN, Infinity, -1]) await refused(`timeoutMs ${v}`, client.lock("r", { ttl: 5_000, timeoutMs: v }), "timeoutMs");
  for (const v of [NaN, Infinity, -1]) await refused(`describe timeoutMs ${v}`, client.describe("r", { timeoutMs: v }), "timeoutMs");
  for (const v of [NaN, 1.5, Infinity, 2 ** 60]) await refused(`reserve ${v}`, client.reserve("pool/a", v), "amount");
  await refused("reserve 2^70n", client.reserve("pool/a", 2n ** 70n), "amount");
  await refused("reserve ttl NaN", client.reserve("pool/a", 1, { ttl: NaN }), "ttl");
  await refused("setLimit 2^70n", client.setLimit("pool", 2n ** 70n), "limit");
  const r = new Reservation(client, "pool/a", "id", 1n, 0n, undefined);
  for (const v of [NaN, 1.5]) await refused(`commit ${v}`, r.commit(v), "amount");
  assert.deepEqual(sent, [], "nothing was sent");
  assert.throws(() => new WardenClient({ endpoints: ["http://a:1"], retry: { callTimeoutMs: NaN } }, fake(() => () => undefined)), (e: unknown) => e instanceof InvalidArgumentError && e.field === "retry.callTimeoutMs");

  const lease = await client.lock("r", { ttl: 1500.7 });
  assert.deepEqual(ttls, [1501], "rounded to the nearest ms");
  assert.equal(lease.ttlMs, 1501);
  await refused("unlock NaN", lease.unlock(NaN), "timeoutMs");
  assert.equal(lease.signal.aborted, false, "a refused unlock does nothing");
  await lease.unlock();
  await client.close();
});

test("safetyMargin must be a finite number with 0 ≤ margin < TTL: checked before the call, and against the server's TTL (released)", { timeout: 10_000 }, async () => {
  let acquires = 0;
  const released: string[] = [];
  const client = new WardenClient(
    { endpoints: ["http://a:1"] },
    fake(() => (router) =>
      router.service(LockService, {
        acquire: () => (acquires++, { ...grant, leaseTtl: durationFromMs(2_000) }), // the server picks 2 s
        renewBatch: (req) => ({ outcomes: req.renewals.map(() => ({ code: "", expiresAt: timestampNow() })) }),
        release: (req) => (released.push(req.leaseId), { released: true }),
      }),
    ),
  );
  const refused = (what: string, p: Promise<unknown>) =>
    assert.rejects(p, (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError, `${what}: ${String(e)}`);
      assert.equal(e.field, "safetyMargin", what);
      return true;
    });
  for (const m of [-10_000, -1, NaN, Infinity, 5_000, 99_999]) await refused(`margin ${m}`, client.lock("r", { ttl: 5_000, safetyMargin: m }));
  assert.equal(acquires, 0, "refused before any call");
  // No ttl: the server's 2 s does not fit a 3 s margin; the grant is given back.
  await refused("margin 3000 vs the server's 2 s", client.lock("r", { safetyMargin: 3_000 }));
  assert.equal(acquires, 1);
  await waitFor("the grant's release", () => released.length === 1, 5_000);
  const ok = await client.lock("r", { ttl: 5_000, safetyMargin: 0 });
  assert.equal(ok.safetyMarginMs, 0);
  await ok.unlock();
  await client.close();
});

test("a caller-supplied requestId: lock() renews the grant before returning it; a renewal that says lost throws LeaseLostError", { timeout: 10_000 }, async () => {
  let renewals = 0;
  let lost = false;
  const client = new WardenClient(
    { endpoints: ["http://a:1"] },
    fake(() => (router) =>
      router.service(LockService, {
        acquire: () => ({ ...grant, leaseTtl: durationFromMs(10_000) }),
        renewBatch: (req) => {
          renewals++;
          return { outcomes: req.renewals.map(() => (lost ? { code: "failed_precondition", message: "lease is not current" } : { code: "", expiresAt: timestampNow() })) };
        },
        release: () => ({ released: true }),
      }),
    ),
  );
  const own = await client.lock("r", { ttl: 10_000 });
  assert.equal(renewals, 0, "an SDK-generated id is not renewed at once");
  await own.unlock();
  const before = performance.now();
  const lease = await client.lock("r", { ttl: 10_000, requestId: "mine" });
  assert.equal(renewals, 1, "renewed before it was handed out");
  assert.ok(lease.expiresAt.getTime() - Date.now() > 10_000 - (performance.now() - before) - 5, "the deadline runs from the renewal's send time");
  await lease.unlock();
  lost = true;
  await assert.rejects(client.lock("r", { ttl: 10_000, requestId: "mine" }), (e: unknown) => {
    assert.ok(e instanceof LeaseLostError && !(e instanceof LeaseUncertainError), String(e));
    assert.equal(e.code, Code.FailedPrecondition);
    return true;
  });
  await client.close();
});
