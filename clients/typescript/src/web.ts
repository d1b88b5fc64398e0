/**
 * The browser entry point: {@link createClient} builds a
 * {@link WardenClient} on `@connectrpc/connect-web` (fetch), speaking the
 * Connect protocol or gRPC-Web. The cluster must allow the page's origin
 * (wardend `--cors-allowed-origins`). TLS is the browser's: its trusted
 * roots verify the nodes.
 *
 * @module
 */
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-web";
import { WardenClient, type ClientOptions, type TransportFactory } from "./client.js";

export * from "./index.js";

/** Options of the browser client. */
export interface WebClientOptions extends ClientOptions {
  /** Wire protocol (default "connect"). */
  protocol?: "connect" | "grpc-web";
  /** Use the binary (protobuf) format rather than JSON (default true; JSON is easier to read in devtools). */
  useBinaryFormat?: boolean;
  /** The fetch function (default globalThis.fetch). */
  fetch?: typeof globalThis.fetch;
}

/**
 * Creates a client for browsers (or any runtime with fetch).
 *
 * @example
 * ```ts
 * const client = createClient({ endpoints: ["https://warden.example.com"], token, protocol: "grpc-web" });
 * const lease = await client.lock("reports/daily", { ttl: 15_000 });
 * lease.signal.addEventListener("abort", () => stopWork(lease.err));
 * ```
 * @throws WardenError `InvalidArgument` when there is no endpoint or one is not a base URL
 */
export function createClient(opts: WebClientOptions): WardenClient {
  const factory: TransportFactory = {
    create(baseUrl: string) {
      const options = { baseUrl, useBinaryFormat: opts.useBinaryFormat ?? true, fetch: opts.fetch };
      return opts.protocol === "grpc-web" ? createGrpcWebTransport(options) : createConnectTransport(options);
    },
  };
  return new WardenClient(opts, factory);
}
