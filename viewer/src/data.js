// Where statistics come from: the local server (asked on demand, with the page's token) or,
// in a self-contained file, what the file embedded.

function ask(app, what, params) {
  const cfg = app.config;
  const q = new URLSearchParams(params);
  q.set("token", cfg.token || "");
  return fetch(cfg.api + "/" + what + "?" + q.toString(), { credentials: "omit", cache: "no-store" })
    .then((r) =>
      r.ok
        ? r.json()
        : r
            .json()
            .then((j) => ({ error: (j && j.error) || "the server answered " + r.status }))
            .catch(() => ({ error: "the server answered " + r.status })),
    )
    .catch((e) => ({ error: "the server could not be reached (" + String(e && e.message) + ")" }));
}

function embedded(app, table, key) {
  const emb = app.model.embedded;
  const v = emb && emb[table] ? emb[table][key] : undefined;
  return Promise.resolve(v === undefined ? null : v);
}

export function getStats(app, ai, name) {
  if (app.config.api) return ask(app, "stats", { a: String(ai), name });
  return embedded(app, "stats", ai + ":" + name);
}

export function getHeatmap(app, ai, name, index) {
  if (app.config.api) return ask(app, "heatmap", { a: String(ai), name, index: (index || []).join(",") });
  return embedded(app, "heatmaps", ai + ":" + name);
}

export function getDiffStats(app, name) {
  if (app.config.api) return ask(app, "diffstats", { name });
  return embedded(app, "diffstats", name);
}
