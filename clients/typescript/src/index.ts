/**
 * Warden's TypeScript SDK: exclusive locks with self-renewing leases and
 * fencing tokens, and quota reservations. Create a client with
 * `createClient` from `@warden-dev/warden/node` (Node.js) or
 * `@warden-dev/warden/web` (browsers); both re-export everything here.
 * All times are in milliseconds; tokens and quota amounts are bigint.
 *
 * @module
 */
export {
  WardenClient,
  Reservation,
  bearerInterceptor,
  credentialsFrom,
  type ClientOptions,
  type Credentials,
  type TransportFactory,
  type LockOptions,
  type CallOpts,
  type LockState,
  type ReserveOptions,
  type QuotaLevel,
} from "./client.js";
export { Lease, type LeaseEndReason } from "./lease.js";
export {
  Code,
  WardenError,
  LockHeldError,
  WaitTimeoutError,
  LeaseLostError,
  LeaseUncertainError,
  LeaseReleasedError,
  QuotaExhaustedError,
  InvalidArgumentError,
  UnauthenticatedError,
  PermissionDeniedError,
  ClientClosedError,
} from "./errors.js";
export { isRetryable, isTransportError, leaderAddress, type RetryOptions } from "./retry.js";
