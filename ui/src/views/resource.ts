// One resource: LockService.Describe (the SDK's describe), with the
// lease's expiry counting down every second between refreshes.
import type { LockState } from "../../../clients/typescript/src/web.js";
import { h, replace } from "../dom.js";
import { countdown } from "../format.js";
import type { View, ViewContext } from "../view.js";

export function resourceView(ctx: ViewContext): View {
  let resource = ctx.param;
  let desc: LockState | undefined;
  let described = "";
  const input = h("input", { id: "resource-input", type: "search", value: resource, required: true, autocomplete: "off", spellcheck: "false", placeholder: "orders/42" });
  const out = h("div", { id: "resource-out", "aria-live": "off" });
  const count = h("span", { id: "lock-countdown" });
  const form = h("form", {
    class: "search", role: "search",
    onsubmit: (e: Event) => {
      e.preventDefault();
      resource = input.value.trim();
      desc = undefined;
      described = "";
      ctx.setParam(resource);
      replace(out, "loading", () => resource ? h("p", null, `Looking up ${resource}…`) : null);
      ctx.kick();
    },
  },
  h("label", { for: "resource-input" }, "Resource"), input, h("button", { type: "submit" }, "Describe"));

  const root = h("div", null, h("h1", { tabindex: -1 }, "Resource"), form, out);

  function tick() {
    const at = desc?.expiresAt;
    if (desc?.held && at) count.textContent = countdown(at.getTime());
  }

  function render() {
    if (!desc) return;
    const d = desc;
    const expires = d.expiresAt?.toISOString() ?? "—";
    const key = JSON.stringify([described, d.held, d.holder, String(d.token), expires, d.waiters]);
    tick();
    replace(out, key, () => [
      h("h2", null, described),
      h("dl", { id: "lock", class: "facts", "data-held": String(d.held) },
        h("dt", null, "State"), h("dd", { id: "lock-state" }, d.held ? "held" : "not held"),
        d.held ? [
          h("dt", null, "Holder"), h("dd", { id: "lock-holder" }, d.holder || "(anonymous)"),
          h("dt", null, "Fencing token"), h("dd", { id: "lock-token" }, String(d.token), h("span", { class: "help" }, ` (epoch ${d.token >> 40n}, revision ${d.token & 0xffffffffffn})`)),
          h("dt", null, "Expires at"), h("dd", { id: "lock-expires" }, expires),
          h("dt", null, "Expires in"), h("dd", null, count),
        ] : [],
        h("dt", null, "Waiters"), h("dd", { id: "lock-waiters" }, String(d.waiters)))]);
  }

  return {
    root,
    tick,
    sources: [{
      name: "Describe",
      enabled: () => resource !== "",
      load: async (signal) => {
        const r = resource;
        const d = await ctx.api.sdk.describe(r, { signal });
        if (r !== resource) return; // the user asked for another meanwhile
        desc = d;
        described = r;
        render();
      },
    }],
  };
}
