// The bearer token is kept per API origin: a link that points the page at
// another origin (?endpoint=) must not send it the token entered for the
// page's own node. A small recorder stands in for that other origin: it
// answers CORS (so the page does call it) and notes every Authorization
// header it is sent, and every preflight that asks to send one.
import assert from "node:assert/strict";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import type { Browser } from "playwright-core";
import { startDev, type WardenCluster } from "../../clients/typescript/test/harness.js";
import { eventually, launch, noProblems, open } from "./browser.js";
import { haveChromium } from "./env.js";

const skip = !haveChromium && process.env.CI !== "true" ? "/usr/bin/chromium is missing (apt-get install chromium): the dashboard's browser tests did not run" : false;
if (skip) console.log(`# SKIP: ${skip}`);

let dev: WardenCluster;
let browser: Browser;
let recorder: http.Server;
/** What the recorder saw: method, path, Authorization header, preflight's Access-Control-Request-Headers. */
const seen: { method: string; path: string; authorization: string; requestHeaders: string }[] = [];

before(async () => {
  if (skip) return;
  assert.ok(haveChromium, "CI=true and /usr/bin/chromium is missing");
  recorder = http.createServer((req, res) => {
    seen.push({
      method: req.method ?? "",
      path: req.url ?? "",
      authorization: req.headers.authorization ?? "",
      requestHeaders: String(req.headers["access-control-request-headers"] ?? ""),
    });
    const cors = {
      "access-control-allow-origin": req.headers.origin ?? "*",
      "access-control-allow-methods": "POST, GET, OPTIONS",
      // Whatever the page asks to send, Authorization included: only the page decides.
      "access-control-allow-headers": String(req.headers["access-control-request-headers"] ?? "*"),
      "access-control-expose-headers": "*",
      "access-control-max-age": "0",
    };
    req.resume();
    req.on("end", () => {
      if (req.method === "OPTIONS") {
        res.writeHead(204, cors).end();
        return;
      }
      res.writeHead(503, { ...cors, "content-type": "application/json" }).end(JSON.stringify({ code: "unavailable", message: "recorder" }));
    });
  });
  await new Promise<void>((r) => recorder.listen(0, "127.0.0.1", r));
  dev = await startDev();
  browser = await launch();
}, { timeout: 120_000 });

after(async () => {
  await browser?.close();
  await dev?.stop();
  await new Promise((r) => (recorder ? recorder.close(r) : r(undefined)));
});

test("a token entered for the page's own node is never sent to another ?endpoint= origin", { skip, timeout: 60_000 }, async () => {
  const token = "secret-token-for-own-origin";
  const own = dev.url();
  const other = `http://127.0.0.1:${(recorder.address() as AddressInfo).port}`;
  const w = await open(browser, `${own}/ui/#/cluster`);
  const { page: p } = w;
  // The operator enters a token for the page's own node.
  await p.click("#settings summary");
  await p.fill("#set-token", token);
  await p.click('#settings-form button[type="submit"]');
  await eventually("a call to the own origin with the token", async () =>
    w.requests.some((r) => r.url.startsWith(own) && r.method === "POST" && r.authorization === `Bearer ${token}`));
  // A link pointing the page at another origin.
  await p.goto(`${own}/ui/?endpoint=${encodeURIComponent(other)}#/cluster`);
  await eventually("two calls at the other origin", async () => seen.filter((s) => s.method === "POST").length >= 2);
  assert.deepEqual(seen.filter((s) => s.authorization !== ""), [], "the other origin was sent an Authorization header");
  assert.deepEqual(seen.filter((s) => /authorization/i.test(s.requestHeaders)), [], "a preflight asked to send Authorization");
  assert.equal(await p.inputValue("#set-token"), "", "the token field is empty for that origin");
  const help = (await p.textContent("#set-token-help")) ?? "";
  assert.ok(help.includes(other), `the help names the origin the token applies to: ${help}`);
  assert.match(help, /no token/);
  assert.match((await p.textContent("#conn")) ?? "", new RegExp(`API: ${other.replace(/[.]/g, "\\.")}`));
  assert.doesNotMatch((await p.textContent("#conn")) ?? "", /token set/);
  // Back at the own origin, its token is still there and sent.
  const before = w.requests.length;
  await p.goto(`${own}/ui/#/cluster`);
  await eventually("the own origin's token again", async () =>
    w.requests.slice(before).some((r) => r.url.startsWith(own) && r.method === "POST" && r.authorization === `Bearer ${token}`));
  assert.equal(await p.inputValue("#set-token"), token);
  assert.deepEqual(seen.filter((s) => s.authorization !== ""), []);
  noProblems(w);
  await w.close();
});
