// Formatting of the API's values for people.
import type { Timestamp } from "@bufbuild/protobuf/wkt";

/** hex64 writes a 64-bit hash as 16 hex digits. */
export function hex64(v: bigint): string {
  return "0x" + v.toString(16).padStart(16, "0");
}

/** hashRange writes a shard's [start, end) range; end 0 is 2^64. */
export function hashRange(start: bigint, end: bigint): string {
  return `[${hex64(start)}, ${end === 0n ? "2^64" : hex64(end)})`;
}

export function tsMillis(t: Timestamp | undefined): number | undefined {
  if (!t) return undefined;
  return Number(t.seconds) * 1000 + Math.floor(t.nanos / 1e6);
}

/** countdown writes the time left until ms (epoch milliseconds). */
export function countdown(ms: number, now = Date.now()): string {
  const left = Math.max(0, Math.ceil((ms - now) / 1000));
  if (left === 0) return "expired";
  const h = Math.floor(left / 3600);
  const m = Math.floor((left % 3600) / 60);
  const s = left % 60;
  return h > 0 ? `${h}h ${m}m ${s}s` : m > 0 ? `${m}m ${s}s` : `${s}s`;
}

export function isoTime(t: Timestamp | undefined): string {
  const ms = tsMillis(t);
  return ms === undefined ? "—" : new Date(ms).toISOString().replace(".000Z", "Z");
}

export function num(v: bigint | number): string {
  return typeof v === "bigint" ? v.toLocaleString("en-US") : v.toLocaleString("en-US", { maximumFractionDigits: 2 });
}

export function nodeName(id: bigint): string {
  return id === 0n ? "unknown" : `node ${id}`;
}
