/**
 * The browser entry point: {@link createWebTransport} makes a Connect
 * `Transport` on `@connectrpc/connect-web` (fetch), speaking the Connect
 * protocol or gRPC-Web and carrying the bearer token, for any Warden
 * service (the admin API too); {@link createClient} builds a
 * {@link WardenClient} on such transports. The cluster must allow the
 * page's origin (wardend `--cors-allowed-origins`). TLS is the browser's:
 * its trusted roots verify the nodes.
 *
 * @module
 */
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-web";
import { WardenClient, bearerInterceptor, credentialsFrom, type ClientOptions, type Credentials, type TransportFactory } from "./client.js";

export * from "./index.js";

/** Wire options shared by {@link createWebTransport} and {@link createClient}. */
export interface WebWireOptions {
  /** Wire protocol (default "connect"). */
  protocol?: "connect" | "grpc-web";
  /** Use the binary (protobuf) format rather than JSON (default true; JSON is easier to read in devtools). */
  useBinaryFormat?: boolean;
  /** The fetch function (default globalThis.fetch). */
  fetch?: typeof globalThis.fetch;
}

/** Options of {@link createWebTransport}. */
export interface WebTransportOptions extends WebWireOptions {
  /** The node's base URL ("https://warden.example.com", "http://127.0.0.1:7070"). */
  baseUrl: string;
  /** Bearer token every call carries ("Authorization: Bearer …"); send it over https only. */
  token?: string;
  /** Bearer token source called before every call (rotating tokens); wins over `token`. An error fails the call (`Unauthenticated`). */
  credentials?: Credentials;
  /** More interceptors, run after the bearer token's. */
  interceptors?: Interceptor[];
  /** Timeout of a call whose options set none, ms (default: none). */
  defaultTimeoutMs?: number;
}

/**
 * Creates a Connect transport for browsers (or any runtime with fetch) to
 * one Warden node, with the bearer-token interceptor the SDK's clients use
 * ({@link bearerInterceptor}): make Connect clients of any of Warden's
 * services on it — the admin API, the quota ledger — with
 * `createClient(Service, transport)` of `@connectrpc/connect`. It does
 * not retry or fail over: that is {@link WardenClient}'s work, which
 * {@link createClient} builds on transports made here.
 *
 * @example
 * ```ts
 * import { createClient as createConnectClient } from "@connectrpc/connect";
 * import { AdminService } from "./gen/warden/v1/admin_pb.js"; // protoc-gen-es output of proto/warden/v1
 *
 * const transport = createWebTransport({ baseUrl: "https://warden.example.com", token, protocol: "grpc-web" });
 * const admin = createConnectClient(AdminService, transport);
 * const { nodes } = await admin.listNodes({});
 * ```
 */
export function createWebTransport(opts: WebTransportOptions): Transport {
  const credentials = credentialsFrom(opts);
  const interceptors = [...(credentials === undefined ? [] : [bearerInterceptor(credentials)]), ...(opts.interceptors ?? [])];
  const options = {
    baseUrl: opts.baseUrl,
    useBinaryFormat: opts.useBinaryFormat ?? true,
    fetch: opts.fetch,
    interceptors,
    defaultTimeoutMs: opts.defaultTimeoutMs,
  };
  return opts.protocol === "grpc-web" ? createGrpcWebTransport(options) : createConnectTransport(options);
}

/** Options of the browser client. */
export interface WebClientOptions extends ClientOptions, WebWireOptions {}

/**
 * Creates a client for browsers (or any runtime with fetch), on one
 * {@link createWebTransport} transport per endpoint.
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
    // The client passes its bearer interceptor: token and credentials stay out of the transport's own options.
    create: (baseUrl, interceptors) =>
      createWebTransport({ baseUrl, protocol: opts.protocol, useBinaryFormat: opts.useBinaryFormat, fetch: opts.fetch, interceptors }),
  };
  return new WardenClient(opts, factory);
}
