// Downloads view: per node and model, whatever progress the state holds; a running
// download can be cancelled and a completed one deleted (which frees the node's disk).

import { json } from "./api.js";
import { nodeName } from "./cluster.js";
import { bar, bytes, duration, h, replace } from "./dom.js";

// Optional fields a download may carry (bytes per second, seconds left).
const SPEED_FIELDS = ["bytes_per_s", "speed_bytes_per_s", "bytes_per_second", "speed"];
const ETA_FIELDS = ["eta_s", "eta_seconds", "eta"];

// What the last action on a row answered when it failed, by row; and rows whose action
// was sent and not yet seen in the state (their button stays disabled).
const failures = new Map();
const sent = new Map();

function rowKey(nodeId, modelId) {
  return `${nodeId}\n${modelId}`;
}

async function act(key, kind, label, button, message, send) {
  failures.delete(key);
  sent.set(key, { kind, label });
  button.disabled = true;
  button.textContent = label;
  message.textContent = "";
  try {
    await send();
  } catch (error) {
    sent.delete(key);
    failures.set(key, error.message);
    message.textContent = ` ${error.message}`;
    button.disabled = false;
    button.textContent = kind === "DownloadOngoing" ? "Cancel" : "Delete";
  }
}

function actionCell(nodeId, modelId, progress) {
  const key = rowKey(nodeId, modelId);
  const pending = sent.get(key);
  if (pending && pending.kind !== progress.kind) sent.delete(key); // the state moved on
  const waiting = sent.get(key);
  const message = h("span", { class: "error small action-error" },
    failures.has(key) ? ` ${failures.get(key)}` : "");
  let button = null;
  if (progress.kind === "DownloadOngoing") {
    button = h("button", {
      class: "danger cancel",
      disabled: waiting !== undefined,
      onclick: () => act(key, progress.kind, "cancelling…", button, message, () =>
        json("/download/cancel", { method: "POST", body: { model: modelId, node_id: nodeId } })),
    }, waiting ? waiting.label : "Cancel");
  } else if (progress.kind === "DownloadCompleted") {
    button = h("button", {
      class: "danger delete",
      title: "Delete the model's files from this node",
      disabled: waiting !== undefined,
      onclick: () => act(key, progress.kind, "deleting…", button, message, () =>
        json(`/download/${encodeURIComponent(nodeId)}/${encodeURIComponent(modelId)}`,
          { method: "DELETE" })),
    }, waiting ? waiting.label : "Delete");
  }
  return h("td", {}, button, message);
}

function firstNumber(progress, fields) {
  for (const field of fields) {
    if (typeof progress[field] === "number" && Number.isFinite(progress[field])) return progress[field];
  }
  return null;
}

function progressCell(progress) {
  switch (progress.kind) {
    case "DownloadOngoing": {
      const total = progress.total_bytes;
      const done = progress.downloaded_bytes;
      const speed = firstNumber(progress, SPEED_FIELDS);
      const eta = firstNumber(progress, ETA_FIELDS) ??
        (speed && total > done ? (total - done) / speed : null);
      return h("td", {},
        bar(total ? done / total : 0, `${bytes(done)} / ${bytes(total)}`),
        h("span", { class: "muted small" },
          speed !== null ? `${bytes(speed)}/s` : "", eta !== null ? ` · ${duration(eta)} left` : ""));
    }
    case "DownloadCompleted": return h("td", { class: "ok" }, "complete");
    case "DownloadPending": return h("td", { class: "muted" }, "pending");
    case "DownloadFailed": return h("td", { class: "error" }, `failed: ${progress.error_message}`);
    default: return h("td", {}, progress.kind);
  }
}

export function renderDownloads(root, snapshot) {
  const rows = [];
  const present = new Set();
  for (const [nodeId, models] of Object.entries(snapshot.state.downloads)) {
    for (const [modelId, progress] of Object.entries(models)) {
      present.add(rowKey(nodeId, modelId));
      rows.push(h("tr", { dataset: { nodeId, modelId } },
        h("td", {}, nodeName(snapshot, nodeId)), h("td", {}, modelId), progressCell(progress),
        actionCell(nodeId, modelId, progress)));
    }
  }
  for (const map of [failures, sent]) {
    for (const key of map.keys()) if (!present.has(key)) map.delete(key);
  }
  replace(root, h("h1", {}, "Downloads"),
    rows.length ? h("table", { class: "downloads" },
      h("thead", {}, h("tr", {}, h("th", {}, "node"), h("th", {}, "model"), h("th", {}, "progress"),
        h("th", {}, ""))),
      h("tbody", {}, rows))
      : h("p", { class: "muted" }, "No downloads: every model in use is already on its nodes."));
}
