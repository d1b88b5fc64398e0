/**
 * The Node.js entry point: {@link createClient} builds a
 * {@link WardenClient} on `@connectrpc/connect-node` (HTTP/2: cleartext
 * h2c for `http://` endpoints, TLS with ALPN for `https://` ones).
 *
 * @module
 */
import { Http2SessionManager, createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import * as http from "node:http";
import * as https from "node:https";
import { WardenClient, type ClientOptions, type TransportFactory } from "./client.js";

export * from "./index.js";

/** Options of the Node.js client. */
export interface NodeClientOptions extends ClientOptions {
  /** CA certificate(s), PEM, that verify the nodes' TLS certificates (default: Node's root CAs). */
  ca?: string | Buffer | Array<string | Buffer>;
  /** Client certificate, PEM, for mutual TLS (its principal authenticates the calls). */
  cert?: string | Buffer;
  /** Client certificate's private key, PEM. */
  key?: string | Buffer;
  /** Wire protocol (default "connect"; "grpc" needs HTTP/2). */
  protocol?: "connect" | "grpc";
  /** HTTP version (default "2"; "1.1" only with the connect protocol). */
  httpVersion?: "2" | "1.1";
}

/**
 * Creates a client for Node.js.
 *
 * @example
 * ```ts
 * const client = createClient({ endpoints: ["http://127.0.0.1:7070"] });
 * await client.withLock("orders/42", { ttl: 10_000 }, async (lease) => {
 *   await db.write(order, { fencingToken: lease.token, signal: lease.signal });
 * });
 * await client.close();
 * ```
 * @throws WardenError `InvalidArgument` when there is no endpoint or one is not a base URL
 */
export function createClient(opts: NodeClientOptions): WardenClient {
  const tls = { ca: opts.ca, cert: opts.cert, key: opts.key };
  const closers: Array<() => void> = [];
  const factory: TransportFactory = {
    create(baseUrl, interceptors) {
      if ((opts.httpVersion ?? "2") === "1.1") {
        const agent = baseUrl.startsWith("https:") ? new https.Agent({ keepAlive: true, ...tls }) : new http.Agent({ keepAlive: true });
        closers.push(() => agent.destroy());
        return createConnectTransport({ baseUrl, httpVersion: "1.1", nodeOptions: { agent }, interceptors });
      }
      const sessionManager = new Http2SessionManager(baseUrl, { pingIntervalMs: 10_000, pingTimeoutMs: 5_000 }, tls);
      closers.push(() => sessionManager.abort());
      const options = { baseUrl, httpVersion: "2" as const, sessionManager, interceptors };
      return opts.protocol === "grpc" ? createGrpcTransport(options) : createConnectTransport(options);
    },
    close() {
      for (const c of closers.splice(0)) c();
    },
  };
  return new WardenClient(opts, factory);
}
