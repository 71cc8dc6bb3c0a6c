// The node's state, live: GET /events (a streamed fetch), reconnecting after any end.
// A tab hidden for a while lets its stream go (browsers allow only six connections per
// host, so tabs left open in the background would starve the others) and takes it up
// again when shown.

import { AuthError, keyEntered, request, sseEvents } from "./api.js";

const RETRY_MIN_MS = 300;
const RETRY_MAX_MS = 2000;
const HIDDEN_RELEASE_MS = 10_000;

let stream = null;
let releaseTimer = null;

function untilVisible() {
  if (document.visibilityState === "visible") return Promise.resolve();
  return new Promise((resolve) => {
    const seen = () => {
      if (document.visibilityState !== "visible") return;
      document.removeEventListener("visibilitychange", seen);
      resolve();
    };
    document.addEventListener("visibilitychange", seen);
  });
}

document.addEventListener("visibilitychange", () => {
  clearTimeout(releaseTimer);
  if (document.visibilityState === "hidden") {
    releaseTimer = setTimeout(() => stream?.abort(), HIDDEN_RELEASE_MS);
  }
});

/**
 * Calls onSnapshot({node_id, master_id, state}) for each state event and
 * onStatus("live" | "reconnecting" | "auth") when the connection changes. Never returns.
 */
export async function followState(onSnapshot, onStatus) {
  let delay = RETRY_MIN_MS;
  for (;;) {
    await untilVisible();
    stream = new AbortController();
    try {
      const response = await request("/events", { signal: stream.signal });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      for await (const { event, data } of sseEvents(response)) {
        if (event !== "state") continue;
        onSnapshot(JSON.parse(data));
        onStatus("live");
        delay = RETRY_MIN_MS;
      }
    } catch (error) {
      if (error instanceof AuthError) {
        onStatus("auth");
        await keyEntered();
        continue;
      }
      if (error.name === "AbortError") continue; // released while hidden
      if (!(error instanceof TypeError)) console.warn("dashboard: state stream ended:", error);
    }
    onStatus("reconnecting");
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(RETRY_MAX_MS, delay * 2);
  }
}
