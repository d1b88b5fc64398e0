import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { repoRoot, startCluster, startDev, wardendPath } from "./harness.js";

test("harness: repoRoot is the directory of the server's go.mod", () => {
  assert.match(readFileSync(join(repoRoot, "go.mod"), "utf8"), /^module github\.com\/warden-dev\/warden$/m);
  assert.ok(existsSync(join(repoRoot, "clients/typescript/test/harness.ts")));
  if (process.env.WARDEND === undefined) assert.equal(wardendPath, join(repoRoot, "bin/wardend"));
});

test("harness: dev cluster starts, pauses, resumes, restarts and stops", { timeout: 120_000 }, async () => {
  const dev = await startDev();
  try {
    assert.match(dev.url(), /^http:\/\/127\.0\.0\.1:\d+$/);
    const r = await dev.cli(["admin", "nodes"]);
    assert.equal(r.code, 0, r.stderr);
    dev.pause();
    dev.resume();
    await dev.restart();
    assert.ok(dev.pid() !== undefined);
  } finally {
    await dev.stop();
  }
});

test("harness: three-process cluster, secure, kill and restart a node", { timeout: 180_000 }, async () => {
  const seen: Array<[number, string[]]> = [];
  const c = await startCluster({ nodes: 3, secure: true, extraArgs: (n, endpoints) => (seen.push([n, endpoints]), []) });
  try {
    assert.equal(c.endpoints.length, 3);
    // extraArgs gets every node's URL before any node starts.
    assert.deepEqual(seen, [1, 2, 3].map((n) => [n, c.endpoints]));
    assert.match(c.url(2), /^https:\/\//);
    assert.ok(c.secure?.adminToken.startsWith("wdn1."));
    const r = await c.cli(["admin", "nodes"], { node: 3 });
    assert.equal(r.code, 0, r.stderr);
    await c.kill(2);
    assert.equal(c.pid(2), undefined);
    await c.restart(2);
    assert.ok(c.pid(2) !== undefined);
    assert.deepEqual(seen.at(-1), [2, c.endpoints], "called again at a restart");
  } finally {
    await c.stop();
  }
});
