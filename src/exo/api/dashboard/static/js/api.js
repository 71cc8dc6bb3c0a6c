// Talking to the node: JSON requests and server-sent events read from a streamed fetch
// (EventSource cannot send the API key header). The key, when the node needs one, is
// asked once and kept in sessionStorage (this browser session only).

const KEY_STORAGE = "exo.apiKey";
const keyWaiters = [];
let keyListener = () => {};

export class AuthError extends Error {}

export function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE);
}

export function setApiKey(key) {
  sessionStorage.setItem(KEY_STORAGE, key);
  keyWaiters.splice(0).forEach((resolve) => resolve());
}

/** Called with a reason when the node refuses the request for want of a (right) key. */
export function onKeyNeeded(listener) {
  keyListener = listener;
}

/** Until a (new) key is entered. */
export function keyEntered() {
  return new Promise((resolve) => keyWaiters.push(resolve));
}

export async function request(path, { method = "GET", body, signal } = {}) {
  const headers = {};
  const key = apiKey();
  if (key) headers.authorization = `Bearer ${key}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(path, {
    method, headers, signal, cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) {
    keyListener(key ? "The node refused that key." : "");
    throw new AuthError("the node needs an API key");
  }
  return response;
}

/** The message of an error body in any of the node's formats. */
export function errorMessage(data, status) {
  if (data && typeof data === "object") {
    if (typeof data.detail === "string") return data.detail;
    if (Array.isArray(data.detail)) return data.detail.map((d) => d.msg ?? String(d)).join("; ");
    const error = data.error;
    if (typeof error === "string") return error;
    if (error && typeof error.message === "string") return error.message;
  }
  return `HTTP ${status}`;
}

export async function json(path, options) {
  const response = await request(path, options);
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new Error(errorMessage(data, response.status));
  return data;
}

/** Server-sent events of a response: yields {event, data} until the stream ends. */
export async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const parsed = parseEvent(block);
        if (parsed) yield parsed;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

function parseEvent(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  return data.length ? { event, data: data.join("\n") } : null;
}
