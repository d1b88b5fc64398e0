// Cluster: the nodes and the shards, and (behind a toggle and a
// confirmation) leadership transfers and replica moves.
import { PlacementRole, type ListNodesResponse, type ListShardsResponse, type ShardInfo } from "../../../clients/typescript/src/gen/warden/v1/admin_pb.js";
import { actionResult as resultLine, adminEnabled, adminToggle, runAction } from "../admin.js";
import { h, loading, replace, table } from "../dom.js";
import { hashRange, isoTime, nodeName, num } from "../format.js";
import type { View, ViewContext } from "../view.js";

const roles: Record<number, string> = {
  [PlacementRole.UNSPECIFIED]: "unknown",
  [PlacementRole.NONE]: "none",
  [PlacementRole.VOTER]: "voter",
  [PlacementRole.NON_VOTING]: "non-voting",
};

export function clusterView(ctx: ViewContext): View {
  let nodes: ListNodesResponse | undefined;
  let shards: ListShardsResponse | undefined;
  const summary = h("p", { id: "cluster-summary" });
  const down = h("div", { id: "nodes-down" });
  const nodesEl = h("section", { "aria-labelledby": "nodes-h" }, loading());
  const shardsEl = h("section", { "aria-labelledby": "shards-h" }, loading());
  const actionResult = resultLine();

  const root = h("div", null,
    h("h1", { tabindex: -1 }, "Cluster"),
    summary,
    down,
    h("h2", { id: "nodes-h" }, "Nodes"),
    nodesEl,
    h("h2", { id: "shards-h" }, "Shards"),
    adminToggle("Shows leadership transfer and replica move buttons on each shard. Each asks for confirmation first; the server audits every call.", () => renderShards()),
    actionResult,
    shardsEl,
  );

  function renderNodes() {
    if (!nodes) return;
    const leader = nodes.placementLeaderId;
    const downIds = nodes.nodes.filter((n) => !n.up).map((n) => n.id);
    replace(down, downIds.join(","), () => downIds.length
      ? h("p", { class: "banner banner-down", role: "alert" }, h("strong", null, downIds.length === 1 ? "Node down: " : "Nodes down: "), downIds.map((id) => nodeName(id)).join(", "))
      : null);
    const list = nodes.nodes;
    const rows = () => list.map((n) => [
      String(n.id),
      n.zone,
      n.listenAddr,
      h("span", { class: n.up ? "badge up" : "badge down", "data-node": String(n.id), "data-up": String(n.up) }, n.up ? "up" : "down"),
      isoTime(n.lastHeard),
      n.version || "—",
      roles[n.placement] ?? String(n.placement),
      n.id === leader ? "yes" : "",
    ]);
    // lastHeard changes every second: key on what is shown but that.
    const key = JSON.stringify(nodes.nodes.map((n) => [String(n.id), n.zone, n.listenAddr, n.up, n.version, n.placement])) + leader;
    replace(nodesEl, key, () => table("Nodes in the placement map", ["Node", "Zone", "Address", "Liveness", "Last heard", "Version", "Placement role", "Placement leader"], rows(), { id: "nodes" }));
    renderSummary();
  }

  function renderSummary() {
    const parts: string[] = [];
    const count = (n: number, what: string) => `${n} ${what}${n === 1 ? "" : "s"}`;
    if (nodes) parts.push(`${count(nodes.nodes.length, "node")}, ${nodes.nodes.filter((n) => n.up).length} up; placement leader ${nodeName(nodes.placementLeaderId)}`);
    if (shards) parts.push(`${count(shards.shards.length, "shard")}, placement generation ${shards.generation}`);
    summary.textContent = parts.join(" · ");
  }

  function renderShards() {
    if (!shards) return;
    const admin = adminEnabled();
    const list = shards.shards;
    const rows = () => list.map((s) => [
      String(s.id),
      h("code", null, hashRange(s.rangeStart, s.rangeEnd)),
      String(s.epoch),
      s.state,
      nodeName(s.leaderNodeId),
      h("ul", { class: "replicas" }, s.replicas.map((r) =>
        h("li", { class: `replica ${r.state}` }, `${nodeName(r.nodeId)} (${r.zone}): ${r.state}`))),
      num(s.heldLocks),
      num(s.queuedWaiters),
      ...(admin ? [h("div", { class: "actions" },
        h("button", { type: "button", "data-focus": `transfer-${s.id}`, onclick: () => void transferLeader(s) }, `Transfer leader of shard ${s.id}…`),
        h("button", { type: "button", "data-focus": `move-${s.id}`, onclick: () => void moveReplica(s) }, `Move replica of shard ${s.id}…`))] : []),
    ]);
    const headers = ["Shard", "Hash range", "Epoch", "State", "Leader", "Replicas", "Locks", "Waiters", ...(admin ? ["Actions"] : [])];
    const key = JSON.stringify(shards.shards.map((s) => [String(s.id), String(s.rangeStart), String(s.rangeEnd), String(s.epoch), s.state, String(s.leaderNodeId),
      s.replicas.map((r) => [String(r.nodeId), r.zone, r.state]), String(s.heldLocks), String(s.queuedWaiters)])) + admin;
    replace(shardsEl, key, () => table("Data shards", headers, rows(), { id: "shards" }));
    renderSummary();
  }

  function nodeSelect(id: string, label: string, options: bigint[]): [HTMLElement, HTMLSelectElement] {
    const sel = h("select", { id }, options.map((n) => h("option", { value: String(n) }, nodeName(n))));
    return [h("div", { class: "field" }, h("label", { for: id }, label), sel), sel];
  }

  const run = (what: string, call: () => Promise<string>) => runAction(actionResult, what, call, ctx.kick);

  async function transferLeader(s: ShardInfo) {
    const targets = s.replicas.map((r) => r.nodeId).filter((n) => n !== s.leaderNodeId);
    if (targets.length === 0) return;
    const [field, sel] = nodeSelect("transfer-to", "New leader", targets);
    const ok = await ctx.confirm({
      title: `Transfer the leadership of shard ${s.id}`,
      fields: [field],
      text: () => `Shard ${s.id}'s Raft leadership moves from ${nodeName(s.leaderNodeId)} to node ${sel.value}. Locks and leases stay as they are; calls to the shard may be retried for a moment. The server audits this call.`,
      action: "Transfer leadership",
    });
    if (!ok) return;
    const to = BigInt(sel.value);
    await run(`Transfer of shard ${s.id}'s leadership to node ${to}`, async () => {
      const r = await ctx.api.admin.transferLeader({ shardId: s.id, nodeId: to }, { timeoutMs: 30000 });
      return `done, ${nodeName(r.leaderNodeId)} leads`;
    });
  }

  async function moveReplica(s: ShardInfo) {
    const hosts = s.replicas.map((r) => r.nodeId);
    const others = (nodes?.nodes ?? []).map((n) => n.id).filter((id) => !hosts.includes(id));
    if (others.length === 0) {
      actionResult.textContent = `Shard ${s.id} has a replica on every node: there is no node to move one to.`;
      return;
    }
    const [fromField, from] = nodeSelect("move-from", "From node", hosts);
    const [toField, to] = nodeSelect("move-to", "To node", others);
    const ok = await ctx.confirm({
      title: `Move a replica of shard ${s.id}`,
      fields: [fromField, toField],
      text: () => `Shard ${s.id}'s replica on node ${from.value} moves to node ${to.value}: the new replica joins, catches up and is promoted, then the old one is removed and its data deleted. Locks and leases are not touched. The server audits this call.`,
      action: "Move replica",
    });
    if (!ok) return;
    const f = BigInt(from.value), t = BigInt(to.value);
    await run(`Move of shard ${s.id}'s replica from node ${f} to node ${t}`, async () => {
      const r = await ctx.api.admin.moveReplica({ shardId: s.id, fromNodeId: f, toNodeId: t }, { timeoutMs: 120000 });
      return `done (operation ${r.operationId}, new replica ${r.replicaId})`;
    });
  }

  return {
    root,
    sources: [
      { name: "ListNodes", load: async (signal) => { nodes = await ctx.api.admin.listNodes({}, { signal }); renderNodes(); } },
      { name: "ListShards", load: async (signal) => { shards = await ctx.api.admin.listShards({}, { signal }); renderShards(); } },
    ],
  };
}
