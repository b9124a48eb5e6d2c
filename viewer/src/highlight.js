// A small syntax highlighter for the Code tab: TorchScript code, .pt2 graph code and the
// Python source in archives are all Python syntax. The text is cut into tokens by one
// sticky regular expression per token kind; each token becomes a text node (plain) or a
// <span class="tok-KIND"> holding a text node, so the page's text is the code exactly and
// nothing from the file is ever parsed as HTML.
import { h } from "./dom.js";

const KEYWORDS = new Set(
  "and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield match case".split(" "),
);
const CONSTANTS = new Set(["None", "True", "False", "self", "NotImplemented", "Ellipsis", "__torch__"]);
const TYPES = new Set(
  "Tensor int float bool str complex bytes list dict tuple set List Dict Tuple Optional Union Any Device Generator Layout ScalarType MemoryFormat Storage NoneType Future Await RRef Stream Final NamedTuple Enum Module".split(" "),
);
const NAMESPACES = new Set(["torch", "ops", "aten", "prim", "prims", "math", "operator", "builtins", "torchvision", "quantized", "nn", "functional", "F", "np"]);

// order matters: the first that matches at a position wins
const RULES = [
  ["comment", /#[^\n]*/y],
  ["str", /[rRbBuUfF]{0,2}("""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|"(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?)/y],
  ["num", /(?:0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+|(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][+-]?\d+)?[jJ]?)(?![A-Za-z_])/y],
  ["deco", /@[A-Za-z_][A-Za-z0-9_.]*/y],
  ["name", /[A-Za-z_][A-Za-z0-9_]*/y],
  ["space", /\s+/y],
  ["op", /[^\sA-Za-z0-9_#'"@]+/y],
];

/** ``[[kind, text], ...]``: the tokens of ``text``, which join back to it exactly. Kinds:
 * kw, const, type, ns (torch, ops, aten...), def (a name after def/class), fn (a name
 * called), num, str, comment, deco, and "" (anything else). */
export function tokenize(text) {
  const out = [];
  let i = 0;
  let prev = ""; // the previous name token, for def/class
  const push = (kind, t) => {
    const last = out[out.length - 1];
    if (last && last[0] === kind && kind === "") last[1] += t;
    else out.push([kind, t]);
  };
  while (i < text.length) {
    let matched = false;
    for (const [kind, re] of RULES) {
      re.lastIndex = i;
      const m = re.exec(text);
      if (!m || !m[0].length) continue;
      const t = m[0];
      let k = kind;
      if (kind === "name") {
        if (KEYWORDS.has(t)) k = "kw";
        else if (prev === "def" || prev === "class") k = "def";
        else if (CONSTANTS.has(t)) k = "const";
        else if (TYPES.has(t)) k = "type";
        else if (NAMESPACES.has(t) && text[i + t.length] === ".") k = "ns";
        else if (/^\s*\(/.test(text.slice(i + t.length, i + t.length + 8))) k = "fn";
        else k = "";
        prev = t;
      } else if (kind === "space") k = "";
      else if (kind === "op") {
        k = "";
        prev = "";
      }
      push(k, t);
      i += t.length;
      matched = true;
      break;
    }
    if (!matched) {
      push("", text[i]);
      i++;
    }
  }
  return out;
}

/** the highlighted code as a <pre class="code hl">: spans for tokens, text nodes between */
export function highlighted(text) {
  const pre = h("pre", { class: "code hl" });
  const frag = document.createDocumentFragment();
  for (const [kind, t] of tokenize(text)) frag.appendChild(kind ? h("span", { class: "tok-" + kind }, t) : document.createTextNode(t));
  pre.appendChild(frag);
  return pre;
}
