// Operations: splits, replica moves, node removals and rebalances in
// progress, with their progress, then the ended ones the cluster keeps.
import { OperationState, type ListOperationsResponse, type Operation } from "../../../clients/typescript/src/gen/warden/v1/admin_pb.js";
import { h, loading, replace, table } from "../dom.js";
import { hex64, nodeName, num } from "../format.js";
import type { View, ViewContext } from "../view.js";

const states: Record<number, string> = {
  [OperationState.UNSPECIFIED]: "unknown",
  [OperationState.RUNNING]: "running",
  [OperationState.ROLLING_BACK]: "rolling back",
  [OperationState.DONE]: "done",
  [OperationState.ROLLED_BACK]: "rolled back",
  [OperationState.FAILED]: "failed",
};

function inFlight(o: Operation): boolean {
  return o.state === OperationState.RUNNING || o.state === OperationState.ROLLING_BACK;
}

function target(o: Operation): string {
  switch (o.kind) {
    case "split": return `shard ${o.shardId} → new shard ${o.newShardId || "?"} at ${hex64(o.splitAt)}`;
    case "move": return `shard ${o.shardId}: ${nodeName(o.fromNodeId)} → ${nodeName(o.toNodeId)}`;
    case "remove_node": return `${nodeName(o.nodeId)}${o.force ? " (forced)" : ""}`;
    default: return o.shardId ? `shard ${o.shardId}` : "cluster";
  }
}

function progress(o: Operation): HTMLElement {
  const total = o.stepsTotal || o.stepsPlanned;
  const label = total ? `${o.stepsDone} of ${total} steps` : `${o.stepsDone} steps`;
  const wrap = h("div", { class: "progress" });
  if (total) wrap.append(h("progress", { value: o.stepsDone, max: total, "aria-label": `Operation ${o.id} progress` }));
  wrap.append(h("span", null, label));
  return wrap;
}

function details(o: Operation): string {
  const d: string[] = [];
  if (o.step) d.push(`last step: ${o.step}`);
  if (o.catchUpTarget) d.push(`caught up ${num(o.caughtUp)} / ${num(o.catchUpTarget)}`);
  if (o.recordsCopied || o.bytesCopied) d.push(`copied ${num(o.recordsCopied)} records, ${num(o.bytesCopied)} bytes`);
  if (o.parentId) d.push(`part of operation ${o.parentId}`);
  if (o.steps.length) d.push(`${o.steps.filter((s) => s.state === "done").length}/${o.steps.length} steps done`);
  if (o.error) d.push(`error: ${o.error}`);
  return d.join("; ") || "—";
}

export function operationsView(ctx: ViewContext): View {
  let ops: ListOperationsResponse | undefined;
  const out = h("div", { id: "ops" }, loading());
  const root = h("div", null,
    h("h1", { tabindex: -1 }, "Operations"),
    h("p", { class: "help" }, "Answered by the placement leader: operations in progress, then the last 64 that ended, newest first."),
    out);

  function render() {
    if (!ops) return;
    const all = ops.operations;
    const row = (o: Operation) => [String(o.id), o.kind, h("span", { class: `badge op-${states[o.state]?.replace(" ", "-")}` }, states[o.state] ?? String(o.state)), target(o), progress(o), details(o), o.requestId || "—"];
    const headers = ["Operation", "Kind", "State", "Target", "Progress", "Details", "Request id"];
    const key = JSON.stringify(ops.operations.map((o) => [String(o.id), o.state, o.step, o.stepsDone, o.stepsTotal, String(o.caughtUp), String(o.recordsCopied), o.error, o.steps.map((s) => s.state)]));
    replace(out, key, () => [
      table("In flight", headers, all.filter(inFlight).map(row), { id: "ops-running", empty: "No operation is running." }),
      table("Ended", headers, all.filter((o) => !inFlight(o)).map(row), { id: "ops-ended", empty: "None kept." })]);
  }

  return {
    root,
    sources: [{ name: "ListOperations", load: async (signal) => { ops = await ctx.api.admin.listOperations({}, { signal }); render(); } }],
  };
}
