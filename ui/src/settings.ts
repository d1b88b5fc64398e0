// Where the page sends its calls, how, and with which token.
//
// endpoint: ?endpoint=URL, else the Settings field (sessionStorage), else
// this page's own origin. protocol: ?protocol=grpc-web or the field,
// else Connect. token: the field alone, kept in sessionStorage (never in
// the URL, never in localStorage) under the API origin it was entered
// for: a token is only ever sent to that origin. A link with another
// ?endpoint= gets that origin's token, or none (never the token of the
// origin the page pointed at before).

export type Protocol = "connect" | "grpc-web";

export interface Settings {
  /** baseUrl is the API's origin (no trailing slash). */
  baseUrl: string;
  /** crossOrigin: baseUrl is not this page's origin (CORS applies). */
  crossOrigin: boolean;
  protocol: Protocol;
  /** token is the one entered for baseUrl's origin ("" when none was). */
  token: string;
}

/** tokenKey is the sessionStorage key (after "warden.") of the token entered for an API origin. */
export function tokenKey(origin: string): string {
  return "token:" + origin;
}

const store = {
  get(k: string): string {
    try {
      return sessionStorage.getItem("warden." + k) ?? "";
    } catch {
      return "";
    }
  },
  set(k: string, v: string): void {
    try {
      if (v) sessionStorage.setItem("warden." + k, v);
      else sessionStorage.removeItem("warden." + k);
    } catch {
      // Storage off: the setting lasts until the page reloads.
    }
  },
};

/** normalizeEndpoint checks an http(s) URL and keeps its origin. */
export function normalizeEndpoint(raw: string): string {
  const s = raw.trim();
  if (!s) return "";
  const u = new URL(s);
  if (u.protocol !== "http:" && u.protocol !== "https:") throw new Error(`endpoint ${s}: not an http or https URL`);
  return u.origin;
}

export function loadSettings(): Settings {
  const q = new URLSearchParams(location.search);
  let endpoint = "";
  try {
    endpoint = normalizeEndpoint(q.get("endpoint") ?? store.get("endpoint"));
  } catch {
    endpoint = "";
  }
  const p = q.get("protocol") ?? store.get("protocol");
  const protocol: Protocol = p === "grpc-web" ? "grpc-web" : "connect";
  const baseUrl = endpoint || location.origin;
  // A token kept by an older page under one key for every origin: it
  // cannot say which origin it was entered for, so it is never sent.
  store.set("token", "");
  return { baseUrl, crossOrigin: baseUrl !== location.origin, protocol, token: store.get(tokenKey(baseUrl)) };
}

/**
 * saveSettings keeps the fields and rewrites the URL's query to match,
 * so that a reload or a copied link keeps pointing where the page does.
 * token (undefined: leave as stored) is kept for the endpoint's origin.
 */
export function saveSettings(endpoint: string, protocol: Protocol, token: string | undefined): void {
  const e = normalizeEndpoint(endpoint);
  store.set("endpoint", e);
  store.set("protocol", protocol === "connect" ? "" : protocol);
  // The token is for the origin the fields point at, and that one only;
  // undefined (the field was not edited) keeps that origin's own token,
  // so pointing the page elsewhere never carries a token across.
  if (token !== undefined) store.set(tokenKey(e || location.origin), token.trim());
  const q = new URLSearchParams(location.search);
  if (e) q.set("endpoint", e);
  else q.delete("endpoint");
  if (protocol === "grpc-web") q.set("protocol", protocol);
  else q.delete("protocol");
  const qs = q.toString();
  history.replaceState(null, "", location.pathname + (qs ? "?" + qs : "") + location.hash);
}
