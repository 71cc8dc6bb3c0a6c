// Cluster view: every node with its memory, which is master, this node, and the links.

import { bar, bytes, h, replace, shortId, svg } from "./dom.js";

/** A node's hostname, with its short id when another node has the same hostname. */
export function nodeName(snapshot, nodeId) {
  const nodes = snapshot.state.nodes;
  const info = nodes[nodeId];
  if (!info) return shortId(nodeId);
  const twins = Object.entries(nodes).some(([id, other]) => id !== nodeId && other.hostname === info.hostname);
  return twins ? `${info.hostname} (${shortId(nodeId)})` : info.hostname;
}

function memoryBar(total, available, label) {
  const used = Math.max(0, total - available);
  return bar(total ? used / total : 0, `${label} ${bytes(used)} / ${bytes(total)}`, "memory");
}

function nodeCard(snapshot, nodeId, info) {
  const badges = [];
  if (nodeId === snapshot.master_id) badges.push(h("span", { class: "badge master" }, "master"));
  if (nodeId === snapshot.node_id) badges.push(h("span", { class: "badge self" }, "this node"));
  const gpus = info.gpus.map((gpu) =>
    h("div", { class: "gpu" }, h("div", { class: "muted" }, `GPU ${gpu.name}`),
      memoryBar(gpu.memory_total.in_bytes, gpu.memory_available.in_bytes, "GPU")));
  return h("article", { class: "card node", dataset: { nodeId } },
    h("header", {}, h("strong", { class: "hostname" }, nodeName(snapshot, nodeId)), ...badges),
    h("div", { class: "muted" }, `${shortId(nodeId)} · ${info.cpu_count} CPU${info.cpu_count === 1 ? "" : "s"}` +
      (info.gpus.length ? ` · ${info.gpus.length} GPU` : " · no GPU")),
    memoryBar(info.memory_total.in_bytes, info.memory_available.in_bytes, "RAM"),
    gpus,
    info.addresses.length ? h("div", { class: "muted small" }, info.addresses.join("  ")) : null);
}

function diagram(snapshot, ids) {
  const size = 220;
  const r = ids.length > 1 ? 75 : 0;
  const at = (i) => {
    const a = (2 * Math.PI * i) / ids.length - Math.PI / 2;
    return [size / 2 + r * Math.cos(a), size / 2 + r * Math.sin(a)];
  };
  const index = new Map(ids.map((id, i) => [id, i]));
  const lines = [];
  const seen = new Set();
  for (const { source, sink } of snapshot.state.topology.connections) {
    if (!index.has(source) || !index.has(sink)) continue;
    const key = [source, sink].sort().join("|");
    if (seen.has(key)) continue;
    seen.add(key);
    const [x1, y1] = at(index.get(source));
    const [x2, y2] = at(index.get(sink));
    lines.push(svg("line", { x1, y1, x2, y2, class: "link" }));
  }
  const dots = ids.map((id, i) => {
    const [cx, cy] = at(i);
    const cls = `dot${id === snapshot.master_id ? " master" : ""}${id === snapshot.node_id ? " self" : ""}`;
    return svg("g", {}, svg("circle", { cx, cy, r: 16, class: cls }),
      svg("text", { x: cx, y: cy + 32, "text-anchor": "middle" }, nodeName(snapshot, id)));
  });
  return svg("svg", { class: "diagram", viewBox: `0 0 ${size} ${size + 20}`, role: "img" }, lines, dots);
}

function linkList(snapshot) {
  const connections = snapshot.state.topology.connections;
  const has = (a, b) => connections.some((c) => c.source === a && c.sink === b);
  const items = connections
    .filter(({ source, sink }) => !(has(sink, source) && sink < source)) // a pair once
    .map(({ source, sink }) => h("li", {},
      `${nodeName(snapshot, source)} ${has(sink, source) ? "↔" : "→"} ${nodeName(snapshot, sink)}`));
  return items.length ? h("ul", { class: "links" }, items)
    : h("p", { class: "muted" }, "No links: this node is alone.");
}

export function renderCluster(root, snapshot) {
  const nodes = Object.entries(snapshot.state.nodes)
    .sort(([a], [b]) => (a === snapshot.node_id ? -1 : b === snapshot.node_id ? 1 : a.localeCompare(b)));
  const ids = nodes.map(([id]) => id);
  replace(root,
    h("h1", {}, `Cluster · ${nodes.length} node${nodes.length === 1 ? "" : "s"}`),
    h("div", { class: "cluster" },
      h("div", { class: "nodes", id: "nodes" }, nodes.map(([id, info]) => nodeCard(snapshot, id, info))),
      h("aside", { class: "topology" }, diagram(snapshot, ids), h("h2", {}, "Links"), linkList(snapshot))));
}
