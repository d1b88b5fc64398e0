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
import { UnauthenticatedError, WardenClient, type TransportFactory } from "../src/index.js";
import { createWebTransport } from "../src/web.js";
import { sleep } from "./harness.js";
import { aborted } from "./util.js";

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
