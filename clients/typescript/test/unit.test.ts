/**
 * The client core on in-memory transports (Connect's router transport):
 * behaviours a real cluster shows only by chance — a NotLeader redirect, a
 * server without RenewBatch.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { durationFromMs, timestampNow } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createRouterTransport, type ConnectRouter } from "@connectrpc/connect";
import { LockService, NotLeaderSchema } from "../src/gen/warden/v1/lock_pb.js";
import { WardenClient, type TransportFactory } from "../src/index.js";
import { sleep } from "./harness.js";
import { aborted } from "./util.js";

/** A factory whose endpoint `base` is served by routes(base). */
function fake(routes: (base: string) => (router: ConnectRouter) => void): TransportFactory {
  return { create: (base) => createRouterTransport(routes(base)) };
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
