/**
 * Lock → unlock round-trip latency of the TypeScript SDK (Node.js client,
 * HTTP/2), sequential, after a warm-up. Prints one JSON object with the
 * median, p90 and p99 in milliseconds.
 *
 *   npx tsc -p bench && node dist/bench/roundtrip.js [endpoint] [--n 2000] [--warmup 200] [--same]
 *
 * The endpoint comes from the first argument or $WARDEN_ENDPOINT
 * ("http://127.0.0.1:7070"); without one, the bench starts its own
 * `wardend --dev` (see test/harness.ts). $WARDEN_TOKEN and $WARDEN_CA (a
 * PEM file) configure a secure cluster. By default each round locks a
 * distinct resource; --same locks one resource every time.
 */
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { createClient } from "../src/node.js";
import { startDev, type WardenCluster } from "../test/harness.js";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    n: { type: "string", default: "2000" },
    warmup: { type: "string", default: "200" },
    same: { type: "boolean", default: false },
    ttl: { type: "string", default: "30000" },
  },
});

/** The q-quantile (0..1) of sorted values, nearest rank. */
function quantile(sorted: number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!;
}

const round3 = (x: number) => Math.round(x * 1000) / 1000;

async function main(): Promise<void> {
  const n = Number(values.n);
  const warmup = Number(values.warmup);
  const ttl = Number(values.ttl);
  let dev: WardenCluster | undefined;
  let endpoint = positionals[0] ?? process.env.WARDEN_ENDPOINT;
  if (endpoint === undefined) {
    dev = await startDev();
    endpoint = dev.url();
  }
  const client = createClient({
    endpoints: [endpoint],
    token: process.env.WARDEN_TOKEN,
    ca: process.env.WARDEN_CA ? readFileSync(process.env.WARDEN_CA) : undefined,
  });
  try {
    const prefix = `bench/ts/${process.pid}`;
    const resource = (i: number) => (values.same ? `${prefix}/same` : `${prefix}/${i}`);
    for (let i = 0; i < warmup; i++) {
      const l = await client.lock(resource(-1 - i), { ttl });
      await l.unlock();
    }
    const ms: number[] = [];
    const start = performance.now();
    for (let i = 0; i < n; i++) {
      const t0 = performance.now();
      const l = await client.lock(resource(i), { ttl });
      await l.unlock();
      ms.push(performance.now() - t0);
    }
    const total = performance.now() - start;
    ms.sort((a, b) => a - b);
    console.log(
      JSON.stringify({
        sdk: "typescript",
        runtime: `node ${process.version}`,
        endpoint,
        op: "lock+unlock",
        resources: values.same ? "same" : "distinct",
        n,
        warmup,
        median_ms: round3(quantile(ms, 0.5)),
        p90_ms: round3(quantile(ms, 0.9)),
        p99_ms: round3(quantile(ms, 0.99)),
        min_ms: round3(ms[0]!),
        max_ms: round3(ms[ms.length - 1]!),
        mean_ms: round3(ms.reduce((a, b) => a + b, 0) / n),
        ops_per_s: Math.round((n / total) * 1000),
      }),
    );
  } finally {
    await client.close();
    await dev?.stop();
  }
}

await main();
