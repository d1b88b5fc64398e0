// Browser helpers for the dashboard's tests: Debian's Chromium driven by
// playwright-core, axe-core injected into pages, screenshots.
import assert from "node:assert/strict";
import { mkdirSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { chromium, type Browser, type ConsoleMessage, type Page } from "playwright-core";
import { chromiumPath, uiDir } from "./env.js";

export const resultsDir = join(uiDir, "test-results");

export function launch(): Promise<Browser> {
  return chromium.launch({
    executablePath: chromiumPath,
    timeout: 60_000,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
}

/** Watched is a page with what it logged: CSP violations and script errors fail a test. */
export interface Watched {
  page: Page;
  problems: string[];
  /** requests are the API calls the page made: method, URL and content type. */
  requests: { method: string; url: string; contentType: string; authorization: string }[];
  close(): Promise<void>;
}

export async function open(browser: Browser, url: string, opts: { ignoreHTTPSErrors?: boolean } = {}): Promise<Watched> {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 }, ignoreHTTPSErrors: opts.ignoreHTTPSErrors });
  page.setDefaultTimeout(15_000);
  const problems: string[] = [];
  const requests: Watched["requests"] = [];
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m: ConsoleMessage) => {
    if (/Content Security Policy|Refused to/i.test(m.text())) problems.push(`CSP: ${m.text()}`);
  });
  page.on("request", (r) => {
    if (/\/warden\.v1\./.test(r.url()) || r.method() === "OPTIONS") {
      const hd = r.headers();
      requests.push({ method: r.method(), url: r.url(), contentType: hd["content-type"] ?? "", authorization: hd["authorization"] ?? "" });
    }
  });
  await page.goto(url);
  return { page, problems, requests, close: () => page.close() };
}

export function noProblems(w: Watched): void {
  assert.deepEqual(w.problems, [], "the page logged CSP violations or script errors");
}

export async function screenshot(page: Page, name: string): Promise<string> {
  mkdirSync(resultsDir, { recursive: true });
  const path = join(resultsDir, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  return path;
}

const axeSource = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");

/**
 * checkAccessibility runs axe-core in the page (evaluated through the
 * DevTools protocol, so the page's CSP needs no exception) and fails on
 * serious or critical violations.
 */
export async function checkAccessibility(page: Page, what: string): Promise<void> {
  await page.evaluate(axeSource);
  const violations = await page.evaluate(async () => {
    const axe = (window as unknown as { axe: { run(ctx: Document, opts: object): Promise<{ violations: { id: string; impact: string; help: string; nodes: { target: string[] }[] }[] }> } }).axe;
    const r = await axe.run(document, { resultTypes: ["violations"] });
    return r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map((n) => n.target.join(" ")).slice(0, 5) }));
  });
  const bad = violations.filter((v) => v.impact === "serious" || v.impact === "critical");
  for (const v of violations) console.log(`# axe ${what}: ${v.impact} ${v.id}: ${v.help} (${v.nodes.join(", ")})`);
  assert.deepEqual(bad, [], `${what}: serious or critical accessibility violations`);
}

/**
 * tabThrough reloads the page, presses Tab n times and returns
 * what got focus: a description of each element, and whether a visible
 * focus indicator (an outline) was drawn for it.
 */
export async function tabThrough(page: Page, n: number): Promise<{ desc: string; outlined: boolean }[]> {
  // A fresh load: sequential focus navigation starts at the document's top.
  await page.reload();
  await page.waitForSelector("main h1");
  const seen: { desc: string; outlined: boolean }[] = [];
  for (let i = 0; i < n; i++) {
    await page.keyboard.press("Tab");
    seen.push(await page.evaluate(() => {
      const el = document.activeElement as HTMLElement | null;
      if (!el || el === document.body) return { desc: "body", outlined: false };
      const label = el.id ? `#${el.id}` : el.getAttribute("href") ?? el.textContent?.trim().slice(0, 40) ?? "";
      const cs = getComputedStyle(el);
      return { desc: `${el.tagName.toLowerCase()} ${label}`, outlined: cs.outlineStyle !== "none" && parseFloat(cs.outlineWidth) > 0 };
    }));
  }
  return seen;
}

/** eventually polls fn until it returns a truthy value or the time is up. */
export async function eventually<T>(what: string, fn: () => Promise<T | undefined | false | null>, timeoutMs = 15_000, everyMs = 100): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
