// Downloads view: per node and model, whatever progress the state holds.

import { nodeName } from "./cluster.js";
import { bar, bytes, duration, h, replace } from "./dom.js";

// Optional fields a download may carry (bytes per second, seconds left).
const SPEED_FIELDS = ["speed_bytes_per_s", "bytes_per_second", "speed"];
const ETA_FIELDS = ["eta_s", "eta_seconds", "eta"];

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
  for (const [nodeId, models] of Object.entries(snapshot.state.downloads)) {
    for (const [modelId, progress] of Object.entries(models)) {
      rows.push(h("tr", { dataset: { nodeId, modelId } },
        h("td", {}, nodeName(snapshot, nodeId)), h("td", {}, modelId), progressCell(progress)));
    }
  }
  replace(root, h("h1", {}, "Downloads"),
    rows.length ? h("table", { class: "downloads" },
      h("thead", {}, h("tr", {}, h("th", {}, "node"), h("th", {}, "model"), h("th", {}, "progress"))),
      h("tbody", {}, rows))
      : h("p", { class: "muted" }, "No downloads: every model in use is already on its nodes."));
}
