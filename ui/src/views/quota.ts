// A quota tree: each level of a key's path (QuotaService.Query, through
// the SDK's query) with its limit, committed, reserved and expired-pending
// drawn as bars and the fairness threshold marked, and the tail of the
// subtree's ledger (ListLedger).
import type { LedgerEvent } from "../../../clients/typescript/src/gen/warden/v1/quota_pb.js";
import type { QuotaLevel } from "../../../clients/typescript/src/web.js";
import { h, replace, table } from "../dom.js";
import { isoTime, num } from "../format.js";
import type { View, ViewContext } from "../view.js";

/** ledgerTail is how many of the subtree's last events are shown. */
const ledgerTail = 20;
/** ledgerPage is how many events one ListLedger call reads, at most. */
const ledgerPage = 1000;

export function quotaView(ctx: ViewContext): View {
  let key = ctx.param;
  let levels: QuotaLevel[] | undefined;
  // The ledger is read forward from the last event seen, keeping the tail.
  let events: LedgerEvent[] = [];
  let afterSeq = 0n;
  let ledgerRead = false;
  let queried = "";
  const input = h("input", { id: "quota-input", type: "search", value: key, required: true, autocomplete: "off", spellcheck: "false", placeholder: "pool/tenant/project" });
  const threshold = h("input", { id: "quota-threshold", type: "number", min: 1, max: 100, value: "80", "aria-describedby": "quota-threshold-help", onchange: () => render() });
  const levelsEl = h("section", { id: "quota-levels", "aria-label": "Levels" });
  const asOfEl = h("p", { id: "quota-asof", class: "help" });
  const ledgerEl = h("section", { id: "quota-ledger", "aria-label": "Ledger" });
  const form = h("form", {
    class: "search", role: "search",
    onsubmit: (e: Event) => {
      e.preventDefault();
      key = input.value.trim();
      levels = undefined;
      events = [];
      afterSeq = 0n;
      ledgerRead = false;
      queried = "";
      ctx.setParam(key);
      replace(levelsEl, "loading", () => key ? h("p", null, `Looking up ${key}…`) : null);
      replace(ledgerEl, "loading");
      ctx.kick();
    },
  },
  h("label", { for: "quota-input" }, "Quota key"), input, h("button", { type: "submit" }, "Query"));

  const root = h("div", null,
    h("h1", { tabindex: -1 }, "Quota"),
    form,
    h("div", { class: "field inline" },
      h("label", { for: "quota-threshold" }, "Fairness threshold (%)"), threshold,
      h("p", { id: "quota-threshold-help", class: "help" }, "The shard config's fairness_threshold_percent (default 80): above this share of a level's limit, each limited child may use only its weighted fair share. Query does not return it, so set it here if yours differs.")),
    levelsEl,
    asOfEl,
    ledgerEl);

  function bar(l: QuotaLevel, pct: number): HTMLElement {
    const committed = Number(l.committed), reserved = Number(l.reserved), expired = Number(l.expiredPending);
    const used = committed + reserved + expired;
    const scale = Math.max(l.hasLimit ? Number(l.limit) : 0, used, 1);
    const seg = (cls: string, v: number) => {
      const s = h("span", { class: `seg ${cls}`, "data-value": String(v) });
      s.style.width = `${(100 * v) / scale}%`;
      return s;
    };
    const label = l.hasLimit
      ? `${num(l.committed)} committed, ${num(l.reserved)} reserved, ${num(l.expiredPending)} expired-pending of a limit of ${num(l.limit)}; fairness threshold at ${pct}%`
      : `${num(l.committed)} committed, ${num(l.reserved)} reserved, ${num(l.expiredPending)} expired-pending; no limit`;
    const b = h("div", { class: "bar", role: "img", "aria-label": label, "data-key": l.key, "data-committed": String(l.committed), "data-reserved": String(l.reserved), "data-expired": String(l.expiredPending) },
      seg("committed", committed), seg("reserved", reserved), seg("expired", expired));
    if (l.hasLimit) {
      const limitMark = h("span", { class: "mark limit", title: `limit ${num(l.limit)}` });
      limitMark.style.left = `${(100 * Number(l.limit)) / scale}%`;
      const fair = h("span", { class: "mark fair", title: `fairness threshold: ${pct}% of the limit` });
      fair.style.left = `${(pct * Number(l.limit)) / scale}%`;
      b.append(limitMark, fair);
    }
    return b;
  }

  function render() {
    if (!levels) return;
    const pct = Math.min(100, Math.max(1, Number(threshold.value) || 80));
    const ls = levels;
    asOfEl.textContent = `Read at ${new Date().toISOString().replace(/\.\d+Z$/, "Z")}.`;
    const rows = () => ls.map((l) => [
      h("code", null, l.key),
      l.hasLimit ? num(l.limit) : "none",
      String(l.weight || 1),
      num(l.committed),
      num(l.reserved),
      num(l.expiredPending),
      l.hasLimit ? num(l.remaining) : "—",
      bar(l, pct),
    ]);
    const k = JSON.stringify([queried, pct, ls.map((l) => [l.key, l.hasLimit, String(l.limit), l.weight, String(l.committed), String(l.reserved), String(l.expiredPending), String(l.remaining)])]);
    replace(levelsEl, k, () => [
      h("h2", null, `Levels of ${queried}`),
      h("p", { class: "legend", "aria-hidden": "true" },
        h("span", { class: "key committed" }), "committed ", h("span", { class: "key reserved" }), "reserved ",
        h("span", { class: "key expired" }), "expired-pending ", h("span", { class: "key limit" }), "limit ", h("span", { class: "key fair" }), "fairness threshold"),
      table("Quota levels, root first", ["Level", "Limit", "Weight", "Committed", "Reserved", "Expired-pending", "Remaining", "Usage"], rows(), { id: "quota-table" })]);
    renderLedger();
  }

  function renderLedger() {
    if (!ledgerRead) return;
    const shown = events.slice().reverse();
    const rows = () => shown.map((e) => [
      String(e.seq), isoTime(e.at), h("code", null, e.key), e.kind, num(e.amount), e.reservationId || "—",
      [e.kind === "SET_LIMIT" ? `limit ${num(e.limit)}` : "", e.returned ? `returned ${num(e.returned)}` : "", e.reportId ? `report ${e.reportId}` : ""].filter(Boolean).join(", ") || "—",
    ]);
    const k = JSON.stringify(shown.map((e) => String(e.seq)));
    replace(ledgerEl, k, () => [h("h2", null, "Ledger tail"),
      table(`The last ${ledgerTail} ledger events of this subtree, newest first`, ["Seq", "At", "Key", "Kind", "Amount", "Reservation", "Details"], rows(), { id: "ledger", empty: "No events." })]);
  }

  return {
    root,
    sources: [
      {
        name: "Query",
        enabled: () => key !== "",
        load: async (signal) => {
          const k = key;
          const q = await ctx.api.sdk.query(k, { signal });
          if (k !== key) return;
          levels = q;
          queried = k;
          render();
        },
      },
      {
        name: "ListLedger",
        enabled: () => key !== "" && levels !== undefined,
        load: async (signal) => {
          const k = key;
          const l = await ctx.api.quota.listLedger({ key: k, afterSeq, limit: ledgerPage }, { signal });
          if (k !== key) return;
          // A long ledger is caught up with a page a refresh; the tail shows as it comes.
          events = events.concat(l.events).slice(-ledgerTail);
          if (l.events.length > 0) afterSeq = l.events[l.events.length - 1].seq;
          ledgerRead = true;
          renderLedger();
        },
      },
    ],
  };
}
