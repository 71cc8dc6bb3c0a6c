// Chat view: conversations kept in localStorage, a model picker (running models first),
// answers streamed from /v1/chat/completions and rendered as markdown, a stop button
// (POST /v1/cancel/{command_id}), per-answer stats, and the error an answer ended with.
// Images pasted or dropped on the composer go with the message (attach.js) to vision models.

import { errorMessage, request, sseEvents } from "./api.js";
import { createAttachments, messageContent, sentImages } from "./attach.js";
import { h, replace } from "./dom.js";
import { renderMarkdown } from "./markdown.js";
import { modelCards, servingModels } from "./models.js";

const STORAGE = "exo.chat";
const RENDER_EVERY_MS = 50;
const ui = {};
let store = load();
let running = null;
let pickerKey = "";
const attachments = createAttachments({
  model: () => ui.picker?.value,
  takesImages: () => modelCards().some((card) => card.model_id === ui.picker?.value && card.vision),
});

function load() {
  try {
    const saved = JSON.parse(localStorage.getItem(STORAGE));
    if (saved && Array.isArray(saved.conversations)) return saved;
  } catch {
    // A store this page cannot read is replaced.
  }
  return { current: null, conversations: [] };
}

function save() {
  try {
    localStorage.setItem(STORAGE, JSON.stringify(store));
  } catch {
    // Over the storage quota (images are large): keep the conversations, not their images.
    const slim = store.conversations.map((c) => ({
      ...c, messages: c.messages.map(({ images, ...m }) => (images ? { ...m, imagesDropped: images.length } : m)),
    }));
    localStorage.setItem(STORAGE, JSON.stringify({ ...store, conversations: slim }));
  }
}

function current() {
  let conv = store.conversations.find((c) => c.id === store.current);
  if (!conv) {
    conv = { id: crypto.randomUUID(), title: "New chat", model: null, messages: [] };
    store.conversations.unshift(conv);
    store.current = conv.id;
    save();
  }
  return conv;
}

export function setupChat(root) {
  ui.list = h("ul", { class: "conversation-list" });
  ui.picker = h("select", { id: "model-picker", onchange: () => { current().model = ui.picker.value; save(); attachments.modelChanged(); hint(); } });
  ui.maxTokens = h("input", { id: "max-tokens", type: "number", min: 1, value: 512 });
  ui.temperature = h("input", { id: "temperature", type: "number", min: 0, max: 2, step: 0.1, placeholder: "default" });
  ui.messages = h("div", { id: "messages", class: "messages" });
  ui.prompt = h("textarea", { id: "prompt", rows: 3, placeholder: "Ask something… (Enter sends, Shift+Enter: new line)" });
  ui.send = h("button", { id: "send", type: "submit" }, "Send");
  ui.stop = h("button", { id: "stop", type: "button", class: "danger", hidden: true, onclick: stop }, "Stop");
  ui.prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      ui.form.requestSubmit();
    }
  });
  ui.form = h("form", { id: "chat-form", class: "composer" }, ui.prompt, ui.send, ui.stop);
  attachments.listen(ui.prompt, ui.form);
  ui.form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = ui.prompt.value.trim();
    if ((text || attachments.count()) && !running) {
      ui.prompt.value = "";
      send(text, attachments.take());
    }
  });
  replace(root, h("div", { class: "chat" },
    h("aside", { class: "conversations" },
      h("button", { id: "new-chat", onclick: newChat }, "New chat"), ui.list),
    h("div", { class: "chat-main" },
      h("div", { class: "chat-controls" }, h("label", {}, "model ", ui.picker),
        h("label", {}, "max tokens ", ui.maxTokens), h("label", {}, "temperature ", ui.temperature)),
      ui.messages, attachments.notice, attachments.tray, ui.form)));
  renderConversations();
  renderMessages();
}

function newChat() {
  if (running || !current().messages.length) return; // the current one is still empty
  store.current = null;
  current();
  renderConversations();
  renderMessages();
}

function renderConversations() {
  replace(ui.list, store.conversations.map((conv) => h("li", {
    class: conv.id === store.current ? "active" : "",
    dataset: { conversationId: conv.id },
  },
  h("button", { class: "link", onclick: () => { if (!running) { store.current = conv.id; save(); renderConversations(); renderMessages(); } } }, conv.title),
  h("button", {
    class: "link remove", title: "delete this conversation",
    onclick: () => {
      if (running) return;
      store.conversations = store.conversations.filter((c) => c.id !== conv.id);
      if (store.current === conv.id) store.current = null;
      save();
      current();
      renderConversations();
      renderMessages();
    },
  }, "×"))));
}

export function renderChat(snapshot) {
  const live = servingModels(snapshot);
  const ids = modelCards().map((card) => card.model_id);
  const liveIds = ids.filter((id) => live.has(id));
  const others = ids.filter((id) => !live.has(id));
  const key = JSON.stringify([liveIds, others]);
  if (key === pickerKey) return;
  pickerKey = key;
  const conv = current();
  const chosen = conv.model && ids.includes(conv.model) ? conv.model : liveIds[0] ?? others[0];
  replace(ui.picker,
    liveIds.length ? h("optgroup", { label: "running" }, liveIds.map((id) => h("option", { value: id }, id))) : null,
    others.length ? h("optgroup", { label: "not running (starts on first use)" }, others.map((id) => h("option", { value: id }, id))) : null);
  if (chosen) ui.picker.value = chosen;
  hint();
}

/** The prompt's placeholder: a vision model also takes pasted or dropped images. */
function hint() {
  ui.prompt.placeholder = attachments.takesImages()
    ? "Ask something, or paste or drop an image… (Enter sends, Shift+Enter: new line)"
    : "Ask something… (Enter sends, Shift+Enter: new line)";
}

function statsText(stats) {
  if (!stats) return "";
  const parts = [];
  if (stats.ttft_ms !== null) parts.push(`TTFT ${Math.round(stats.ttft_ms)} ms`);
  if (stats.tokens_per_s !== null) parts.push(`${stats.tokens_per_s.toFixed(1)} tok/s`);
  parts.push(`${stats.tokens} token${stats.tokens === 1 ? "" : "s"}`);
  return parts.join(" · ");
}

function messageView(message) {
  const body = message.role === "assistant"
    ? h("div", { class: "markdown" }, renderMarkdown(message.content))
    : h("div", { class: "plain" }, message.content, sentImages(message.images),
      message.imagesDropped ? h("span", { class: "muted" }, ` (${message.imagesDropped} image(s) not kept)`) : null);
  return h("div", { class: `msg ${message.role}` },
    h("div", { class: "who" }, message.role === "assistant" ? (message.model ?? "assistant") : "you"),
    body,
    message.error ? h("div", { class: "error chat-error" }, message.error) : null,
    message.stats || message.stopped ? h("div", { class: "stats" }, statsText(message.stats),
      message.stopped ? h("span", { class: "stopped" }, " · stopped") : null) : null);
}

function renderMessages() {
  const conv = current();
  replace(ui.messages, conv.messages.length ? conv.messages.map(messageView)
    : h("p", { class: "muted" }, "Pick a model and ask something."));
  ui.messages.scrollTop = ui.messages.scrollHeight;
}

function renderLast() {
  const conv = current();
  const last = ui.messages.lastElementChild;
  if (last) last.replaceWith(messageView(conv.messages[conv.messages.length - 1]));
  ui.messages.scrollTop = ui.messages.scrollHeight;
}

async function stop() {
  if (!running || running.stopped) return;
  running.stopped = true;
  ui.stop.disabled = true;
  if (running.commandId) {
    await request(`/v1/cancel/${encodeURIComponent(running.commandId)}`, { method: "POST" }).catch(() => {});
  }
  running?.controller.abort();
}

function chunkError(chunk) {
  const error = chunk.error;
  return typeof error === "string" ? error : error?.message ?? JSON.stringify(error);
}

async function send(text, images) {
  const conv = current();
  const model = ui.picker.value;
  conv.model = model;
  if (!conv.messages.length) conv.title = text.slice(0, 40) || "image";
  const history = conv.messages.filter((m) => m.content || m.images?.length)
    .map(({ role, content, images: sent }) => ({ role, content: messageContent(content, sent) }));
  history.push({ role: "user", content: messageContent(text, images) });
  conv.messages.push({ role: "user", content: text, ...(images.length ? { images } : {}) });
  const answer = { role: "assistant", content: "", model };
  conv.messages.push(answer);
  save();
  renderConversations();
  renderMessages();
  running = { controller: new AbortController(), commandId: null, stopped: false };
  ui.send.disabled = true;
  ui.stop.hidden = false;
  ui.stop.disabled = false;
  const sent = performance.now();
  let first = null;
  let last = null;
  let deltas = 0;
  let usage = null;
  let pending = null;
  const redraw = () => { pending ??= setTimeout(() => { pending = null; renderLast(); }, RENDER_EVERY_MS); };
  try {
    const maxTokens = Number(ui.maxTokens.value);
    const temperature = ui.temperature.value === "" ? null : Number(ui.temperature.value);
    const response = await request("/v1/chat/completions", {
      method: "POST", signal: running.controller.signal,
      body: {
        model, messages: history, stream: true, stream_options: { include_usage: true },
        ...(maxTokens > 0 ? { max_tokens: maxTokens } : {}),
        ...(temperature !== null && temperature >= 0 ? { temperature } : {}),
      },
    });
    if (!response.ok) {
      answer.error = errorMessage(await response.json().catch(() => null), response.status);
    } else {
      running.commandId = response.headers.get("x-exo-command-id");
      for await (const { data } of sseEvents(response)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) {
          answer.error = chunkError(chunk);
          break;
        }
        if (!running.commandId && typeof chunk.id === "string") running.commandId = chunk.id;
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices ?? []) {
          const delta = choice.delta?.content;
          if (delta) {
            const now = performance.now();
            first ??= now;
            last = now;
            deltas++;
            answer.content += delta;
            redraw();
          }
        }
      }
    }
  } catch (error) {
    if (error.name !== "AbortError") answer.error = `${error.message || error}`;
  } finally {
    clearTimeout(pending);
    const tokens = usage?.completion_tokens ?? deltas;
    // An answer that failed before its first token has no stats to show ("0 tokens").
    answer.stats = answer.error && first === null && !tokens ? null : {
      ttft_ms: first === null ? null : first - sent,
      tokens,
      tokens_per_s: first !== null && last > first && tokens > 1 ? (tokens - 1) / ((last - first) / 1000) : null,
    };
    if (running.stopped) answer.stopped = true;
    running = null;
    ui.send.disabled = false;
    ui.stop.hidden = true;
    save();
    renderMessages();
  }
}
