// Tensors: a searchable, collapsible tree by dotted name; a treemap of bytes by module
// path; the statistics / histogram / heatmap panel of the selected tensor.
import { h, clear, fmtBytes, fmtNum, shapeText, kvTable, setHash } from "./dom.js";
import { getStats, getHeatmap } from "./data.js";
import { drawHistogram, drawHeatmap } from "./charts.js";

const EXPAND_ALL_BELOW = 500; // trees this small open fully

function buildTree(tensors) {
  const root = { seg: "", path: "", kids: new Map(), leaves: [], bytes: 0, count: 0 };
  for (const t of tensors) {
    const parts = t.name.split(".");
    let node = root;
    node.bytes += t.nbytes;
    node.count++;
    for (let i = 0; i < parts.length - 1; i++) {
      const seg = parts[i];
      let k = node.kids.get(seg);
      if (!k) {
        k = { seg, path: parts.slice(0, i + 1).join("."), kids: new Map(), leaves: [], bytes: 0, count: 0 };
        node.kids.set(seg, k);
      }
      k.bytes += t.nbytes;
      k.count++;
      node = k;
    }
    node.leaves.push(t);
  }
  return root;
}

const ROW = 20; // px: every row of the tree has this height (viewer.css .tree .row)
const ALL_BELOW = 2000; // lists this short are drawn whole; longer ones only where visible
const OVERSCAN = 20;

function tensorRow(t, label, depth, rows) {
  const row = h(
    "div",
    { class: "row tensor", "data-kind": "tensor", "data-name": t.name, tabindex: "0", title: t.name },
    h("span", { class: "tname" }, label),
    h("span", { class: "dtype" }, t.dtype),
    h("span", { class: "shape" }, shapeText(t.shape)),
    h("span", { class: "bytes" }, fmtBytes(t.nbytes)),
    t.param ? h("span", { class: "badge param", title: "parameter" }, "param") : null,
    t.shared ? h("span", { class: "badge shared", title: "storage shared with another tensor (#" + t.storage + ")" }, "shared") : null,
  );
  row.style.setProperty("--depth", depth);
  rows.set(row, t); // one listener on the list serves every row
  return row;
}

/** The tensor tree, virtualized: the open tree is flattened into a list of rows (groups
 * and tensors) and only the rows in view (and a few around) are in the DOM, between two
 * spacers that keep the scroll height, so 100,000 tensors open at once. */
export function tensorsView(app, ai) {
  const art = app.model.artifacts[ai];
  const tensors = art.tensors;
  const tree = buildTree(tensors);
  const expanded = new Set();
  const openAll = tensors.length <= EXPAND_ALL_BELOW;
  let selectedName = null;
  let flat = []; // {group, depth} | {t, depth, label}
  let drawn = [-1, -1];

  const list = h("div", { class: "tree", role: "tree" });
  const top = h("div", { class: "spacer" });
  const rowsBox = h("div", { class: "rows" });
  const bottom = h("div", { class: "spacer" });
  list.append(top, rowsBox, bottom);
  let rows = new WeakMap(); // row element -> its tensor, or a group row's toggle
  const activate = (e) => {
    const row = e.target.closest(".row");
    const what = row && rows.get(row);
    if (!what) return;
    if (typeof what === "function") what();
    else select(what);
  };
  list.addEventListener("click", activate);
  list.addEventListener("keydown", (e) => {
    if (e.key === "Enter") activate(e);
  });
  let pendingFrame = 0;
  list.addEventListener("scroll", () => {
    if (!pendingFrame) pendingFrame = requestAnimationFrame(() => ((pendingFrame = 0), draw(false)));
  });
  const panel = h("div", { class: "panel" }, h("p", { class: "hint" }, "Select a tensor to see its statistics."));
  const search = h("input", { type: "search", class: "search", placeholder: "search tensors (name, dtype)", "aria-label": "search tensors" });
  const count = h("span", { class: "count" });

  function select(t) {
    selectedName = t.name;
    for (const r of rowsBox.querySelectorAll(".row.selected")) r.classList.remove("selected");
    const row = [...rowsBox.children].find((r) => rows.get(r) === t);
    if (row) row.classList.add("selected");
    showTensor(app, ai, t, panel);
    setHash("tensor=" + t.name);
  }

  function toggle(node) {
    if (expanded.has(node.path)) expanded.delete(node.path);
    else expanded.add(node.path);
    flatten();
    draw(true);
  }

  function groupRow(node, depth) {
    const isOpen = expanded.has(node.path);
    const row = h(
      "div",
      { class: "row group" + (isOpen ? " open" : ""), "data-kind": "tgroup", "data-name": node.path, tabindex: "0", title: node.path },
      h("span", { class: "twist" }, isOpen ? "▾" : "▸"),
      h("span", { class: "tname" }, node.seg),
      h("span", { class: "dim" }, node.count + " tensors"),
      h("span", { class: "bytes" }, fmtBytes(node.bytes)),
    );
    row.style.setProperty("--depth", depth);
    rows.set(row, () => toggle(node));
    return row;
  }

  function walk(node, depth) {
    for (const k of node.kids.values()) {
      flat.push({ group: k, depth });
      if (expanded.has(k.path)) walk(k, depth + 1);
    }
    for (const t of node.leaves) flat.push({ t, depth, label: t.name.split(".").pop() });
  }

  function flatten() {
    flat = [];
    const q = search.value.trim().toLowerCase();
    if (!q) {
      walk(tree, 0);
      count.textContent = tensors.length + " tensors, " + fmtBytes(tree.bytes);
      return;
    }
    for (const t of tensors) if (t.name.toLowerCase().includes(q) || t.dtype.toLowerCase() === q) flat.push({ t, depth: 0, label: t.name });
    count.textContent = flat.length + " of " + tensors.length + " match";
  }

  /** the rows in view: all of a short list; of a long one, those the scroll shows */
  function draw(force) {
    let lo = 0;
    let hi = flat.length;
    if (flat.length > ALL_BELOW) {
      const H = list.clientHeight || 800;
      lo = Math.max(0, Math.floor(list.scrollTop / ROW) - OVERSCAN);
      hi = Math.min(flat.length, Math.ceil((list.scrollTop + H) / ROW) + OVERSCAN);
    }
    if (!force && lo === drawn[0] && hi === drawn[1]) return;
    drawn = [lo, hi];
    clear(rowsBox);
    rows = new WeakMap();
    const frag = document.createDocumentFragment();
    for (let i = lo; i < hi; i++) {
      const f = flat[i];
      const r = f.group ? groupRow(f.group, f.depth) : tensorRow(f.t, f.label, f.depth, rows);
      if (f.t && f.t.name === selectedName) r.classList.add("selected");
      frag.appendChild(r);
    }
    rowsBox.appendChild(frag);
    top.style.height = lo * ROW + "px";
    bottom.style.height = (flat.length - hi) * ROW + "px";
    list.setAttribute("data-rows", String(flat.length));
  }

  function render() {
    flatten();
    draw(true);
  }

  function setAll(open) {
    expanded.clear();
    if (open) {
      const all = (n) => {
        for (const k of n.kids.values()) {
          expanded.add(k.path);
          all(k);
        }
      };
      all(tree);
    }
    render();
  }

  /** open the groups above a tensor, scroll it into the middle and select it (#tensor=NAME) */
  function reveal(name) {
    const t = tensors.find((x) => x.name === name);
    if (!t) {
      count.textContent = "no tensor named " + name;
      return false;
    }
    if (search.value) search.value = "";
    const parts = name.split(".");
    for (let i = 1; i < parts.length; i++) expanded.add(parts.slice(0, i).join("."));
    flatten();
    const idx = flat.findIndex((f) => f.t === t);
    selectedName = name;
    const place = () => {
      list.scrollTop = Math.max(0, idx * ROW - (list.clientHeight || 800) / 2);
      draw(true);
      select(t);
      const row = rowsBox.querySelector(".row.selected");
      if (row && row.scrollIntoView) row.scrollIntoView({ block: "nearest" });
    };
    draw(true);
    if (list.isConnected) place();
    else requestAnimationFrame(place);
    return true;
  }

  search.addEventListener("input", render);
  const bar = h(
    "div",
    { class: "toolbar" },
    search,
    h("button", { class: "btn", "data-action": "expand-all", on: { click: () => setAll(true) } }, "Expand all"),
    h("button", { class: "btn", "data-action": "collapse-all", on: { click: () => setAll(false) } }, "Collapse all"),
    count,
  );
  if (openAll) setAll(true);
  else render();
  const view = h("div", { class: "split" }, h("div", { class: "left" }, bar, list), panel);
  return { el: view, refresh: render, afterShow: () => draw(true), reveal };
}

export function showTensor(app, ai, t, panel) {
  clear(panel);
  panel.appendChild(h("h3", { class: "title" }, t.name));
  panel.appendChild(
    kvTable([
      ["dtype", t.dtype],
      ["shape", shapeText(t.shape)],
      ["elements", fmtNum(t.numel)],
      ["bytes", fmtBytes(t.nbytes)],
      ["parameter", t.param ? "yes" : "no"],
      ["storage", t.storage === null ? "none" : "#" + t.storage + (t.shared ? " (shared)" : "")],
      ["type", t.kind],
    ]),
  );
  const stats = h("div", { class: "stats" }, h("p", { class: "hint" }, "computing statistics…"));
  const hist = h("canvas", { class: "hist", width: "480", height: "160" });
  const heat = h("div", { class: "heat" });
  panel.append(stats, h("h4", null, "Histogram"), hist, h("h4", null, "Heatmap"), heat);
  getStats(app, ai, t.name).then((st) => {
    clear(stats);
    if (!st) {
      stats.appendChild(h("p", { class: "hint" }, "statistics are not in this file (only the first tensors' are embedded); run `torchless view` for all"));
      return;
    }
    if (st.error) {
      stats.appendChild(h("p", { class: "warn" }, "values not readable: " + st.error));
      return;
    }
    stats.appendChild(
      kvTable([
        ["sample", st.sampled ? fmtNum(st.sample) + " of " + fmtNum(st.numel) + " elements (sampled)" : "all " + fmtNum(st.numel) + " elements"],
        ["min", fmtNum(st.min)],
        ["max", fmtNum(st.max)],
        ["mean", fmtNum(st.mean)],
        ["std", fmtNum(st.std)],
        ["NaN", fmtNum(st.nan)],
        ["inf", fmtNum(st.inf)],
        ["zeros", fmtNum(st.zero)],
      ]),
    );
    drawHistogram(hist, st.hist);
  });
  const lead = (t.shape || []).length - 2;
  const maps = h("div", null);
  const showSlice = (index) =>
    getHeatmap(app, ai, t.name, index).then((hm) => {
      clear(maps);
      if (!hm) maps.appendChild(h("p", { class: "hint" }, "no heatmap embedded for this tensor"));
      else if (hm.error) maps.appendChild(h("p", { class: "hint" }, hm.error));
      else maps.appendChild(drawHeatmap(hm));
    });
  if (lead > 0 && app.config.api) {
    // the leading indices of the 2-D slice (the server reads any slice on request)
    const inputs = t.shape.slice(0, lead).map((n, d) =>
      h("input", { type: "number", class: "idx", value: "0", "aria-label": "index of dimension " + d, title: "0 … " + (Number(n) - 1) }),
    );
    for (const inp of inputs) {
      inp.min = "0";
      inp.addEventListener("change", () => showSlice(inputs.map((x) => Math.max(0, Math.floor(Number(x.value) || 0)))));
    }
    heat.appendChild(h("div", { class: "slice" }, "slice [", inputs.map((x, i) => [i ? ", " : "", x]), ", :, :]"));
  }
  heat.appendChild(maps);
  showSlice([]);
}

// -- treemap of bytes by module path -------------------------------------------------------

function squarify(items, x, y, w, hgt, out) {
  // items: [{value, ...}] sorted descending; lays rows along the shorter side
  const total = items.reduce((a, b) => a + b.value, 0);
  if (!total || w <= 0 || hgt <= 0) return;
  let rest = items.slice();
  let rx = x,
    ry = y,
    rw = w,
    rh = hgt;
  let remaining = total;
  while (rest.length) {
    const side = Math.min(rw, rh);
    const area = (rw * rh) / remaining;
    let row = [rest[0]];
    let rowSum = rest[0].value;
    const worst = (r, sum) => {
      const s2 = sum * area;
      let mx = 0,
        mn = Infinity;
      for (const it of r) {
        mx = Math.max(mx, it.value * area);
        mn = Math.min(mn, it.value * area);
      }
      return Math.max((side * side * mx) / (s2 * s2), (s2 * s2) / (side * side * mn));
    };
    let i = 1;
    while (i < rest.length) {
      const cand = row.concat([rest[i]]);
      if (worst(cand, rowSum + rest[i].value) <= worst(row, rowSum)) {
        row = cand;
        rowSum += rest[i].value;
        i++;
      } else break;
    }
    const thick = (rowSum * area) / side;
    let off = 0;
    for (const it of row) {
      const len = (it.value * area) / thick;
      if (rw >= rh) out.push({ item: it, x: rx, y: ry + off, w: thick, h: len });
      else out.push({ item: it, x: rx + off, y: ry, w: len, h: thick });
      off += len;
    }
    if (rw >= rh) {
      rx += thick;
      rw -= thick;
    } else {
      ry += thick;
      rh -= thick;
    }
    remaining -= rowSum;
    rest = rest.slice(row.length);
  }
}

/** The tree by bytes of storage: a storage shared by several tensors (tied weights, views)
 * counts once, for the first tensor that uses it, so the blocks add up to the file's data. */
function storageTree(tensors) {
  const seen = new Set();
  const weighted = tensors.map((t) => {
    if (t.storage === null || t.storage === undefined) return t;
    if (seen.has(t.storage)) return { ...t, nbytes: 0 };
    seen.add(t.storage);
    return t;
  });
  return buildTree(weighted);
}

export function treemapView(app, ai) {
  const art = app.model.artifacts[ai];
  const tree = storageTree(art.tensors);
  const box = h("div", { class: "treemap" });
  const crumbs = h("div", { class: "crumbs" });
  const panel = h(
    "div",
    { class: "panel" },
    h("p", { class: "hint" }, "Bytes by module path (a shared storage counts once): click a module to zoom in, a tensor to see its statistics."),
  );
  let cur = tree;
  const stack = [];

  function children(node) {
    const items = [];
    for (const k of node.kids.values()) items.push({ value: k.bytes, node: k, label: k.seg });
    for (const t of node.leaves) items.push({ value: t.nbytes, tensor: t, label: t.name.split(".").pop() });
    return items.filter((i) => i.value > 0).sort((a, b) => b.value - a.value);
  }

  function cellFor(it, r, total, depth) {
    const pct = ((100 * it.value) / total).toFixed(1);
    const label = it.label + " " + fmtBytes(it.value) + " (" + pct + "%)";
    const cell = h(
      "div",
      {
        class: "cell " + (it.tensor ? "leaf" : "branch") + " d" + Math.min(depth, 3),
        "data-kind": "treemap",
        "data-name": it.tensor ? it.tensor.name : it.node.path,
        title: (it.tensor ? it.tensor.name : it.node.path) + ": " + fmtBytes(it.value) + " (" + pct + "% of this view)",
      },
      r.w > 40 && r.h > 14 ? h("span", null, label) : null,
    );
    cell.style.left = r.x + "px";
    cell.style.top = r.y + "px";
    cell.style.width = Math.max(0, r.w - 1) + "px";
    cell.style.height = Math.max(0, r.h - 1) + "px";
    cell.addEventListener("click", (ev) => {
      ev.stopPropagation();
      if (it.node) {
        // the crumbs: every module from the top down to this one
        stack.length = 0;
        let n = tree;
        for (const seg of it.node.path.split(".")) {
          n = n.kids.get(seg);
          stack.push(n);
        }
        cur = it.node;
        render();
      } else showTensor(app, ai, it.tensor, panel);
    });
    return cell;
  }

  // nested: a module's block holds its children's blocks, while there is room
  function place(node, x, y, w, hgt, depth, total, count) {
    const rects = [];
    squarify(children(node).slice(0, 300), x, y, w, hgt, rects);
    for (const r of rects) {
      if (count.n++ > 3000) return;
      const it = r.item;
      box.appendChild(cellFor(it, r, total, depth));
      if (it.node && depth < 3 && r.w > 60 && r.h > 44) place(it.node, r.x + 3, r.y + 17, r.w - 7, r.h - 21, depth + 1, total, count);
    }
  }

  function render() {
    clear(box);
    clear(crumbs);
    crumbs.appendChild(h("button", { class: "btn", on: { click: () => { cur = tree; stack.length = 0; render(); } } }, "(all)"));
    for (const [i, n] of stack.entries()) {
      crumbs.appendChild(h("span", { class: "sep" }, " › "));
      crumbs.appendChild(h("button", { class: "btn", on: { click: () => { cur = n; stack.length = i + 1; render(); } } }, n.seg));
    }
    crumbs.appendChild(h("span", { class: "dim" }, "  " + fmtBytes(cur.bytes)));
    const W = box.clientWidth || 800;
    const H = box.clientHeight || 480;
    place(cur, 0, 0, W, H, 0, cur.bytes || 1, { n: 0 });
  }
  const view = h("div", { class: "split" }, h("div", { class: "left" }, crumbs, box), panel);
  return { el: view, refresh: render, afterShow: render };
}
