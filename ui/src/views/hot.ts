// Hot resources: the locks with the most waiters and the highest
// Acquire rate (AdminService.HotResources).
import type { HotResourcesResponse } from "../../../clients/typescript/src/gen/warden/v1/admin_pb.js";
import { h, loading, replace, table } from "../dom.js";
import { num } from "../format.js";
import type { View, ViewContext } from "../view.js";

export function hotView(ctx: ViewContext): View {
  let hot: HotResourcesResponse | undefined;
  const limit = h("input", { id: "hot-limit", type: "number", min: 1, max: 100, value: "10", onchange: () => ctx.kick() });
  const out = h("div", { id: "hot" }, loading());
  const link = (r: string) => h("a", { href: `#/resource/${encodeURIComponent(r)}`, "data-focus": `r-${r}` }, r);
  const root = h("div", null,
    h("h1", { tabindex: -1 }, "Hot resources"),
    h("p", { class: "help" }, "Waiters are read from each shard's leader; the Acquire rate is what the node this page calls has served over about the last 20 seconds."),
    h("div", { class: "field inline" }, h("label", { for: "hot-limit" }, "Entries per list"), limit),
    out);

  function render() {
    if (!hot) return;
    const hr = hot;
    const key = JSON.stringify([hot.byWaiters.map((r) => [r.resource, r.waiters]), hot.byAcquireRate.map((r) => [r.resource, r.acquiresPerSecond.toFixed(1)])]);
    replace(out, key, () => [
      table("Most waiters", ["Resource", "Waiters"], hr.byWaiters.map((r) => [link(r.resource), num(r.waiters)]), { id: "hot-waiters", empty: "No lock has waiters." }),
      table("Highest Acquire rate", ["Resource", "Acquires per second"], hr.byAcquireRate.map((r) => [link(r.resource), r.acquiresPerSecond.toFixed(1)]), { id: "hot-rate", empty: "No Acquire calls lately." })]);
  }

  return {
    root,
    sources: [{
      name: "HotResources",
      load: async (signal) => {
        const n = Math.min(100, Math.max(1, Number(limit.value) || 10));
        hot = await ctx.api.admin.hotResources({ limit: n }, { signal });
        render();
      },
    }],
  };
}
