// torchless view: the page. The data model is the JSON in #tl-data (built by
// torchless.view.model); #tl-config says where statistics come from.
import { h, clear, fmtBytes, fmtNum, shapeText, kvTable, pre } from "./dom.js";
import { tensorsView, treemapView } from "./tensors.js";
import { graphView } from "./graph.js";
import { getDiffStats } from "./data.js";
import { drawHistogram } from "./charts.js";
import { highlighted } from "./highlight.js";

const MODEL_VERSION = 1;

function readJson(id) {
  const el = document.getElementById(id);
  return el ? JSON.parse(el.textContent) : null;
}

function codeView(art) {
  const names = Object.keys(art.code || {});
  const sel = h("select", { class: "graph-select", "aria-label": "code" });
  names.forEach((n) => sel.appendChild(h("option", { value: n }, n)));
  const box = h("div", null);
  const show = () => {
    clear(box);
    box.appendChild(highlighted(art.code[sel.value] || ""));
  };
  sel.addEventListener("change", show);
  show();
  return { el: h("div", { class: "single" }, h("div", { class: "toolbar" }, sel), box) };
}

function infoView(art) {
  const parts = [h("h3", null, art.name + " (" + art.format + ")")];
  for (const n of art.notes || []) parts.push(h("p", { class: "note" }, n));
  parts.push(pre(JSON.stringify(art.info, null, 2), "code"));
  return { el: h("div", { class: "single" }, parts) };
}

function findingsView(model) {
  const box = h("div", { class: "single findings" });
  model.artifacts.forEach((art) => {
    const f = art.findings;
    box.appendChild(h("h3", null, "Scan of " + art.name));
    if (!f) {
      box.appendChild(h("p", { class: "hint" }, "not scanned"));
      return;
    }
    if (f.error) box.appendChild(h("p", { class: "warn" }, f.error));
    for (const file of f.files || []) {
      box.appendChild(h("p", null, h("span", { class: "verdict v-" + String(file.verdict).toLowerCase() }, file.verdict), " ", file.path, " (" + file.kind + ")"));
      if (!file.findings.length) box.appendChild(h("p", { class: "dim" }, "no findings"));
      for (const x of file.findings) {
        box.appendChild(
          h(
            "div",
            { class: "finding sev-" + x.severity, "data-kind": "finding", "data-name": x.rule },
            h("div", { class: "fhead" }, h("span", { class: "badge" }, x.severity), " ", h("b", null, x.rule), " ", x.message),
            kvTable([
              ["member", x.member],
              ["offset", x.offset === null || x.offset === undefined ? null : String(x.offset)],
              ["file offset", x.file_offset === null || x.file_offset === undefined ? null : String(x.file_offset)],
              ["would call", x.global],
              ["loader", x.loader],
            ]),
            x.disassembly && x.disassembly.length ? pre(x.disassembly.join("\n"), "code small") : null,
          ),
        );
      }
    }
  });
  return { el: box };
}

function valuesNote(d) {
  if (!("values_changed" in d)) return "";
  return "; other values: " + (d.values_changed || []).length + " changed, " + (d.values_added || []).length + " added, " + (d.values_removed || []).length + " removed";
}

function diffView(app) {
  const d = app.model.diff;
  const [A, B] = app.model.artifacts;
  const byName = [new Map(A.tensors.map((t) => [t.name, t])), new Map(B.tensors.map((t) => [t.name, t]))];
  const panel = h("div", { class: "panel" }, h("p", { class: "hint" }, "Click a changed tensor for its differences."));
  const table = h("table", { class: "difftable" }, h("tr", null, h("th", null, "status"), h("th", null, "tensor"), h("th", null, "a"), h("th", null, "b"), h("th", null, "max |b−a|")));
  const row = (status, name, extra) => {
    const a = byName[0].get(name);
    const b = byName[1].get(name);
    const r = h(
      "tr",
      { class: "d-" + status, "data-kind": "diff", "data-name": name, "data-status": status },
      h("td", null, status),
      h("td", null, name),
      h("td", null, a ? a.dtype + shapeText(a.shape) : ""),
      h("td", null, b ? b.dtype + shapeText(b.shape) : ""),
      h("td", null, extra),
    );
    if (status === "changed") r.addEventListener("click", () => showDiff(name, a, b));
    table.appendChild(r);
  };
  for (const c of d.changed || []) row("changed", c.name, c.max_abs_diff === null ? c.reason : fmtNum(c.max_abs_diff));
  for (const n of d.added || []) row("added", n, "");
  for (const n of d.removed || []) row("removed", n, "");
  for (const c of d.not_compared || []) row("not compared", c.name, c.reason);
  // values that are not tensors (configs, hyperparameters, metadata), when the diff has them
  const valueRow = (status, name, a, b) =>
    table.appendChild(
      h("tr", { class: "d-value", "data-kind": "diffvalue", "data-name": name, "data-status": status }, h("td", null, status), h("td", null, name), h("td", null, a), h("td", null, b), h("td", null, "")),
    );
  const shown = (v) => (v === undefined ? "" : typeof v === "string" ? v : JSON.stringify(v));
  for (const c of d.values_changed || []) valueRow("value changed", String(c.name), shown(c.a), shown(c.b));
  for (const n of d.values_added || []) valueRow("value added", String(n), "", "");
  for (const n of d.values_removed || []) valueRow("value removed", String(n), "", "");

  function showDiff(name, a, b) {
    clear(panel);
    panel.appendChild(h("h3", { class: "title" }, name));
    panel.appendChild(kvTable([["a", a.dtype + shapeText(a.shape)], ["b", b.dtype + shapeText(b.shape)]]));
    const stats = h("div", null, h("p", { class: "hint" }, "computing differences…"));
    const hist = h("canvas", { class: "hist", width: "480", height: "160" });
    panel.append(stats, h("h4", null, "Histogram of b − a"), hist);
    getDiffStats(app, name).then((st) => {
      clear(stats);
      if (!st) return stats.appendChild(h("p", { class: "hint" }, "differences not embedded for this tensor"));
      if (st.error) return stats.appendChild(h("p", { class: "warn" }, st.error));
      stats.appendChild(
        kvTable([
          ["sample", st.sampled ? fmtNum(st.sample) + " of " + fmtNum(st.numel) + " elements (sampled)" : "all " + fmtNum(st.numel) + " elements"],
          ["elements that differ", fmtNum(st.changed)],
          ["max |b−a|", fmtNum(st.max_abs)],
          ["mean |b−a|", fmtNum(st.mean_abs)],
          ["mean b−a", fmtNum(st.mean)],
        ]),
      );
      drawHistogram(hist, st.hist, "#d62728");
    });
  }
  const summary = h(
    "div",
    { class: "toolbar" },
    h("span", { class: "count" }, (d.identical ? "identical: " : "") + (d.changed || []).length + " changed, " + (d.added || []).length + " added, " + (d.removed || []).length + " removed, " + (d.not_compared || []).length + " not compared, " + d.same + " same" + valuesNote(d)),
  );
  return { el: h("div", { class: "split" }, h("div", { class: "left scroll" }, summary, table), panel) };
}

function start() {
  const root = document.getElementById("app");
  const model = readJson("tl-data");
  const config = readJson("tl-config") || {};
  if (!model || model.version !== MODEL_VERSION) {
    root.appendChild(h("p", { class: "warn" }, "this page's data is missing or of another version"));
    return;
  }
  // the address: a tab (#graph), a tensor (#tensor=NAME) or a node (#node=NAME), and
  // options after "&" (#graph&unfold: parameters and constants as nodes of their own)
  const link = parseHash(location.hash);
  const app = { model, config, unfold: link.unfold };
  window.__tlUnfold = link.unfold;
  const tabs = [];
  const arts = model.artifacts;
  let ai = 0;
  const tabBar = h("nav", { class: "tabs" });
  const body = h("main", { class: "body" });
  const made = new Map();

  const add = (id, label, make) => tabs.push({ id, label, make });
  function buildTabs() {
    tabs.length = 0;
    const art = arts[ai];
    if (model.diff) add("diff", "Diff", () => diffView(app));
    add("tensors", "Tensors (" + art.tensors.length + ")", () => tensorsView(app, ai));
    add("treemap", "Treemap", () => treemapView(app, ai));
    if (art.graphs.length) add("graph", "Graph (" + art.graphs.reduce((x, g) => x + g.nodes.length, 0) + ")", () => graphView(app, ai));
    if (Object.keys(art.code || {}).length) add("code", "Code", () => codeView(art));
    add("info", "Info", () => infoView(art));
    add("findings", "Findings" + countFindings(), () => findingsView(model));
  }
  function countFindings() {
    let n = 0;
    for (const a of arts) for (const f of (a.findings && a.findings.files) || []) n += f.findings.filter((x) => x.severity !== "info").length;
    return n ? " (" + n + ")" : "";
  }
  function show(id) {
    for (const b of tabBar.querySelectorAll("button")) b.classList.toggle("active", b.getAttribute("data-tab") === id);
    clear(body);
    const key = ai + ":" + id;
    if (!made.has(key)) made.set(key, tabs.find((t) => t.id === id).make());
    const v = made.get(key);
    body.appendChild(v.el);
    if (v.afterShow) requestAnimationFrame(() => v.afterShow());
    document.body.setAttribute("data-tab", id);
    return v;
  }
  function renderTabs(current) {
    buildTabs();
    clear(tabBar);
    for (const t of tabs) tabBar.appendChild(h("button", { class: "tab", "data-tab": t.id, on: { click: () => show(t.id) } }, t.label));
    show(tabs.some((t) => t.id === current) ? current : tabs[0].id);
  }

  const head = h("header", null, h("span", { class: "brand" }, "torchless view"));
  arts.forEach((a, i) => {
    const verdicts = ((a.findings && a.findings.files) || []).map((f) => f.verdict);
    const worst = verdicts.find((v) => v !== "CLEAN") || verdicts[0] || "";
    const b = h(
      "button",
      { class: "artifact" + (i === ai ? " active" : ""), "data-artifact": String(i), title: a.name },
      (arts.length > 1 ? (i ? "b: " : "a: ") : "") + a.name,
      h("span", { class: "fmt" }, a.format),
      h("span", { class: "dim" }, a.tensors.length + " tensors, " + fmtBytes(a.tensors.reduce((x, t) => x + t.nbytes, 0))),
      worst ? h("span", { class: "verdict v-" + worst.toLowerCase() }, worst) : null,
    );
    b.addEventListener("click", () => {
      ai = i;
      for (const x of head.querySelectorAll("button.artifact")) x.classList.toggle("active", x === b);
      const cur = document.body.getAttribute("data-tab");
      renderTabs(cur === "diff" ? "tensors" : cur);
    });
    head.appendChild(b);
  });
  root.append(head, tabBar, body);
  function go(to) {
    if (to.tensor !== undefined) {
      renderTabs("tensors");
      const v = made.get(ai + ":tensors");
      if (v && v.reveal) v.reveal(to.tensor);
    } else if (to.node !== undefined) {
      if (!arts[ai].graphs.length) return renderTabs(null);
      renderTabs("graph");
      made.get(ai + ":graph").reveal(to.node);
    } else renderTabs(to.tab);
  }
  go(link);
  window.addEventListener("hashchange", () => {
    if (location.hash === window.__tlHashSelf) return; // the page's own record of where it is
    const to = parseHash(location.hash);
    if (to.unfold !== app.unfold) {
      app.unfold = window.__tlUnfold = to.unfold;
      const g = made.get(ai + ":graph");
      if (g) g.setFold(!to.unfold);
    }
    go(to);
  });
  document.body.setAttribute("data-ready", "1");
}

/** ``#graph``, ``#tensor=NAME``, ``#node=NAME`` (NAME percent-encoded), options after "&" */
function parseHash(hash) {
  const out = { tab: null, unfold: false };
  const parts = hash.replace(/^#/, "").split("&");
  for (const part of parts) {
    const eq = part.indexOf("=");
    const key = eq < 0 ? part : part.slice(0, eq);
    let val = eq < 0 ? "" : part.slice(eq + 1);
    try {
      val = decodeURIComponent(val);
    } catch (e) {
      void e;
    }
    if (key === "unfold") out.unfold = true;
    else if (key === "tensor" && eq >= 0) out.tensor = val;
    else if (key === "node" && eq >= 0) out.node = val;
    else if (/^[a-z]+$/.test(key) && out.tab === null) out.tab = key;
  }
  return out;
}

start();
