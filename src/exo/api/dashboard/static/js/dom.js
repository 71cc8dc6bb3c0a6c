// Building DOM from values. Text is always set as text (never parsed as HTML): model
// output and node-supplied strings cannot inject markup through these helpers.

/** h("div", {class: "x", onclick: f}, "text", child, [more]) */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

export function bytes(n) {
  if (!Number.isFinite(n)) return "?";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i === 0 ? 0 : n < 10 ? 2 : 1)} ${units[i]}`;
}

export function duration(s) {
  if (!Number.isFinite(s) || s < 0) return "?";
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

export function shortId(id) {
  return String(id).slice(0, 8);
}

/** A labelled progress bar: the label on its own line above the track (never over it). */
export function bar(fraction, label, cls = "") {
  const pct = Math.max(0, Math.min(1, fraction || 0)) * 100;
  const fill = h("div", { class: "fill" });
  fill.style.width = `${pct.toFixed(1)}%`; // CSSOM: allowed by the page's CSP (no inline styles)
  return h("div", { class: `bar ${cls}`, role: "progressbar", "aria-valuenow": pct.toFixed(0) },
    label ? h("span", { class: "bar-label" }, label) : null, h("div", { class: "track" }, fill));
}
