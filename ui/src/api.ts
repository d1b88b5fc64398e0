// The API clients, and the errors people see.
//
// Every call goes through the TypeScript SDK's browser transport
// (clients/typescript/src/web.ts): lock and quota reads through its client
// (createClient, which retries), admin calls and the ledger through
// Connect clients of the SDK's generated service descriptors on a
// createWebTransport transport. Both carry the SDK's bearer-token
// interceptor and the page's protocol.
import { Code, ConnectError, createClient as createConnectClient, type Client } from "@connectrpc/connect";
import { AdminService } from "../../clients/typescript/src/gen/warden/v1/admin_pb.js";
import { QuotaService } from "../../clients/typescript/src/gen/warden/v1/quota_pb.js";
import { createClient, createWebTransport, WardenError, type WardenClient } from "../../clients/typescript/src/web.js";
import type { Settings } from "./settings.js";

export interface Api {
  /** sdk is the SDK's client: describe (locks) and query (quota levels). */
  sdk: WardenClient;
  admin: Client<typeof AdminService>;
  /** quota serves ListLedger, which the SDK does not wrap. */
  quota: Client<typeof QuotaService>;
  settings: Settings;
  close(): void;
}

/** Reads time out after this long: a paused node must not stall a view. */
export const callTimeoutMs = 4000;

export function makeApi(settings: Settings): Api {
  const token = settings.token || undefined;
  const transport = createWebTransport({ baseUrl: settings.baseUrl, protocol: settings.protocol, token, defaultTimeoutMs: callTimeoutMs });
  // One endpoint, and a call budget of callTimeoutMs: the SDK's retries
  // (an Unavailable answer, a lost one) end in time for the next refresh.
  const sdk = createClient({
    endpoints: [settings.baseUrl],
    token,
    protocol: settings.protocol,
    retry: { attemptTimeoutMs: callTimeoutMs, callTimeoutMs },
  });
  return {
    sdk,
    admin: createConnectClient(AdminService, transport),
    quota: createConnectClient(QuotaService, transport),
    settings,
    close: () => void sdk.close(),
  };
}

/** causes walks an error's chain of causes, the error first. */
function* causes(err: unknown): Generator<unknown> {
  const seen = new Set<unknown>();
  for (let c = err; c !== undefined && c !== null && !seen.has(c); c = (c as { cause?: unknown }).cause) {
    seen.add(c);
    yield c;
  }
}

export type ErrorKind = "unavailable" | "unauthorised" | "network" | "timeout" | "error";

export interface ShownError {
  kind: ErrorKind;
  title: string;
  detail: string;
}

/** describeError maps a failed call to what the page says about it. */
export function describeError(err: unknown, settings: Settings): ShownError {
  // The SDK's errors are WardenErrors with the answer's code; a call that
  // never got an answer has a fetch TypeError somewhere in its causes.
  let e = err instanceof WardenError ? new ConnectError(err.message, err.code, undefined, undefined, err) : ConnectError.from(err);
  // A call the SDK retried until its time ran out says why it retried.
  const retried = [...causes(err)].find((c): c is ConnectError => c instanceof ConnectError && c.code === Code.Unavailable);
  if (e.code === Code.DeadlineExceeded && retried) e = retried;
  const where = settings.baseUrl;
  if ([...causes(err)].some((c) => c instanceof TypeError || (c instanceof Error && /failed to fetch|networkerror|load failed/i.test(c.message)))) {
    return {
      kind: "network",
      title: "Network error",
      detail: settings.crossOrigin
        ? `Could not reach ${where}: the node is down or unreachable, or it does not allow this page's origin (${location.origin}) to call it — add the origin to its --cors-allowed-origins.`
        : `Could not reach ${where}: the node is down or unreachable.`,
    };
  }
  switch (e.code) {
    case Code.Unavailable:
      return { kind: "unavailable", title: "Unavailable (no quorum?)", detail: `${where} cannot answer now: a shard or the placement group may have lost its quorum, or the node is starting. ${e.rawMessage}` };
    case Code.DeadlineExceeded:
      return { kind: "timeout", title: "No answer in time", detail: `${where} did not answer within ${callTimeoutMs / 1000} s: the node may be paused or overloaded, or the cluster has no quorum.` };
    case Code.Unauthenticated:
      return { kind: "unauthorised", title: "Not authorised", detail: `${where} needs a valid bearer token: enter one in Settings. (${e.rawMessage})` };
    case Code.PermissionDenied:
      return { kind: "unauthorised", title: "Not authorised", detail: `The token lacks the permission this view needs. (${e.rawMessage})` };
    default:
      return { kind: "error", title: `Error: ${Code[e.code] ?? e.code}`, detail: e.rawMessage };
  }
}
