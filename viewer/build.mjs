// Builds the viewer into ../src/torchless/view/static/ (viewer.js, viewer.css, build.json).
// build.json records the SHA-256 of the sources (package.json, package-lock.json, this file,
// src/**) and of the outputs; tests/view/test_build.py recomputes both without Node.
import { build, version } from "esbuild";
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync, readdirSync, statSync, mkdirSync } from "node:fs";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
const out = join(here, "..", "src", "torchless", "view", "static");

function files(dir) {
  const acc = [];
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) acc.push(...files(p));
    else acc.push(p);
  }
  return acc;
}

export function sourcesHash() {
  const list = ["package.json", "package-lock.json", "build.mjs", ...files(join(here, "src")).map((p) => relative(here, p))];
  const h = createHash("sha256");
  for (const rel of list.map((p) => p.split("\\").join("/")).sort()) {
    h.update(rel + "\0");
    h.update(readFileSync(join(here, rel)));
    h.update("\0");
  }
  return h.digest("hex");
}

mkdirSync(out, { recursive: true });
const res = await build({
  entryPoints: [join(here, "src", "main.js")],
  bundle: true,
  minify: true,
  format: "iife",
  target: ["es2020"],
  charset: "utf8",
  legalComments: "eof",
  write: false,
  logLevel: "warning",
});
const js = res.outputFiles[0].text;
const css = readFileSync(join(here, "src", "viewer.css"), "utf8");
writeFileSync(join(out, "viewer.js"), js);
writeFileSync(join(out, "viewer.css"), css);
const sha = (s) => createHash("sha256").update(s).digest("hex");
const lock = JSON.parse(readFileSync(join(here, "package-lock.json"), "utf8"));
const info = {
  sources_sha256: sourcesHash(),
  outputs_sha256: { "viewer.js": sha(js), "viewer.css": sha(css) },
  esbuild: version,
  dagre: lock.packages["node_modules/@dagrejs/dagre"].version,
};
writeFileSync(join(out, "build.json"), JSON.stringify(info, null, 2) + "\n");
console.log("built viewer.js (" + js.length + " bytes), sources " + info.sources_sha256.slice(0, 12));
