import { test } from "node:test";
import assert from "node:assert/strict";
import { startCluster, startDev } from "./harness.js";

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
  const c = await startCluster({ nodes: 3, secure: true });
  try {
    assert.equal(c.endpoints.length, 3);
    assert.match(c.url(2), /^https:\/\//);
    assert.ok(c.secure?.adminToken.startsWith("wdn1."));
    const r = await c.cli(["admin", "nodes"], { node: 3 });
    assert.equal(r.code, 0, r.stderr);
    await c.kill(2);
    assert.equal(c.pid(2), undefined);
    await c.restart(2);
    assert.ok(c.pid(2) !== undefined);
  } finally {
    await c.stop();
  }
});
