// DOM helpers. Everything that comes from a file is data: it is placed with textContent
// (text nodes) or as the value of a data-/title attribute, never parsed as HTML, never
// put in an href/src or an event-handler attribute.

const SAFE_ATTRS = new Set(["class", "title", "type", "placeholder", "value", "id", "role", "tabindex", "aria-label", "for", "width", "height"]);
const SVG_NS = "http://www.w3.org/2000/svg";

function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "on") {
      for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    } else if (k.startsWith("data-") || SAFE_ATTRS.has(k)) {
      el.setAttribute(k, String(v));
    } else {
      throw new Error("attribute not allowed: " + k);
    }
  }
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** h("div", {class: "x"}, "text", child...): an element; strings become text nodes. */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

const SVG_ATTRS = new Set(["display", "x", "y", "width", "height", "rx", "ry", "d", "points", "x1", "y1", "x2", "y2", "viewBox", "transform", "text-anchor", "marker-end", "preserveAspectRatio", "refX", "refY", "markerWidth", "markerHeight", "orient", "cx", "cy", "r", "dy"]);

/** s("rect", {x: 1}): an SVG element (geometry attributes, class and data-* only). */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "on") {
      for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    } else if (k === "class" || k === "id" || k.startsWith("data-") || SVG_ATTRS.has(k)) {
      el.setAttribute(k, String(v));
    } else {
      throw new Error("svg attribute not allowed: " + k);
    }
  }
  append(el, children);
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let x = n;
  while (x >= 1024 && i < u.length - 1) {
    x /= 1024;
    i++;
  }
  return (i === 0 ? String(x) : x.toFixed(x < 10 ? 2 : 1)) + " " + u[i];
}

export function fmtNum(x) {
  if (x === null || x === undefined) return "—";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x) && Math.abs(x) < 1e15) return x.toLocaleString("en-US");
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return x.toExponential(4);
  return x.toPrecision(6);
}

export function shapeText(shape) {
  return "[" + (shape || []).join(", ") + "]";
}

/** a key/value table: rows of [label, value (string or node)] */
export function kvTable(rows) {
  const t = h("table", { class: "kv" });
  for (const [k, v] of rows) {
    if (v === undefined || v === null || v === "") continue;
    t.appendChild(h("tr", null, h("th", null, k), h("td", null, v)));
  }
  return t;
}

export function pre(text, cls) {
  return h("pre", { class: cls || "code" }, text);
}

/** Put where the page is (``#tensor=NAME``, ``#node=NAME``) in the address, so it can be
 * copied; a page where the address cannot change (a sandboxed frame) keeps its own. */
export function setHash(what) {
  const [k, ...v] = what.split("=");
  const want = "#" + k + (v.length ? "=" + encodeURIComponent(v.join("=")) : "") + (window.__tlUnfold ? "&unfold" : "");
  if (location.hash === want) return;
  try {
    window.__tlHashSelf = want;
    history.replaceState(null, "", want);
  } catch (e) {
    void e;
  }
}
