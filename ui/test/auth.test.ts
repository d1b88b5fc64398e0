// The dashboard's error states against a cluster with TLS and
// authentication on (the harness's secure mode): not authorised without a
// token or with one that lacks the permission, working with the operator's
// token (kept in sessionStorage only), and no quorum once two of the three
// nodes are gone.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { Browser } from "playwright-core";
import { startCluster, type WardenCluster } from "../../clients/typescript/test/harness.js";
import { checkAccessibility, launch, noProblems, open, screenshot } from "./browser.js";
import { haveChromium } from "./env.js";

const skip = !haveChromium && process.env.CI !== "true" ? "/usr/bin/chromium is missing (apt-get install chromium): the dashboard's browser tests did not run" : false;
if (skip) console.log(`# SKIP: ${skip}`);

let cluster: WardenCluster;
let browser: Browser;

before(async () => {
  if (skip) return;
  assert.ok(haveChromium, "CI=true and /usr/bin/chromium is missing");
  cluster = await startCluster({ nodes: 3, secure: true });
  browser = await launch();
}, { timeout: 240_000 });

after(async () => {
  await browser?.close();
  await cluster?.stop();
});

test("not authorised, then authorised with a token kept in sessionStorage; no quorum shown", { skip }, async () => {
  const sec = cluster.secure!;
  const w = await open(browser, `${cluster.url(1)}/ui/#/cluster`, { ignoreHTTPSErrors: true });
  const { page: p } = w;
  // No token: Unauthenticated.
  await p.waitForSelector('.banner[data-kind="unauthorised"]');
  assert.match(await p.textContent(".banner") ?? "", /Not authorised.*bearer token/);
  await screenshot(p, "unauthorised");
  await checkAccessibility(p, "not authorised");
  // A token without the admin permission: PermissionDenied.
  await p.click("#settings summary");
  await p.fill("#set-token", sec.ordersToken);
  await p.click('#settings-form button[type="submit"]');
  await p.waitForFunction(() => /lacks the permission/.test(document.querySelector('.banner[data-kind="unauthorised"]')?.textContent ?? ""));
  // The operator's token: the nodes show, and the banner goes.
  await p.fill("#set-token", sec.adminToken);
  await p.click('#settings-form button[type="submit"]');
  await p.waitForFunction(() => document.querySelectorAll('#nodes [data-up="true"]').length === 3);
  await p.waitForSelector(".banner", { state: "detached" });
  assert.ok(w.requests.some((r) => r.authorization === `Bearer ${sec.adminToken}`), "the token is sent as a bearer token");
  const stored = await p.evaluate(() => ({ session: sessionStorage.getItem(`warden.token:${location.origin}`), local: localStorage.length, url: location.href }));
  assert.equal(stored.session, sec.adminToken, "kept for the page's own API origin");
  assert.equal(stored.local, 0, "nothing in localStorage");
  assert.ok(!stored.url.includes(sec.adminToken), "the token is not in the URL");
  // Lose the quorum: two of three nodes gone.
  await p.goto(`${cluster.url(1)}/ui/#/resource/orders%2F1`);
  await p.waitForSelector('#lock[data-held="false"]');
  await cluster.kill(2);
  await cluster.kill(3);
  await p.waitForSelector('.banner[data-kind="unavailable"], .banner[data-kind="timeout"]', { timeout: 30_000 });
  const banner = await p.textContent(".banner");
  console.log(`# without quorum the resource view says: ${banner}`);
  assert.match(banner ?? "", /quorum/);
  await screenshot(p, "no-quorum");
  noProblems(w);
  await w.close();
});
