// The dashboard: tabs, the live state, the API key prompt, the reconnecting banner.

import { onKeyNeeded, setApiKey } from "./api.js";
import { renderChat, setupChat } from "./chat.js";
import { renderCluster } from "./cluster.js";
import { renderDownloads } from "./downloads.js";
import { followState } from "./live.js";
import { loadModels, renderModels } from "./models.js";

const VIEWS = ["cluster", "models", "downloads", "chat"];
const app = { snapshot: null, status: "connecting" };

function showView() {
  const wanted = location.hash.slice(1);
  const view = VIEWS.includes(wanted) ? wanted : "cluster";
  for (const name of VIEWS) {
    document.getElementById(`view-${name}`).hidden = name !== view;
  }
  for (const link of document.querySelectorAll("#tabs a")) {
    link.classList.toggle("active", link.dataset.view === view);
  }
}

function setStatus(status) {
  const previous = app.status;
  app.status = status;
  const conn = document.getElementById("conn");
  conn.dataset.status = status;
  conn.textContent = { live: "live", reconnecting: "reconnecting", auth: "API key needed" }[status];
  document.getElementById("banner").hidden = status !== "reconnecting";
  if (status === "live" && previous !== "live") loadModels(render);
}

function render() {
  if (!app.snapshot) return;
  const views = [
    () => renderCluster(document.getElementById("view-cluster"), app.snapshot),
    () => renderModels(document.getElementById("view-models"), app.snapshot),
    () => renderDownloads(document.getElementById("view-downloads"), app.snapshot),
    () => renderChat(app.snapshot),
  ];
  for (const view of views) {
    try {
      view();
    } catch (error) {
      console.error("dashboard: a view failed to render", error); // one view's fault stays its own
    }
  }
}

function setupKeyPrompt() {
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  const error = document.getElementById("key-error");
  onKeyNeeded((reason) => {
    error.textContent = reason;
    error.hidden = !reason;
    if (!dialog.open) dialog.showModal();
    input.focus();
  });
  document.getElementById("key-form").addEventListener("submit", () => {
    const key = input.value.trim();
    input.value = "";
    if (key) setApiKey(key);
  });
  dialog.addEventListener("cancel", (event) => event.preventDefault());
}

setupKeyPrompt();
setupChat(document.getElementById("view-chat"));
window.addEventListener("hashchange", showView);
showView();
followState((snapshot) => {
  app.snapshot = snapshot;
  render();
}, setStatus);
