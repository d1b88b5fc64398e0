// One resource: LockService.Describe (the SDK's describe), with the
// lease's expiry counting down every second between refreshes, and
// (behind the admin-actions switch and a confirmation) Revoke lease:
// AdminService.RevokeLease of the fencing token shown.
import type { LockState } from "../../../clients/typescript/src/web.js";
import { actionResult, adminEnabled, adminToggle, runAction } from "../admin.js";
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
  const result = actionResult();
  const form = h("form", {
    class: "search", role: "search",
    onsubmit: (e: Event) => {
      e.preventDefault();
      resource = input.value.trim();
      desc = undefined;
      described = "";
      result.textContent = "";
      ctx.setParam(resource);
      replace(out, "loading", () => resource ? h("p", null, `Looking up ${resource}…`) : null);
      ctx.kick();
    },
  },
  h("label", { for: "resource-input" }, "Resource"), input, h("button", { type: "submit" }, "Describe"));

  const root = h("div", null,
    h("h1", { tabindex: -1 }, "Resource"),
    form,
    out,
    adminToggle("Shows Revoke lease while the lock is held: it ends the holder's lease, by the fencing token shown, after a confirmation; the server audits the call.", () => render()),
    result);

  function tick() {
    const at = desc?.expiresAt;
    if (desc?.held && at) count.textContent = countdown(at.getTime());
  }

  function render() {
    if (!desc) return;
    const d = desc;
    const admin = adminEnabled();
    const expires = d.expiresAt?.toISOString() ?? "—";
    const key = JSON.stringify([described, d.held, d.holder, String(d.token), expires, d.waiters, admin]);
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
        h("dt", null, "Waiters"), h("dd", { id: "lock-waiters" }, String(d.waiters))),
      d.held && admin
        ? h("div", { class: "actions" },
          h("button", { type: "button", id: "revoke-lease", "data-focus": "revoke", "aria-describedby": "lock-token", onclick: () => void revoke(described, d) }, "Revoke lease…"))
        : null]);
  }

  /** revoke ends the lease shown (res under d.token) once the user confirms. */
  async function revoke(res: string, d: LockState) {
    const holder = d.holder || "(anonymous)";
    const token = d.token;
    const ok = await ctx.confirm({
      title: `Revoke the lease on ${res}`,
      text: () => `End the lease with token ${token} held by ${holder}? The lock passes to its next waiter; the holder's next renewal fails.`,
      action: "Revoke lease",
    });
    if (!ok) return;
    await runAction(result, `Revoke of the lease on ${res} with token ${token}`, async () => {
      const r = await ctx.api.admin.revokeLease({ resource: res, fencingToken: token }, { timeoutMs: 30000 });
      return r.revoked ? "revoked" : `not held under token ${token} any more: nothing revoked`;
    }, ctx.kick);
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
