// Tensors: a searchable, collapsible tree by dotted name; a treemap of bytes by module
// path; the statistics / histogram / heatmap panel of the selected tensor.
import { h, clear, fmtBytes, fmtNum, shapeText, kvTable } from "./dom.js";
import { getStats, getHeatmap } from "./data.js";
import { drawHistogram, drawHeatmap } from "./charts.js";

const EXPAND_ALL_BELOW = 500; // trees this small open fully
const SEARCH_LIMIT = 2000;

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

function tensorRow(t, label, rows) {
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
  rows.set(row, t); // one listener on the list serves every row (big trees)
  return row;
}

export function tensorsView(app, ai) {
  const art = app.model.artifacts[ai];
  const tensors = art.tensors;
  const tree = buildTree(tensors);
  const expanded = new Set();
  const openAll = tensors.length <= EXPAND_ALL_BELOW;
  let selectedRow = null;

  const list = h("div", { class: "tree", role: "tree" });
  const rows = new WeakMap(); // row element -> its tensor, or a group row's toggle
  const activate = (e) => {
    const row = e.target.closest(".row");
    const what = row && rows.get(row);
    if (!what) return;
    if (typeof what === "function") what();
    else select(what, row);
  };
  list.addEventListener("click", activate);
  list.addEventListener("keydown", (e) => {
    if (e.key === "Enter") activate(e);
  });
  const panel = h("div", { class: "panel" }, h("p", { class: "hint" }, "Select a tensor to see its statistics."));
  const search = h("input", { type: "search", class: "search", placeholder: "search tensors (name, dtype)", "aria-label": "search tensors" });
  const count = h("span", { class: "count" });

  function select(t, row) {
    if (selectedRow) selectedRow.classList.remove("selected");
    selectedRow = row;
    row.classList.add("selected");
    showTensor(app, ai, t, panel);
  }

  function groupRow(node, depth) {
    const isOpen = expanded.has(node.path);
    const kids = h("div", { class: "kids" });
    const row = h(
      "div",
      { class: "row group" + (isOpen ? " open" : ""), "data-kind": "tgroup", "data-name": node.path, tabindex: "0", title: node.path },
      h("span", { class: "twist" }, isOpen ? "▾" : "▸"),
      h("span", { class: "tname" }, node.seg),
      h("span", { class: "dim" }, node.count + " tensors"),
      h("span", { class: "bytes" }, fmtBytes(node.bytes)),
    );
    const wrap = h("div", { class: "node" }, row, kids);
    wrap.style.setProperty("--depth", depth);
    const toggle = () => {
      if (row.classList.contains("open")) {
        row.classList.remove("open");
        expanded.delete(node.path);
        row.firstChild.textContent = "▸";
        clear(kids);
      } else {
        row.classList.add("open");
        expanded.add(node.path);
        row.firstChild.textContent = "▾";
        fill(kids, node, depth + 1);
      }
    };
    rows.set(row, toggle);
    if (isOpen) fill(kids, node, depth + 1);
    return wrap;
  }

  function fill(el, node, depth) {
    const frag = document.createDocumentFragment();
    for (const k of node.kids.values()) frag.appendChild(groupRow(k, depth));
    for (const t of node.leaves) {
      const r = tensorRow(t, t.name.split(".").pop(), rows);
      r.style.setProperty("--depth", depth);
      frag.appendChild(r);
    }
    el.appendChild(frag);
  }

  function render() {
    clear(list);
    const q = search.value.trim().toLowerCase();
    if (!q) {
      fill(list, tree, 0);
      count.textContent = tensors.length + " tensors, " + fmtBytes(tree.bytes);
      return;
    }
    let n = 0;
    const frag = document.createDocumentFragment();
    for (const t of tensors) {
      if (t.name.toLowerCase().includes(q) || t.dtype.toLowerCase() === q) {
        if (n < SEARCH_LIMIT) frag.appendChild(tensorRow(t, t.name, rows));
        n++;
      }
    }
    list.appendChild(frag);
    count.textContent = n + " of " + tensors.length + " match" + (n > SEARCH_LIMIT ? " (first " + SEARCH_LIMIT + " shown)" : "");
  }

  function setAll(open) {
    expanded.clear();
    if (open) {
      const walk = (n) => {
        for (const k of n.kids.values()) {
          expanded.add(k.path);
          walk(k);
        }
      };
      walk(tree);
    }
    render();
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
  return { el: view, refresh: render };
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
