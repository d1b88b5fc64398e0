/**
 * Test helpers: bounded waits and an HTTP/2 (h2c) proxy that can lose
 * answers.
 */
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { sleep } from "./harness.js";

/** Polls cond every intervalMs until it returns a truthy value, at most timeoutMs; returns that value. */
export async function waitFor<T>(what: string, cond: () => T | Promise<T>, timeoutMs = 20_000, intervalMs = 50): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await cond();
      if (v) return v as NonNullable<T>;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    await sleep(intervalMs);
  }
}

/** Resolves when signal aborts (at once if it has), rejects after timeoutMs. */
export function aborted(signal: AbortSignal, timeoutMs: number): Promise<number> {
  return new Promise((res, rej) => {
    if (signal.aborted) {
      res(Date.now());
      return;
    }
    const t = setTimeout(() => rej(new Error(`signal did not abort within ${timeoutMs} ms`)), timeoutMs);
    signal.addEventListener(
      "abort",
      () => {
        clearTimeout(t);
        res(Date.now());
      },
      { once: true },
    );
  });
}

/** One request the proxy saw. */
export interface Exchange {
  path: string;
  /** The request body as sent (Connect unary: the message itself). */
  request: Buffer;
  /** The upstream's answer body (undefined if upstream failed). */
  response?: Buffer;
  /** What the proxy did with the answer. */
  fate: "forwarded" | "reset" | "held";
}

/** What to do with an answer: forward it, break the client's connection after the upstream answered, or hold it (never answer). */
export type Fate = "forward" | "reset" | "held";

/**
 * An h2c proxy in front of one upstream node. For each request it asks
 * `decide(path, n)` (n: how many requests for that path it has seen,
 * from 1) what to do with the answer; the request always reaches the
 * upstream first, so a "reset" or "held" answer is an answer lost after
 * the server acted on it. `delayMs(path)` delays answers.
 */
export class AnswerProxy {
  readonly exchanges: Exchange[] = [];
  decide: (path: string, n: number) => Fate = () => "forward";
  delayMs: (path: string) => number = () => 0;
  private readonly server: http2.Http2Server;
  private readonly upstream: http2.ClientHttp2Session;
  private readonly counts = new Map<string, number>();
  private readonly sessions = new Set<http2.ServerHttp2Session>();

  private constructor(upstreamUrl: string) {
    this.upstream = http2.connect(upstreamUrl);
    this.upstream.on("error", () => undefined);
    this.server = http2.createServer();
    this.server.on("session", (s) => {
      this.sessions.add(s);
      s.on("close", () => this.sessions.delete(s));
      s.on("error", () => undefined);
    });
    this.server.on("stream", (stream, headers) => this.handle(stream, headers));
  }

  /** Starts a proxy to upstreamUrl ("http://127.0.0.1:PORT") on a free loopback port. */
  static async start(upstreamUrl: string): Promise<AnswerProxy> {
    const p = new AnswerProxy(upstreamUrl);
    await new Promise<void>((r) => p.server.listen(0, "127.0.0.1", r));
    return p;
  }

  /** The proxy's base URL. */
  get url(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  /** The exchanges for a path ending with suffix (e.g. "/Acquire"). */
  seen(suffix: string): Exchange[] {
    return this.exchanges.filter((e) => e.path.endsWith(suffix));
  }

  private handle(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): void {
    stream.on("error", () => undefined);
    const path = String(headers[":path"]);
    const n = (this.counts.get(path) ?? 0) + 1;
    this.counts.set(path, n);
    const chunks: Buffer[] = [];
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("end", () => {
      const request = Buffer.concat(chunks);
      const fwd: http2.OutgoingHttpHeaders = {};
      for (const [k, v] of Object.entries(headers)) {
        if (!k.startsWith(":") || k === ":method" || k === ":path") fwd[k] = v;
      }
      const up = this.upstream.request(fwd);
      up.on("error", () => stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR));
      let status: http2.IncomingHttpHeaders = {};
      up.on("response", (h) => (status = h));
      const body: Buffer[] = [];
      up.on("data", (c: Buffer) => body.push(c));
      up.on("end", () => {
        const response = Buffer.concat(body);
        const fate = this.decide(path, n);
        const ex: Exchange = { path, request, response, fate: fate === "forward" ? "forwarded" : fate };
        this.exchanges.push(ex);
        const deliver = () => {
          if (fate === "held") return; // the client waits until it gives up
          if (fate === "reset") {
            stream.session?.destroy();
            return;
          }
          if (stream.destroyed) return;
          const out: http2.OutgoingHttpHeaders = {};
          for (const [k, v] of Object.entries(status)) if (!k.startsWith(":")) out[k] = v;
          out[":status"] = status[":status"];
          stream.respond(out);
          stream.end(response);
        };
        const d = this.delayMs(path);
        if (d > 0) setTimeout(deliver, d);
        else deliver();
      });
      up.end(request);
    });
  }

  /** Closes the proxy and its connections. */
  async close(): Promise<void> {
    for (const s of this.sessions) s.destroy();
    this.upstream.destroy();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}
