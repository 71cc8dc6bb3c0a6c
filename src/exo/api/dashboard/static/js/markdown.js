// A small markdown renderer for model output that builds DOM nodes, never HTML strings:
// every piece of the input ends up in a text node or a checked attribute, so an answer
// cannot inject markup or script whatever it contains. Partial input (a stream cut
// mid-block, an unclosed code fence) renders sensibly.

import { h } from "./dom.js";

const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^\s{0,3}>\s?/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const SAFE_URL = /^(https?:\/\/|mailto:)/i;

export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  fragment.append(...blocks(String(text).replace(/\r\n?/g, "\n").split("\n")));
  return fragment;
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

function blocks(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) {
      i++;
    } else if ((m = FENCE.exec(line))) {
      const marker = m[1];
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(marker)) body.push(lines[i++]);
      i++; // the closing fence (or the end of an unfinished answer)
      const code = h("code", m[2] ? { class: `language-${m[2]}` } : {}, body.join("\n"));
      out.push(h("pre", m[2] ? { "data-lang": m[2] } : {}, code));
    } else if ((m = HEADING.exec(line))) {
      out.push(h(`h${m[1].length + 2 > 6 ? 6 : m[1].length + 2}`, {}, inline(m[2])));
      i++;
    } else if (RULE.test(line)) {
      out.push(h("hr"));
      i++;
    } else if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && QUOTE.test(lines[i])) body.push(lines[i++].replace(QUOTE, ""));
      out.push(h("blockquote", {}, blocks(body)));
    } else if ((m = ITEM.exec(line))) {
      const ordered = /\d/.test(m[2]);
      const items = [];
      while (i < lines.length) {
        const item = ITEM.exec(lines[i]);
        if (item && /\d/.test(item[2]) === ordered) {
          items.push([item[3]]);
        } else if (items.length && lines[i].trim() && /^\s+/.test(lines[i]) && !FENCE.test(lines[i])) {
          items[items.length - 1].push(lines[i].trim());
        } else {
          break;
        }
        i++;
      }
      const start = ordered ? Number.parseInt(m[2], 10) : null;
      out.push(h(ordered ? "ol" : "ul", start && start !== 1 ? { start } : {},
        items.map((parts) => h("li", {}, inlineLines(parts)))));
    } else {
      const para = [];
      while (i < lines.length && lines[i].trim() && (para.length === 0 || !startsBlock(lines[i]))) {
        para.push(lines[i++]);
      }
      out.push(h("p", {}, inlineLines(para)));
    }
  }
  return out;
}

function inlineLines(lines) {
  const out = [];
  lines.forEach((line, n) => {
    if (n) out.push(h("br"));
    out.push(...inline(line));
  });
  return out;
}

// `code`, **strong**, __strong__, *em*, _em_, [text](url)
const INLINE = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]*?\S)\*\*|__(?=\S)([\s\S]*?\S)__|\*(?=[^\s*])([^*]*?[^\s*])?\*|(?<![\w])_(?=[^\s_])([^_]*?[^\s_])?_(?![\w])|\[([^\]]+)\]\(([^()\s]+)\)/g;

function inline(text) {
  const out = [];
  let last = 0;
  const pattern = new RegExp(INLINE); // its own lastIndex: inline() recurses
  let m;
  while ((m = pattern.exec(text))) {
    if (m.index > last) out.push(text.slice(last, m.index));
    if (m[1]) out.push(h("code", {}, m[2]));
    else if (m[3] !== undefined) out.push(h("strong", {}, inline(m[3])));
    else if (m[4] !== undefined) out.push(h("strong", {}, inline(m[4])));
    else if (m[0].startsWith("*")) out.push(h("em", {}, inline(m[0].slice(1, -1))));
    else if (m[0].startsWith("_")) out.push(h("em", {}, inline(m[0].slice(1, -1))));
    else out.push(link(m[7], m[8]));
    last = pattern.lastIndex;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

function link(label, url) {
  if (!SAFE_URL.test(url)) return `[${label}](${url})`;
  return h("a", { href: url, target: "_blank", rel: "noopener noreferrer nofollow" }, inline(label));
}
