// Warden's dashboard: a hash router over five views, each refreshed by a
// Poller (one request a second at most, none while the tab is hidden).
import { describeError, makeApi, type Api, type ShownError } from "./api.js";
import { h, replace } from "./dom.js";
import { loadSettings, saveSettings, type Protocol } from "./settings.js";
import { Poller, type ConfirmOptions, type View, type ViewContext } from "./view.js";
import { clusterView } from "./views/cluster.js";
import { hotView } from "./views/hot.js";
import { operationsView } from "./views/operations.js";
import { quotaView } from "./views/quota.js";
import { resourceView } from "./views/resource.js";

const views: Record<string, (ctx: ViewContext) => View> = {
  cluster: clusterView,
  hot: hotView,
  resource: resourceView,
  quota: quotaView,
  operations: operationsView,
};

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;

let api: Api;
let current: { name: string; view: View; poller: Poller } | undefined;
/** errors holds the current view's failing requests, by source. */
const errors = new Map<string, ShownError>();

function parseHash(): { name: string; param: string } {
  const m = /^#\/([a-z]+)(?:\/(.*))?$/.exec(location.hash);
  const name = m && views[m[1]] ? m[1] : "cluster";
  let param = "";
  try {
    param = m?.[2] ? decodeURIComponent(m[2]) : "";
  } catch {
    param = "";
  }
  return { name, param };
}

function showStatus() {
  const status = $("status");
  const shown = [...errors.values()];
  const seen = new Set<string>();
  const unique = shown.filter((e) => !seen.has(e.title + e.detail) && seen.add(e.title + e.detail));
  replace(status, JSON.stringify(unique), () => unique.map((e) =>
    h("div", { class: `banner banner-${e.kind}`, "data-kind": e.kind }, h("strong", null, e.title), " ", e.detail)));
  document.body.dataset.state = unique.length ? unique[0].kind : "ok";
}

function report(source: string, err: unknown) {
  if (err === null) errors.delete(source);
  else errors.set(source, describeError(err, api.settings));
  showStatus();
  if (err === null) $("conn").dataset.updated = new Date().toISOString();
}

function confirmDialog(opts: ConfirmOptions): Promise<boolean> {
  const text = h("p", { id: "confirm-text" }, opts.text());
  const update = () => { text.textContent = opts.text(); };
  const ok = h("button", { value: "ok", class: "danger", id: "confirm-ok" }, opts.action);
  const dlg = h("dialog", { id: "confirm", "aria-labelledby": "confirm-title", "aria-describedby": "confirm-text" },
    h("form", { method: "dialog", onchange: update, oninput: update },
      h("h2", { id: "confirm-title" }, opts.title),
      opts.fields ?? [],
      text,
      h("div", { class: "row" }, h("button", { value: "cancel", id: "confirm-cancel" }, "Cancel"), ok)));
  document.body.append(dlg);
  const opener = document.activeElement as HTMLElement | null;
  return new Promise((resolve) => {
    dlg.addEventListener("close", () => {
      dlg.remove();
      opener?.focus();
      resolve(dlg.returnValue === "ok");
    });
    dlg.showModal();
    (dlg.querySelector<HTMLElement>("select, input") ?? dlg.querySelector<HTMLElement>("#confirm-cancel"))?.focus();
  });
}

function mount(focus: boolean) {
  const { name, param } = parseHash();
  current?.poller.stop();
  current?.view.dispose?.();
  errors.clear();
  showStatus();
  let poller: Poller | undefined;
  const ctx: ViewContext = {
    api,
    param,
    setParam(p) {
      history.replaceState(null, "", `#/${name}${p ? "/" + encodeURIComponent(p) : ""}`);
    },
    kick: () => poller?.kick(),
    confirm: confirmDialog,
  };
  const view = views[name](ctx);
  poller = new Poller(view, report);
  current = { name, view, poller };
  $("main").replaceChildren(view.root);
  document.body.dataset.view = name;
  for (const a of document.querySelectorAll<HTMLAnchorElement>("#nav a")) {
    if (a.dataset.view === name) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  document.title = `${$("main").querySelector("h1")?.textContent ?? "Warden"} — Warden dashboard`;
  if (focus) $("main").querySelector<HTMLElement>("h1")?.focus();
  poller.start();
}

function connect() {
  const s = loadSettings();
  current?.poller.stop();
  api?.close();
  api = makeApi(s);
  $("conn").textContent = `API: ${s.baseUrl}${s.crossOrigin ? " (cross-origin)" : ""} · ${s.protocol === "grpc-web" ? "gRPC-Web" : "Connect"}${s.token ? " · token set" : ""}`;
  $<HTMLInputElement>("set-endpoint").value = s.crossOrigin ? s.baseUrl : "";
  $<HTMLSelectElement>("set-protocol").value = s.protocol;
  $<HTMLInputElement>("set-token").value = s.token;
  delete $<HTMLInputElement>("set-token").dataset.edited;
  $("set-token-help").textContent = `Needed when the cluster has authentication on. Kept in this tab's session storage only, and sent to ${s.baseUrl} only: `
    + (s.token ? "the token entered for that origin." : "no token is stored for that origin, so none is sent.");
  $("set-token-help").dataset.origin = s.baseUrl;
  document.body.dataset.protocol = s.protocol;
}

function init() {
  connect();
  // Only a token typed here is saved (for the endpoint's origin): one
  // shown for the current origin is not carried to another endpoint.
  $("set-token").addEventListener("input", () => { $("set-token").dataset.edited = "1"; });
  $("settings-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const endpoint = $<HTMLInputElement>("set-endpoint");
    try {
      const token = $<HTMLInputElement>("set-token");
      saveSettings(endpoint.value, $<HTMLSelectElement>("set-protocol").value as Protocol, token.dataset.edited ? token.value : undefined);
      endpoint.setCustomValidity("");
    } catch (err) {
      endpoint.setCustomValidity(String((err as Error).message));
      endpoint.reportValidity();
      return;
    }
    connect();
    mount(false);
  });
  window.addEventListener("hashchange", () => mount(true));
  mount(false);
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
else init();
