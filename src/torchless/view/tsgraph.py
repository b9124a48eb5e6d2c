"""TorchScript methods as operator graphs for the viewer, from the code torchless reads.

A method's text (``ScriptObject.method_source(name).code``, what torch's ``.code`` prints)
is parsed with :mod:`ast` (parsed, never compiled or run) and read as dataflow: each
argument is a ``placeholder``; ``x = self.attr`` a ``get_attr`` (a parameter, buffer,
submodule or attribute: folded into its users on the page); each call, operator,
subscript and list/tuple literal that reads a value a node, with an edge from every node
whose value it reads; ``return`` the ``output``. The bodies of ``if`` and loops are drawn
inline in a group of their own (``if 3`` / ``else 3`` / ``loop 5``, by line), after a node
for the condition. Nodes are in the viewer model's format (:mod:`torchless.view.model`).
"""

from __future__ import annotations

import ast
from typing import Any

__all__ = ["method_graph", "MAX_NODES"]

#: nodes one method's graph may have (a larger method is cut, with a note node)
MAX_NODES = 5000

_BINOPS = {
    ast.Add: "add",
    ast.Sub: "sub",
    ast.Mult: "mul",
    ast.Div: "div",
    ast.FloorDiv: "floordiv",
    ast.Mod: "remainder",
    ast.Pow: "pow",
    ast.MatMult: "matmul",
    ast.BitAnd: "and",
    ast.BitOr: "or",
    ast.BitXor: "xor",
    ast.LShift: "lshift",
    ast.RShift: "rshift",
}
_CMPOPS = {
    ast.Eq: "eq",
    ast.NotEq: "ne",
    ast.Lt: "lt",
    ast.LtE: "le",
    ast.Gt: "gt",
    ast.GtE: "ge",
    ast.Is: "is",
    ast.IsNot: "isnot",
    ast.In: "in",
    ast.NotIn: "notin",
}


class _TooBig(Exception):
    pass


def _dotted(e: ast.AST) -> str | None:
    if isinstance(e, ast.Name):
        return e.id
    if isinstance(e, ast.Attribute):
        up = _dotted(e.value)
        return f"{up}.{e.attr}" if up is not None else None
    return None


class _Builder:
    def __init__(self, lines: list[str], params: set[str], buffers: set[str], modules: set[str]) -> None:
        self.lines = lines
        self.params, self.buffers, self.modules = params, buffers, modules
        self.nodes: list[dict[str, Any]] = []
        self.edges: list[list[Any]] = []
        self.env: dict[str, int] = {}
        self.names: set[str] = set()
        self.next: dict[str, int] = {}  # base name -> the last suffix given
        self.group: list[str] = []
        self.tmp = 0

    # -- nodes --------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        name, k = base, self.next.get(base, 0)
        while name in self.names:
            k += 1
            name = f"{base}.{k}"
        self.next[base] = k
        self.names.add(name)
        return name

    def node(self, op: str, target: str, inputs: list[int], at: ast.AST | None, name: str | None = None, **extra: Any) -> int:
        if len(self.nodes) >= MAX_NODES:
            raise _TooBig
        if name is None:
            self.tmp += 1
            name = f"%{self.tmp}"
        e: dict[str, Any] = {"name": self.fresh(name), "op": op, "target": target, "group": list(self.group)}
        line = getattr(at, "lineno", None)
        if isinstance(line, int) and 0 < line <= len(self.lines):
            e["meta"] = {"line": f"{line}: {self.lines[line - 1].strip()}"}
        e.update(extra)
        i = len(self.nodes)
        self.nodes.append(e)
        seen: set[int] = set()
        for j in inputs:
            if j not in seen:
                seen.add(j)
                self.edges.append([j, i, self.nodes[j].get("val", "")])
        return i

    # -- expressions: the node index of the value, or None for a literal ----------------------
    def expr(self, e: ast.AST, name: str | None = None) -> int | None:
        if isinstance(e, ast.Name):
            return self.env.get(e.id)
        if isinstance(e, ast.Constant):
            return None
        if isinstance(e, ast.Attribute):
            if isinstance(e.value, ast.Name) and e.value.id == "self":
                return self.attr(e.attr, e, name)
            up = self.expr(e.value)
            if up is None:
                return None
            return self.node("call_function", "prim.GetAttr", [up], e, name, args=[e.attr])
        if isinstance(e, ast.Call):
            return self.call(e, name)
        if isinstance(e, ast.Subscript):
            ins = [x for x in (self.expr(e.value), self.expr(e.slice)) if x is not None]
            return self.node("call_function", "getitem", ins, e, name, args=[ast.unparse(e)[:200]]) if ins else None
        if isinstance(e, (ast.List, ast.Tuple, ast.Set)):
            ins = [x for x in (self.expr(x) for x in e.elts) if x is not None]
            kind = {ast.List: "ListConstruct", ast.Tuple: "TupleConstruct", ast.Set: "SetConstruct"}[type(e)]
            return self.node("call_function", f"prim.{kind}", ins, e, name, args=[ast.unparse(e)[:200]]) if ins else None
        if isinstance(e, ast.Dict):
            vals = [*e.keys, *e.values]
            ins = [x for x in (self.expr(x) for x in vals if x is not None) if x is not None]
            return self.node("call_function", "prim.DictConstruct", ins, e, name) if ins else None
        if isinstance(e, ast.BinOp):
            return self.op(_BINOPS.get(type(e.op), "binop"), [e.left, e.right], e, name)
        if isinstance(e, ast.UnaryOp):
            return self.op(type(e.op).__name__.lower(), [e.operand], e, name)
        if isinstance(e, ast.BoolOp):
            return self.op(type(e.op).__name__.lower(), list(e.values), e, name)
        if isinstance(e, ast.Compare):
            return self.op(_CMPOPS.get(type(e.ops[0]), "compare"), [e.left, *e.comparators], e, name)
        if isinstance(e, ast.IfExp):
            return self.op("prim.If", [e.test, e.body, e.orelse], e, name)
        ins = [x for x in (self.expr(c) for c in ast.iter_child_nodes(e) if isinstance(c, ast.expr)) if x is not None]
        return self.node("call_function", type(e).__name__, ins, e, name) if ins else None

    def op(self, target: str, operands: list[ast.AST], at: ast.AST, name: str | None) -> int | None:
        ins = [x for x in (self.expr(o) for o in operands) if x is not None]
        if not ins:  # of literals only (-1, 2 * 3): a constant, shown in its user's arguments
            return None
        return self.node("call_function", target, ins, at, name, args=[ast.unparse(at)[:200]])

    def attr(self, attr: str, at: ast.AST, name: str | None) -> int:
        kind = (
            "parameter"
            if attr in self.params
            else "buffer"
            if attr in self.buffers
            else "module"
            if attr in self.modules
            else "attribute"
        )
        return self.node("get_attr", attr, [], at, name or attr, fold=kind, ref=attr)

    def call(self, e: ast.Call, name: str | None) -> int:
        args = [*e.args, *(k.value for k in e.keywords)]
        f = e.func
        # getattr(blocks, "0"): a child of a submodule, by name
        if (
            isinstance(f, ast.Name)
            and f.id == "getattr"
            and len(e.args) == 2
            and isinstance(e.args[1], ast.Constant)
            and isinstance(e.args[1].value, str)
        ):
            up = self.expr(e.args[0])
            if up is not None and self.nodes[up].get("fold") == "module":
                ref = f"{self.nodes[up]['ref']}.{e.args[1].value}"
                return self.node("get_attr", ref, [], e, name or ref, fold="module", ref=ref)
        shown = [ast.unparse(a)[:200] for a in args]
        if isinstance(f, ast.Attribute) and _dotted(f) is None:
            # (recv).method(...): a submodule's method, or a method of a value
            recv = self.expr(f.value)
            ins = [x for x in (self.expr(a) for a in args) if x is not None]
            if recv is not None and self.nodes[recv].get("fold") == "module":
                target = f"{self.nodes[recv]['ref']}.{f.attr}"
                return self.node("call_module", target, [recv, *ins], e, name, args=shown)
            return self.node("call_method", f.attr, ([recv] if recv is not None else []) + ins, e, name, args=shown)
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in self.env:
            recv = self.env[f.value.id]
            ins = [x for x in (self.expr(a) for a in args) if x is not None]
            if self.nodes[recv].get("fold") == "module":
                return self.node("call_module", f"{self.nodes[recv]['ref']}.{f.attr}", [recv, *ins], e, name, args=shown)
            return self.node("call_method", f.attr, [recv, *ins], e, name, args=shown)
        target = _dotted(f) or ast.unparse(f)[:200]
        ins = [x for x in (self.expr(a) for a in args) if x is not None]
        return self.node("call_function", target, ins, e, name, args=shown)

    # -- statements ---------------------------------------------------------------------
    def bind(self, t: ast.AST, value: int | None) -> None:
        if value is None:
            return
        if isinstance(t, ast.Name):
            self.env[t.id] = value
        elif isinstance(t, (ast.Tuple, ast.List)):
            for k, x in enumerate(t.elts):
                if isinstance(x, ast.Name):
                    self.env[x.id] = self.node("call_function", "getitem", [value], t, x.id, args=[k])

    def body(self, stmts: list[ast.stmt]) -> None:
        for st in stmts:
            self.stmt(st)

    def stmt(self, st: ast.stmt) -> None:
        if isinstance(st, (ast.Assign, ast.AnnAssign)):
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            if st.value is None:
                return
            name = targets[0].id if len(targets) == 1 and isinstance(targets[0], ast.Name) else None
            v = self.expr(st.value, name)
            for t in targets:
                self.bind(t, v)
        elif isinstance(st, ast.AugAssign):
            name = st.target.id if isinstance(st.target, ast.Name) else None
            self.bind(st.target, self.op(_BINOPS.get(type(st.op), "binop"), [st.target, st.value], st, name))
        elif isinstance(st, ast.Expr):
            self.expr(st.value)
        elif isinstance(st, ast.Return):
            ins = [] if st.value is None else [x for x in [self.expr(st.value)] if x is not None]
            self.node("output", "output", ins, st, "output")
        elif isinstance(st, ast.If):
            cond = self.expr(st.test)
            line = st.lineno
            self.node(
                "call_function", "prim.If", [cond] if cond is not None else [], st, f"if{line}", args=[ast.unparse(st.test)[:200]]
            )
            for label, part in ((f"if {line}", st.body), (f"else {line}", st.orelse)):
                if part:
                    self.group.append(label if not self.group else f"{self.group[-1]}/{label}")
                    self.body(part)
                    self.group.pop()
        elif isinstance(st, (ast.For, ast.While)):
            line = st.lineno
            src = st.iter if isinstance(st, ast.For) else st.test
            it = self.expr(src)
            loop = self.node(
                "call_function", "prim.Loop", [it] if it is not None else [], st, f"loop{line}", args=[ast.unparse(src)[:200]]
            )
            self.group.append(f"loop {line}" if not self.group else f"{self.group[-1]}/loop {line}")
            if isinstance(st, ast.For):
                self.bind(st.target, loop)
            self.body(st.body)
            self.group.pop()
            self.body(st.orelse)
        elif isinstance(st, (ast.With, ast.Try)):
            self.body(getattr(st, "body", []))
        elif isinstance(st, (ast.Raise, ast.Assert)):
            e = st.exc if isinstance(st, ast.Raise) else st.test
            ins = [x for x in [self.expr(e)] if x is not None] if e is not None else []
            self.node("call_function", "prim.RaiseException" if isinstance(st, ast.Raise) else "assert", ins, st)
        elif isinstance(st, ast.Delete | ast.Pass | ast.Break | ast.Continue):
            return
        else:
            for c in ast.iter_child_nodes(st):
                if isinstance(c, ast.expr):
                    self.expr(c)


def method_graph(code: str, *, params: set[str], buffers: set[str], modules: set[str]) -> dict[str, Any]:
    """``{"nodes", "edges", "note"}`` of one method's code (see the module docstring);
    ``note`` says why the graph is empty or cut (a text that does not parse, too many
    nodes), else "".

    Example:
        >>> g = method_graph("def forward(self, x: Tensor) -> Tensor:\\n  w = self.weight\\n  return torch.mm(x, w)\\n",
        ...                  params={"weight"}, buffers=set(), modules=set())
        >>> [(n["name"], n["target"]) for n in g["nodes"]]
        [('x', 'x'), ('w', 'weight'), ('%1', 'torch.mm'), ('output', 'output')]
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        return {"nodes": [], "edges": [], "note": f"the code does not parse as Python: {str(e)[:200]}"}
    b = _Builder(code.splitlines(), params, buffers, modules)
    fn = next((x for x in tree.body if isinstance(x, ast.FunctionDef)), None)
    if fn is None:
        return {"nodes": [], "edges": [], "note": "no def in the code"}
    note = ""
    try:
        for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
            if a.arg == "self":
                continue
            val = ast.unparse(a.annotation)[:200] if a.annotation is not None else None
            b.env[a.arg] = b.node("placeholder", a.arg, [], a, a.arg, **({"val": val} if val else {}))
        b.body(fn.body)
    except _TooBig:
        note = f"cut at {MAX_NODES} nodes"
    except RecursionError:
        note = "nested too deeply to draw"
    return {"nodes": b.nodes, "edges": b.edges, "note": note}
