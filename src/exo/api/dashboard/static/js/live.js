// The node's state, live: GET /events (a streamed fetch), reconnecting after any end.

import { AuthError, keyEntered, request, sseEvents } from "./api.js";

const RETRY_MIN_MS = 300;
const RETRY_MAX_MS = 2000;

/**
 * Calls onSnapshot({node_id, master_id, state}) for each state event and
 * onStatus("live" | "reconnecting" | "auth") when the connection changes. Never returns.
 */
export async function followState(onSnapshot, onStatus) {
  let delay = RETRY_MIN_MS;
  for (;;) {
    try {
      const response = await request("/events");
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
      if (!(error instanceof TypeError)) console.warn("dashboard: state stream ended:", error);
    }
    onStatus("reconnecting");
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(RETRY_MAX_MS, delay * 2);
  }
}
