// Graphs: a layered DAG laid out by dagre, grouped and collapsible by module hierarchy
// (nn_module_stack for .pt2, name scopes for ONNX, the module tree for TorchScript).
// Only what is visible is laid out and drawn: a collapsed group is one box, so a graph of
// 10,000 nodes starts as a handful of boxes.
import dagre from "@dagrejs/dagre";
import { h, s, clear, kvTable, pre, setHash } from "./dom.js";

const OPEN_ALL_BELOW = 300; // graphs this small start fully expanded
const CHUNK_ABOVE = 400; // a graph without module groups is chunked into groups of CHUNK
const CHUNK = 100;
const MAX_VISIBLE = 2500; // refuse to lay out more boxes at once than this
const EDGE_LABELS_BELOW = 1500;
const RESULTS = 100;
const RANKER_SIMPLEX_BELOW = 120;

function shortTarget(n) {
  const t = n.target || "";
  if (n.op === "call_function" || n.op === "call_method") {
    const parts = t.split(".");
    if (parts[0] === "aten" && parts.length >= 2) return parts[1];
    if (parts[0] === "onnx") return parts.slice(1).join(".");
    return parts.length > 2 ? parts.slice(-2).join(".") : t;
  }
  if (n.op === "module") return t.split(".").pop();
  if (n.op === "call_module") return t;
  return n.op;
}

function prepare(g) {
  const n = g.nodes.length;
  const hasGroups = g.nodes.some((x) => x.group && x.group.length);
  const groupOf = new Array(n);
  // no module groups: runs of CHUNK nodes, in runs of 10 * CHUNK ... while that is too many
  const sizes = [CHUNK];
  while (n > sizes[sizes.length - 1] * 10) sizes.push(sizes[sizes.length - 1] * 10);
  sizes.reverse();
  for (let i = 0; i < n; i++) {
    if (!hasGroups && n > CHUNK_ABOVE) {
      const path = [];
      for (const size of sizes) {
        const lo = Math.floor(i / size) * size;
        const name = "nodes " + lo + "–" + Math.min(n - 1, lo + size - 1);
        if (path[path.length - 1] !== name) path.push(name);
      }
      groupOf[i] = path;
    } else groupOf[i] = g.nodes[i].group || [];
  }
  const groups = new Map();
  for (let i = 0; i < n; i++) {
    const grp = groupOf[i];
    for (let k = 0; k < grp.length; k++) {
      let e = groups.get(grp[k]);
      if (!e) {
        e = { path: grp[k], parent: k ? grp[k - 1] : null, count: 0 };
        groups.set(grp[k], e);
      }
      e.count++;
    }
  }
  const byName = new Map();
  g.nodes.forEach((x, i) => byName.set(x.name, i));
  const users = Array.from({ length: n }, () => []);
  const inputs = Array.from({ length: n }, () => []);
  for (const [a, b] of g.edges) {
    users[a].push(b);
    inputs[b].push(a);
  }
  const labelOf = new Map(); // "a\u0000b" -> the edge's label
  for (const [a, b, label] of g.edges) labelOf.set(a + "\u0000" + b, label);
  const p = { g, n, groupOf, groups, byName, users, inputs, labelOf };
  setFold(p, true);
  return p;
}

/** Parameters, buffers, initializers and constants (nodes with ``fold``) that feed other
 * nodes are drawn inside the boxes of those nodes (as Netron does), not as boxes of their
 * own, while ``on``: ``folded[i]``, and ``foldedInto[j]`` (the folded inputs of node j). A
 * node folds when every input it has is folded too (a module reference read from another). */
function setFold(p, on) {
  p.folded = new Array(p.n).fill(false);
  p.foldedInto = Array.from({ length: p.n }, () => []);
  if (on) {
    for (let i = 0; i < p.n; i++) {
      const x = p.g.nodes[i];
      if (x.fold && p.users[i].length && p.inputs[i].every((j) => p.folded[j])) p.folded[i] = true;
    }
    for (let j = 0; j < p.n; j++) if (!p.folded[j]) for (const i of p.inputs[j]) if (p.folded[i] && !p.foldedInto[j].includes(i)) p.foldedInto[j].push(i);
  }
  // a group counts the boxes it holds
  for (const e of p.groups.values()) e.count = 0;
  for (let i = 0; i < p.n; i++) if (!p.folded[i]) for (const path of p.groupOf[i]) p.groups.get(path).count++;
}

/** the text of a folded input inside its user's box: its original name and its value */
function foldText(p, i) {
  const x = p.g.nodes[i];
  const t = (x.ref || x.name) + (x.val ? "  " + x.val : "");
  return t.length > 60 ? t.slice(0, 59) + "…" : t;
}

/** the first node that a folded node is drawn in (following folded users) */
function hostOf(p, i) {
  let k = i;
  for (let guard = 0; p.folded[k] && guard < p.n; guard++) k = p.users[k][0];
  return k;
}

function groupLabel(path) {
  const seps = ["/", "."];
  let cut = -1;
  for (const c of seps) cut = Math.max(cut, path.lastIndexOf(c));
  return cut >= 0 && cut < path.length - 1 ? path.slice(cut + 1) : path;
}

function visibleItems(p, expanded) {
  const rep = new Array(p.n);
  const items = new Map();
  for (let i = 0; i < p.n; i++) {
    if (p.folded[i]) {
      rep[i] = null;
      continue;
    }
    const grp = p.groupOf[i];
    let key = null;
    let parent = null;
    for (const path of grp) {
      if (!expanded.has(path)) {
        key = "g:" + path;
        break;
      }
      parent = path;
    }
    if (key === null) {
      key = "n:" + i;
      items.set(key, { key, kind: "node", index: i, parent });
    } else if (!items.has(key)) {
      items.set(key, { key, kind: "group", path: key.slice(2), parent });
    }
    rep[i] = key;
  }
  const edges = new Map();
  for (const [a, b, label] of p.g.edges) {
    const ra = rep[a];
    const rb = rep[b];
    if (ra === rb || ra === null || rb === null) continue;
    const k = ra + "\u0000" + rb;
    const e = edges.get(k);
    if (e) e.count++;
    else edges.set(k, { from: ra, to: rb, label, count: 1 });
  }
  const clusters = new Set();
  for (const it of items.values()) {
    let c = it.parent;
    while (c !== null && c !== undefined && !clusters.has(c)) {
      clusters.add(c);
      c = p.groups.get(c).parent;
    }
  }
  return { items, edges, clusters, rep };
}

function nodeLabel(p, it) {
  if (it.kind === "node") {
    const n = p.g.nodes[it.index];
    return [shortTarget(n), n.name];
  }
  const grp = p.groups.get(it.path);
  return [groupLabel(it.path), grp.count + " nodes"];
}

const FOLD_LINE = 13;

function boxSize(p, it) {
  const [a, b] = nodeLabel(p, it);
  let w = Math.max(a.length, b.length);
  let hgt = 36;
  if (it.kind === "node") {
    for (const j of p.foldedInto[it.index]) w = Math.max(w, 0.85 * foldText(p, j).length);
    hgt += FOLD_LINE * p.foldedInto[it.index].length + (p.foldedInto[it.index].length ? 2 : 0);
  }
  return { width: Math.min(420, Math.max(60, 7 * w + 18)), height: hgt };
}

const PAD = { top: 24, side: 10, bottom: 10 };

/** Lay out each expanded group on its own (dagre, one small graph per group, innermost
 * first) and place it as one box in its parent's layout: dagre's compound mode grows far
 * faster than the sum of these small layouts. Returns absolute centres and sizes of the
 * boxes (``boxes``: item key -> {x, y, width, height}) and frames (``frames``: group path ->
 * {x, y, width, height, depth}), and ``edgePoints(from, to)``: dagre's route when both ends
 * share a layout, else the two box ends to join with a curve. */
function nestedLayout(p, vis) {
  const ROOT = "\u0000root";
  const kids = new Map(); // container -> child keys ("n:i", "g:path", "c:path")
  const parentOf = new Map(); // child key -> container
  const add = (container, key) => {
    const c = container === null || container === undefined ? ROOT : container;
    if (!kids.has(c)) kids.set(c, []);
    kids.get(c).push(key);
    parentOf.set(key, c);
  };
  for (const it of vis.items.values()) add(it.parent, it.key);
  for (const c of vis.clusters) add(p.groups.get(c).parent, "c:" + c);
  const depthOf = (c) => {
    let d = 0;
    for (let q = c; q !== ROOT; q = parentOf.get("c:" + q)) d++;
    return d;
  };
  // the chain of containers above a key, innermost first
  const chain = (key) => {
    const out = [];
    for (let c = parentOf.get(key); c !== undefined; c = c === ROOT ? undefined : parentOf.get("c:" + c)) out.push(c);
    return out;
  };
  // each edge goes into the layout of the lowest container holding both ends
  const local = new Map(); // container -> Map "a\0b" -> [childA, childB]
  const chains = new Map();
  const getChain = (k) => {
    let c = chains.get(k);
    if (!c) chains.set(k, (c = chain(k)));
    return c;
  };
  for (const e of vis.edges.values()) {
    const ca = getChain(e.from);
    const cb = getChain(e.to);
    const inB = new Set(cb);
    let lca = ROOT;
    for (const c of ca) {
      if (inB.has(c)) {
        lca = c;
        break;
      }
    }
    const childUnder = (key, ch) => {
      let k = key;
      for (const c of ch) {
        if (c === lca) return k;
        k = "c:" + c;
      }
      return k;
    };
    const a = childUnder(e.from, ca);
    const b = childUnder(e.to, cb);
    if (a === b) continue;
    if (!local.has(lca)) local.set(lca, new Map());
    local.get(lca).set(a + "\u0000" + b, [a, b]);
  }
  const sizes = new Map(); // child key -> {width, height}
  for (const it of vis.items.values()) sizes.set(it.key, boxSize(p, it));
  const rel = new Map(); // container -> {width, height, pos: Map key -> {x, y}, edges: Map}
  let dagreMs = 0;
  const order = [...kids.keys()].sort((x, y) => (y === ROOT ? -1 : x === ROOT ? 1 : depthOf(y) - depthOf(x)));
  for (const c of order) {
    const G = new dagre.graphlib.Graph();
    const n = kids.get(c).length;
    G.setGraph({ rankdir: "TB", nodesep: 18, ranksep: 28, edgesep: 8, marginx: 0, marginy: 0, ranker: n > RANKER_SIMPLEX_BELOW ? "tight-tree" : "network-simplex" });
    G.setDefaultEdgeLabel(() => ({}));
    for (const k of kids.get(c)) G.setNode(k, { ...sizes.get(k) });
    for (const [a, b] of (local.get(c) || new Map()).values()) G.setEdge(a, b);
    const t = performance.now();
    dagre.layout(G);
    dagreMs += performance.now() - t;
    const g = G.graph();
    const pos = new Map();
    for (const k of kids.get(c)) pos.set(k, G.node(k));
    const edges = new Map();
    for (const [a, b] of (local.get(c) || new Map()).values()) edges.set(a + "\u0000" + b, G.edge(a, b).points);
    rel.set(c, { width: g.width || 0, height: g.height || 0, pos, edges });
    if (c !== ROOT) sizes.set("c:" + c, { width: (g.width || 0) + 2 * PAD.side, height: (g.height || 0) + PAD.top + PAD.bottom });
  }
  // absolute positions, outermost first
  const boxes = new Map();
  const frames = new Map();
  const origin = new Map([[ROOT, { x: 16, y: 16 }]]);
  for (const c of [...order].reverse()) {
    const o = origin.get(c);
    const r = rel.get(c);
    for (const [k, nd] of r.pos) {
      const abs = { x: o.x + nd.x, y: o.y + nd.y, width: nd.width, height: nd.height };
      if (k.startsWith("c:")) {
        frames.set(k.slice(2), { ...abs, depth: depthOf(k.slice(2)) });
        origin.set(k.slice(2), { x: abs.x - abs.width / 2 + PAD.side, y: abs.y - abs.height / 2 + PAD.top });
      } else boxes.set(k, abs);
    }
  }
  const root = rel.get(ROOT) || { width: 0, height: 0 };
  function edgePoints(from, to) {
    const ca = getChain(from);
    const cb = getChain(to);
    if (ca[0] === cb[0]) {
      const pts = rel.get(ca[0]).edges.get(from + "\u0000" + to);
      if (pts) {
        const o = origin.get(ca[0]);
        return pts.map((q) => ({ x: o.x + q.x, y: o.y + q.y }));
      }
    }
    const a = boxes.get(from);
    const b = boxes.get(to);
    if (!a || !b) return null;
    return [
      { x: a.x, y: a.y + a.height / 2 },
      { x: b.x, y: b.y - b.height / 2 },
    ];
  }
  return { width: root.width + 32, height: root.height + 32, boxes, frames, edgePoints, dagreMs };
}

export function graphView(app, ai) {
  const art = app.model.artifacts[ai];
  const graphs = art.graphs;
  const prepared = new Map();
  const expandedBy = new Map();
  let gi = 0;
  let p = null;
  let expanded = null;
  let selected = null; // node index
  let layout = null;
  let foldOn = !app.unfold;
  const view = { x: 0, y: 0, k: 1 };

  const svg = s("svg", { class: "graph-svg" });
  const defs = s(
    "defs",
    null,
    s("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "6", markerHeight: "6", orient: "auto" }, s("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrowhead" })),
  );
  const port = s("g", { class: "viewport" });
  svg.append(defs, port);
  const canvas = h("div", { class: "graph-canvas" }, svg);
  const panel = h("div", { class: "panel" }, h("p", { class: "hint" }, "Click a node for its schema, arguments and stack trace; click a group to expand it."));
  const select = h("select", { class: "graph-select", "aria-label": "graph" });
  graphs.forEach((g, i) => {
    const label = g.title + " (" + g.nodes.length + " nodes)" + (g.parent !== null && g.parent !== undefined ? " — subgraph" : "");
    select.appendChild(h("option", { value: String(i) }, label));
  });
  const search = h("input", { type: "search", class: "search", placeholder: "search nodes (name, op)", "aria-label": "search nodes" });
  const results = h("div", { class: "results" });
  const status = h("span", { class: "count" });

  function applyView() {
    port.setAttribute("transform", "translate(" + view.x + "," + view.y + ") scale(" + view.k + ")");
  }

  function fit() {
    if (!layout) return;
    const W = canvas.clientWidth || 900;
    const H = canvas.clientHeight || 600;
    const gw = layout.width || 1;
    const gh = layout.height || 1;
    // the whole graph when it fits at a readable scale, else its top at that scale
    view.k = Math.min(1.5, Math.max(0.4, Math.min(W / gw, H / gh) * 0.95));
    view.x = gw * view.k <= W ? (W - gw * view.k) / 2 : 10;
    view.y = gh * view.k <= H ? (H - gh * view.k) / 2 : 5;
    applyView();
  }

  function centerOn(key) {
    const node = layout && layout.nodes.get(key);
    if (!node) return;
    const W = canvas.clientWidth || 900;
    const H = canvas.clientHeight || 600;
    view.k = Math.max(view.k, 0.8);
    view.x = W / 2 - node.x * view.k;
    view.y = H / 2 - node.y * view.k;
    // a frame taller than the screen: show its top
    if (node.height * view.k > H) view.y = 20 - (node.y - node.height / 2) * view.k;
    applyView();
  }

  function setGraph(i) {
    gi = i;
    select.value = String(i);
    if (!prepared.has(i)) {
      const pp = prepare(graphs[i]);
      if (!foldOn) setFold(pp, false);
      prepared.set(i, pp);
      const ex = new Set();
      if (pp.n <= OPEN_ALL_BELOW) for (const k of pp.groups.keys()) ex.add(k);
      expandedBy.set(i, ex);
    }
    p = prepared.get(i);
    expanded = expandedBy.get(i);
    selected = null;
    render(true);
  }

  function render(refit) {
    const t0 = performance.now();
    const vis = visibleItems(p, expanded);
    clear(port);
    if (vis.items.size > MAX_VISIBLE) {
      status.textContent = vis.items.size + " boxes: too many to lay out at once; collapse groups";
      layout = null;
      return;
    }
    const L = nestedLayout(p, vis);
    const t2 = performance.now();
    const t1 = t2 - L.dagreMs;
    layout = { width: L.width, height: L.height, nodes: new Map(L.boxes) };
    for (const [c, f] of L.frames) layout.nodes.set("c:" + c, f);

    // clusters (expanded groups), outermost first
    const clusterEls = [];
    for (const c of vis.clusters) {
      const nd = L.frames.get(c);
      if (!nd) continue;
      const head = s(
        "g",
        { class: "cluster", "data-kind": "group", "data-name": c, "data-state": "expanded" },
        s("rect", { x: nd.x - nd.width / 2, y: nd.y - nd.height / 2, width: nd.width, height: nd.height, rx: 6 }),
        s("text", { x: nd.x - nd.width / 2 + 8, y: nd.y - nd.height / 2 + 15, class: "clabel" }, "▾ " + groupLabel(c)),
      );
      head.addEventListener("click", (ev) => {
        ev.stopPropagation();
        expanded.delete(c);
        for (const k of [...expanded]) if (k.startsWith(c + ".") || k.startsWith(c + "/")) expanded.delete(k);
        render(false);
      });
      head.appendChild(s("title", null, c + " (" + p.groups.get(c).count + " nodes): click to collapse"));
      clusterEls.push([nd.depth, head]);
    }
    clusterEls.sort((a, b) => a[0] - b[0]);
    for (const [, el] of clusterEls) port.appendChild(el);

    const edgeLayer = s("g", { class: "edges" });
    port.appendChild(edgeLayer);
    const showLabels = vis.edges.size <= EDGE_LABELS_BELOW;
    const labels = []; // [text element, candidate anchor points]
    for (const e of vis.edges.values()) {
      const pts = L.edgePoints(e.from, e.to);
      if (!pts) continue;
      let d;
      if (pts.length === 2) {
        // across groups: a curve from the bottom of one box to the top of the other
        const [a, b] = pts;
        const dy = Math.max(20, Math.abs(b.y - a.y) / 2);
        d = "M" + a.x.toFixed(1) + " " + a.y.toFixed(1) + " C" + a.x.toFixed(1) + " " + (a.y + dy).toFixed(1) + " " + b.x.toFixed(1) + " " + (b.y - dy).toFixed(1) + " " + b.x.toFixed(1) + " " + b.y.toFixed(1);
      } else d = pts.map((pt, i) => (i ? "L" : "M") + pt.x.toFixed(1) + " " + pt.y.toFixed(1)).join(" ");
      edgeLayer.appendChild(s("path", { d, class: "edge", "marker-end": "url(#arrow)" }));
      if (showLabels && e.label) {
        const t = s("text", { x: 0, y: 0, class: "elabel", "data-kind": "elabel" }, e.label + (e.count > 1 ? " ×" + e.count : ""));
        edgeLayer.appendChild(t);
        labels.push([t, anchors(pts)]);
      }
    }
    placeLabels(labels, L.boxes, L.frames);

    const nodeLayer = s("g", { class: "nodes" });
    for (const it of vis.items.values()) {
      const nd = L.boxes.get(it.key);
      const [a, b] = nodeLabel(p, it);
      const x = nd.x - nd.width / 2;
      const y = nd.y - nd.height / 2;
      let el;
      if (it.kind === "node") {
        const n = p.g.nodes[it.index];
        const folded = p.foldedInto[it.index].map((j, k) => {
          const line = s("text", { x: x + 6, y: y + 46 + FOLD_LINE * k, class: "fold" + (selected === j ? " selected" : ""), "data-kind": "folded", "data-name": p.g.nodes[j].name }, foldText(p, j));
          line.addEventListener("click", (ev) => {
            ev.stopPropagation();
            selectNode(j, false);
          });
          return line;
        });
        el = s(
          "g",
          { class: "gnode op-" + n.op.replace(/[^a-z_]/g, "") + (selected === it.index ? " selected" : ""), "data-kind": "node", "data-name": n.name },
          s("rect", { x, y, width: nd.width, height: nd.height, rx: 4 }),
          s("text", { x: nd.x, y: y + 15, "text-anchor": "middle", class: "l1" }, a),
          s("text", { x: nd.x, y: y + 29, "text-anchor": "middle", class: "l2" }, b),
          folded.length ? s("path", { d: "M" + (x + 1) + " " + (y + 35) + " h" + (nd.width - 2), class: "foldsep" }) : null,
          folded,
          s("title", null, n.name + ": " + (n.target || n.op) + (n.val ? " -> " + n.val : "")),
        );
        el.addEventListener("click", (ev) => {
          ev.stopPropagation();
          selectNode(it.index, false);
        });
      } else {
        el = s(
          "g",
          { class: "ggroup", "data-kind": "group", "data-name": it.path, "data-state": "collapsed" },
          s("rect", { x, y, width: nd.width, height: nd.height, rx: 8 }),
          s("text", { x: nd.x, y: y + 15, "text-anchor": "middle", class: "l1" }, "▸ " + a),
          s("text", { x: nd.x, y: y + 29, "text-anchor": "middle", class: "l2" }, b),
          s("title", null, it.path + ": click to expand"),
        );
        el.addEventListener("click", (ev) => {
          ev.stopPropagation();
          expanded.add(it.path);
          render(false);
          centerOn("c:" + it.path); // the group just opened, where it now is
        });
      }
      nodeLayer.appendChild(el);
    }
    port.appendChild(nodeLayer);
    let shown = 0;
    for (const it of vis.items.values()) if (it.kind === "node") shown++;
    status.textContent = p.n + " nodes, " + shown + " shown, " + (vis.items.size - shown) + " collapsed groups";
    if (refit) fit();
    else applyView();
    // for benchmarks and tests: when the latest layout was drawn (ms since navigation start)
    // and where its time went
    window.__tlGraphRendered = performance.now();
    window.__tlGraphTimes = { visible: t1 - t0, layout: t2 - t1, draw: window.__tlGraphRendered - t2, boxes: vis.items.size };
    void t1;
  }

  function reveal(i) {
    for (const path of p.groupOf[i]) expanded.add(path);
  }

  function selectNode(i, center) {
    selected = i;
    const host = hostOf(p, i); // a folded node is shown in its first user's box
    reveal(host);
    render(false);
    if (center) centerOn("n:" + host);
    showNode(i);
    setHash("node=" + p.g.nodes[i].name);
  }

  function nodeLink(i) {
    const n = p.g.nodes[i];
    return h("button", { class: "link", "data-kind": "nodelink", "data-name": n.name, on: { click: () => selectNode(i, true) } }, n.name);
  }

  function showNode(i) {
    const n = p.g.nodes[i];
    clear(panel);
    panel.appendChild(h("h3", { class: "title" }, n.name));
    panel.appendChild(
      kvTable([
        ["op", n.op],
        [n.fold ? n.fold : null, n.ref],
        ["target", n.target],
        ["value", n.val],
        ["module", (n.group || []).join(" › ")],
        ["schema", n.schema ? pre(n.schema, "code small") : null],
      ]),
    );
    if (n.subgraph !== undefined && n.subgraph !== null && graphs[n.subgraph]) {
      panel.appendChild(h("button", { class: "btn", "data-action": "open-subgraph", on: { click: () => setGraph(n.subgraph) } }, "open subgraph " + graphs[n.subgraph].title));
    }
    const ins = p.inputs[i];
    const outs = p.users[i];
    if (ins.length) panel.append(h("h4", null, "Inputs"), h("div", { class: "links" }, ins.map(nodeLink)));
    if (outs.length) panel.append(h("h4", null, "Users"), h("div", { class: "links" }, outs.slice(0, 200).map(nodeLink)));
    if (n.args !== undefined) panel.append(h("h4", null, "Arguments"), pre(JSON.stringify(n.args, null, 1), "code small"));
    if (n.kwargs !== undefined) panel.append(h("h4", null, "Keyword arguments"), pre(JSON.stringify(n.kwargs, null, 1), "code small"));
    if (n.doc) panel.append(h("h4", null, "Doc string"), pre(n.doc, "code small"));
    if (n.stack) panel.append(h("h4", null, "Stack trace"), pre(n.stack, "code small"));
    if (n.meta) panel.append(h("h4", null, "Metadata"), pre(JSON.stringify(n.meta, null, 1), "code small"));
  }

  function doSearch() {
    clear(results);
    const q = search.value.trim().toLowerCase();
    if (!q) return;
    // exact names first, then names starting with the text, then any match of name or op
    const rank = [[], [], []];
    for (let i = 0; i < p.n; i++) {
      const n = p.g.nodes[i];
      const name = n.name.toLowerCase();
      if (name === q) rank[0].push(i);
      else if (name.startsWith(q)) rank[1].push(i);
      else if (name.includes(q) || (n.target || "").toLowerCase().includes(q)) rank[2].push(i);
    }
    const found = rank[0].concat(rank[1], rank[2]);
    for (const i of found.slice(0, RESULTS)) {
      const n = p.g.nodes[i];
      results.appendChild(h("button", { class: "result", "data-kind": "result", "data-name": n.name, on: { click: () => selectNode(i, true) } }, n.name + "  " + shortTarget(n)));
    }
    if (found.length > RESULTS) results.appendChild(h("span", { class: "dim" }, "… " + (found.length - RESULTS) + " more"));
    if (!found.length) results.appendChild(h("span", { class: "dim" }, "no match"));
  }
  search.addEventListener("input", doSearch);
  search.addEventListener("keydown", (e) => {
    if (e.key === "Enter") {
      const first = results.querySelector("button.result");
      if (first) first.click();
    }
  });
  select.addEventListener("change", () => setGraph(Number(select.value)));

  // pan and zoom
  let drag = null;
  svg.addEventListener("mousedown", (e) => {
    drag = { x: e.clientX, y: e.clientY, vx: view.x, vy: view.y };
  });
  window.addEventListener("mousemove", (e) => {
    if (!drag) return;
    view.x = drag.vx + e.clientX - drag.x;
    view.y = drag.vy + e.clientY - drag.y;
    applyView();
  });
  window.addEventListener("mouseup", () => {
    drag = null;
  });
  svg.addEventListener(
    "wheel",
    (e) => {
      e.preventDefault();
      const r = svg.getBoundingClientRect();
      const mx = e.clientX - r.left;
      const my = e.clientY - r.top;
      const k2 = Math.min(4, Math.max(0.02, view.k * Math.exp(-e.deltaY * 0.0015)));
      view.x = mx - ((mx - view.x) * k2) / view.k;
      view.y = my - ((my - view.y) * k2) / view.k;
      view.k = k2;
      applyView();
    },
    { passive: false },
  );

  const expandAll = () => {
    if (p.n > MAX_VISIBLE) {
      status.textContent = p.n + " nodes: too many to expand at once; expand groups one by one";
      return;
    }
    for (const k of p.groups.keys()) expanded.add(k);
    render(true);
  };
  const collapseAll = () => {
    expanded.clear();
    render(true);
  };
  const foldBtn = h("button", { class: "btn", "data-action": "toggle-fold", title: "parameters and constants inside the nodes using them, or as nodes of their own" });
  const showFold = () => {
    foldBtn.textContent = foldOn ? "Weights: in nodes" : "Weights: as nodes";
    foldBtn.setAttribute("data-state", foldOn ? "folded" : "unfolded");
  };
  const toggleFold = () => {
    foldOn = !foldOn;
    for (const pp of prepared.values()) setFold(pp, foldOn);
    showFold();
    if (p) render(false);
  };
  showFold();
  const bar = h(
    "div",
    { class: "toolbar" },
    select,
    search,
    h("button", { class: "btn", "data-action": "expand-all", on: { click: expandAll } }, "Expand all"),
    h("button", { class: "btn", "data-action": "collapse-all", on: { click: collapseAll } }, "Collapse all"),
    h("button", { class: "btn", "data-action": "fit", on: { click: fit } }, "Fit"),
    foldBtn,
    status,
  );
  const el = h("div", { class: "split" }, h("div", { class: "left" }, bar, results, canvas), panel);
  foldBtn.addEventListener("click", toggleFold);
  let started = false;
  let pending = null;
  /** select a node by name (the first graph that has it), as ``#node=NAME`` asks */
  function revealNode(name) {
    for (let k = 0; k < graphs.length; k++) {
      const i = graphs[k].nodes.findIndex((x) => x.name === name);
      if (i >= 0) {
        if (k !== gi || !p) setGraph(k);
        selectNode(i, true);
        return true;
      }
    }
    status.textContent = "no node named " + name;
    return false;
  }
  return {
    el,
    afterShow: () => {
      if (!started) {
        started = true;
        setGraph(0);
      } else fit();
      if (pending !== null) {
        const name = pending;
        pending = null;
        revealNode(name);
      }
    },
    reveal: (name) => {
      if (started) revealNode(name);
      else pending = name;
    },
    setFold: (on) => {
      if (on !== foldOn) toggleFold();
    },
  };
}

/** where along an edge its label may go: points at a few fractions of its length */
function anchors(pts) {
  if (pts.length === 2) {
    // the cubic between two groups: its points at t (the curve of render())
    const [a, b] = pts;
    const dy = Math.max(20, Math.abs(b.y - a.y) / 2);
    const at = (t) => {
      const u = 1 - t;
      return {
        x: u * u * u * a.x + 3 * u * u * t * a.x + 3 * u * t * t * b.x + t * t * t * b.x,
        y: u * u * u * a.y + 3 * u * u * t * (a.y + dy) + 3 * u * t * t * (b.y - dy) + t * t * t * b.y,
      };
    };
    return [0.5, 0.35, 0.65, 0.22, 0.78].map(at);
  }
  const seg = [];
  let total = 0;
  for (let i = 1; i < pts.length; i++) {
    const d = Math.hypot(pts[i].x - pts[i - 1].x, pts[i].y - pts[i - 1].y);
    seg.push(d);
    total += d;
  }
  return [0.5, 0.35, 0.65, 0.22, 0.78].map((f) => {
    let want = f * total;
    for (let i = 0; i < seg.length; i++) {
      if (want <= seg[i] || i === seg.length - 1) {
        const r = seg[i] ? Math.min(1, want / seg[i]) : 0;
        return { x: pts[i].x + r * (pts[i + 1].x - pts[i].x), y: pts[i].y + r * (pts[i + 1].y - pts[i].y) };
      }
      want -= seg[i];
    }
    return pts[0];
  });
}

/** Place edge labels so that no two overlap and none covers a box: each goes to the first
 * of its edge's anchor points where its measured box is free, else steps down from the
 * middle one until it is (a label that still finds no room after many steps is hidden). */
function placeLabels(labels, boxes, frames) {
  if (!labels.length) return;
  const CELL = 64;
  const grid = new Map();
  const cells = (r, fn) => {
    for (let cx = Math.floor(r.x / CELL); cx <= Math.floor((r.x + r.w) / CELL); cx++)
      for (let cy = Math.floor(r.y / CELL); cy <= Math.floor((r.y + r.h) / CELL); cy++) if (fn(cx + "," + cy) === false) return false;
    return true;
  };
  const hit = (a, b) => a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
  const free = (r) => cells(r, (k) => !(grid.get(k) || []).some((o) => hit(r, o)));
  const take = (r) =>
    cells(r, (k) => {
      if (!grid.has(k)) grid.set(k, []);
      grid.get(k).push(r);
    });
  for (const b of boxes.values()) take({ x: b.x - b.width / 2, y: b.y - b.height / 2, w: b.width, h: b.height });
  for (const f of frames.values()) take({ x: f.x - f.width / 2, y: f.y - f.height / 2, w: f.width, h: PAD.top - 4 }); // a frame's header
  // measure every label first (one layout), then place
  const sizes = labels.map(([t]) => {
    try {
      const bb = t.getBBox();
      if (bb.width > 0) return bb;
    } catch (e) {
      void e;
    }
    const n = (t.textContent || "").length;
    return { x: 0, y: -9, width: 5.5 * n, height: 11 };
  });
  const GAP = 1;
  labels.forEach(([t, pts], i) => {
    const bb = sizes[i];
    const at = (pt, dy) => ({ x: pt.x + 3, y: pt.y - bb.height / 2 + dy, w: bb.width + GAP, h: bb.height + GAP });
    let r = null;
    for (const pt of pts) {
      const c = at(pt, 0);
      if (free(c)) {
        r = c;
        break;
      }
    }
    for (let k = 1; !r && k < 400; k++) {
      const c = at(pts[0], (k % 2 ? 1 : -1) * Math.ceil(k / 2) * (bb.height + GAP));
      if (free(c)) r = c;
    }
    if (!r) {
      t.setAttribute("display", "none");
      return;
    }
    take(r);
    t.setAttribute("x", (r.x - bb.x).toFixed(1));
    t.setAttribute("y", (r.y - bb.y).toFixed(1));
  });
}
