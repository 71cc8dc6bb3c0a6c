// Models view: the catalogue with placement previews and a launch form, then every
// instance with its shards per node and each runner's status, live.

import { json } from "./api.js";
import { nodeName } from "./cluster.js";
import { bar, bytes, h, replace, shortId } from "./dom.js";

let cards = [];
let onLoaded = () => {};
let lastSnapshot = null;
let catalogueRoot = null;
let instancesRoot = null;
// The last runner failure each instance had, kept while it lives: a failed runner is
// replaced within moments, and its error message is what a user needs to see.
const lastFailure = new Map();

export function modelCards() {
  return cards;
}

export async function loadModels(callback) {
  onLoaded = callback;
  for (let attempt = 0; attempt < 30; attempt++) {
    try {
      cards = await json("/models");
      if (catalogueRoot) renderCatalogue();
      onLoaded();
      return;
    } catch (error) {
      console.warn("dashboard: could not load the models, retrying:", error);
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }
}

export function runnerStatusText(status) {
  if (!status) return "waiting";
  switch (status.kind) {
    case "RunnerLoading": return `loading ${status.layers_loaded}/${status.total_layers} layers`;
    case "RunnerWarmingUp": return "warming up";
    case "RunnerRunning": return `running (${status.active_requests})`;
    case "RunnerShuttingDown": return "shutting down";
    case "RunnerFailed": return `failed: ${status.error_message}`;
    default: return status.kind.replace(/^Runner/, "").toLowerCase();
  }
}

function statusCell(status) {
  const text = runnerStatusText(status);
  const kind = status ? status.kind : "RunnerWaiting";
  const cell = h("td", { class: `runner-status ${kind}` }, text);
  if (status && status.kind === "RunnerLoading" && status.total_layers) {
    cell.append(bar(status.layers_loaded / status.total_layers, "", "thin"));
  }
  return cell;
}

function shardText(shard) {
  if (shard.kind === "PipelineShardMetadata") {
    return `layers ${shard.start_layer}-${shard.end_layer - 1} of ${shard.n_layers}`;
  }
  return `tensor slice ${shard.device_rank + 1}/${shard.world_size}`;
}

function shardRows(snapshot, instance, memoryPerNode, statusOf) {
  const assignments = instance.shard_assignments;
  return Object.entries(assignments.node_to_runner).map(([nodeId, runnerId]) => {
    const shard = assignments.runner_to_shard[runnerId];
    return h("tr", { dataset: { runnerId } },
      h("td", {}, nodeName(snapshot, nodeId)),
      h("td", {}, shardText(shard)),
      memoryPerNode ? h("td", {}, bytes(memoryPerNode[nodeId])) : null,
      statusOf ? statusCell(statusOf(runnerId)) : null);
  });
}

function serving(snapshot, instance) {
  return Object.keys(instance.shard_assignments.runner_to_shard).every((rid) => {
    const kind = snapshot.state.runners[rid]?.kind;
    return kind === "RunnerReady" || kind === "RunnerRunning";
  });
}

export function servingModels(snapshot) {
  if (!snapshot) return new Set();
  return new Set(Object.values(snapshot.state.instances)
    .filter((instance) => serving(snapshot, instance))
    .map((instance) => instance.shard_assignments.model_id));
}

function instanceCard(snapshot, instance) {
  const message = h("span", { class: "error" });
  const remove = h("button", {
    class: "danger delete",
    onclick: async () => {
      remove.disabled = true;
      try {
        await json(`/instance/${encodeURIComponent(instance.instance_id)}`, { method: "DELETE" });
        remove.textContent = "deleting…";
      } catch (error) {
        message.textContent = error.message;
        remove.disabled = false;
      }
    },
  }, "Delete");
  const ok = serving(snapshot, instance);
  return h("article", { class: "card instance", dataset: { instanceId: instance.instance_id } },
    h("header", {},
      h("strong", {}, instance.shard_assignments.model_id),
      h("span", { class: `badge ${ok ? "ready" : "pending"}` }, ok ? "serving" : "not ready"),
      h("span", { class: "muted" }, `${instance.sharding} · ${shortId(instance.instance_id)}`),
      remove, message),
    h("table", { class: "shards" },
      h("thead", {}, h("tr", {}, h("th", {}, "node"), h("th", {}, "shard"), h("th", {}, "runner"))),
      h("tbody", {}, shardRows(snapshot, instance, null, (rid) => snapshot.state.runners[rid]))),
    lastFailure.has(instance.instance_id)
      ? h("div", { class: "last-failure error small" }, `last runner failure ${lastFailure.get(instance.instance_id)}`)
      : null);
}

function rememberFailures(snapshot) {
  for (const id of lastFailure.keys()) if (!(id in snapshot.state.instances)) lastFailure.delete(id);
  for (const instance of Object.values(snapshot.state.instances)) {
    for (const rid of Object.keys(instance.shard_assignments.runner_to_shard)) {
      const status = snapshot.state.runners[rid];
      if (status?.kind === "RunnerFailed") {
        lastFailure.set(instance.instance_id, `${new Date().toLocaleTimeString()}: ${status.error_message}`);
      }
    }
  }
}

function renderInstances() {
  const snapshot = lastSnapshot;
  rememberFailures(snapshot);
  const instances = Object.values(snapshot.state.instances);
  replace(instancesRoot,
    h("h2", {}, `Instances · ${instances.length}`),
    instances.length ? instances.map((instance) => instanceCard(snapshot, instance))
      : h("p", { class: "muted", id: "no-instances" }, "No instances. Launch one from the catalogue."));
}

async function showPreviews(card, target, summary) {
  try {
    const { previews } = await json(`/instance/previews?model=${encodeURIComponent(card.model_id)}`);
    const valid = previews.filter((p) => p.valid);
    summary.textContent = valid.length
      ? `fits on ${[...new Set(valid.map((p) => p.node_count))].join(", ")} node(s)`
      : "does not fit";
    summary.className = `fit ${valid.length ? "yes" : "no"}`;
    replace(target, previews.map((p) => h("div", { class: "preview" },
      h("div", {}, h("strong", {}, `${p.sharding}, ${p.node_count} node(s)`),
        p.valid ? null : h("span", { class: "muted" }, ` — ${p.reason}`)),
      p.valid && p.instance && lastSnapshot ? h("table", { class: "shards" },
        h("thead", {}, h("tr", {}, h("th", {}, "node"), h("th", {}, "shard"), h("th", {}, "memory"))),
        h("tbody", {}, shardRows(lastSnapshot, p.instance, p.memory_per_node, null))) : null)));
  } catch (error) {
    replace(target, h("p", { class: "error" }, error.message));
  }
}

// Models whose card says they take images (a vision tower, or an mmproj file beside a GGUF).
function visionBadge(card) {
  if (!card.vision) return null;
  return h("span", { class: "badge vision", title: "takes images in chat requests" }, "vision");
}

// Previews are fetched at once for the first models, on opening for the rest.
const EAGER_PREVIEWS = 12;

function catalogueEntry(card, index) {
  const fit = h("span", { class: "fit" }, "");
  const previews = h("div", { class: "previews" });
  const sharding = h("select", { class: "sharding" },
    h("option", { value: "pipeline" }, "pipeline"), h("option", { value: "tensor" }, "tensor"));
  const nodes = h("input", { class: "min-nodes", type: "number", min: 1, value: 1 });
  const message = h("span", { class: "launch-message" });
  const launch = h("button", {
    class: "launch",
    onclick: async () => {
      launch.disabled = true;
      message.className = "launch-message";
      message.textContent = "placing…";
      try {
        const placed = await json("/place_instance", {
          method: "POST",
          body: { model: card.model_id, sharding: sharding.value, min_nodes: Number(nodes.value) || 1 },
        });
        message.textContent = `placed on ${placed.node_count} node(s)`;
      } catch (error) {
        message.className = "launch-message error";
        message.textContent = error.message;
      } finally {
        launch.disabled = false;
      }
    },
  }, "Launch");
  const details = h("details", { class: "card model", dataset: { modelId: card.model_id } },
    h("summary", {}, h("strong", {}, card.model_id), " ",
      h("span", { class: "muted" }, `${bytes(card.storage_size.in_bytes)} · ${card.n_layers} layers · ` +
        `${card.context_length} context · ${card.architecture}`), " ", visionBadge(card), fit),
    h("div", { class: "launch-form" },
      h("label", {}, "sharding ", sharding), h("label", {}, "nodes ", nodes), launch, message),
    previews);
  details.addEventListener("toggle", () => { if (details.open) showPreviews(card, previews, fit); });
  if (index < EAGER_PREVIEWS) showPreviews(card, previews, fit);
  return details;
}

function renderCatalogue() {
  replace(catalogueRoot, h("h2", {}, `Catalogue · ${cards.length}`), cards.map(catalogueEntry));
}

export function renderModels(root, snapshot) {
  lastSnapshot = snapshot;
  if (!instancesRoot) {
    instancesRoot = h("div", { id: "instances" });
    catalogueRoot = h("div", { id: "catalogue" });
    replace(root, h("h1", {}, "Models"), instancesRoot, catalogueRoot);
    renderCatalogue();
  }
  renderInstances();
}
