"""Python source that a loader executes, judged without running it.

Three loaders run Python source that travels with a model: ``torch.package``'s
``PackageImporter`` (every packaged ``.py``), ``transformers``' dynamic module loader
(``from_pretrained(..., trust_remote_code=True)`` runs the modules ``auto_map`` names) and
``torch.compile``'s inductor cache (generated output code). The source is parsed with
Python's own parser (:func:`parse`: ``ast.parse``, never imported, compiled or run; a size
and a nesting limit), and every use is classified against what model code does
(:func:`analyse`): imports of ``torch``/``numpy``/``math``/``typing``/``transformers`` ...,
class and function definitions and tensor arithmetic pass; imports and uses that reach
processes, the network, the import machinery, code execution, deserialisers, native
libraries, file writes or the interpreter's internals are problems, each with its line and
the call. The inductor cache applies its own, stricter policy (what inductor emits) on the
same parser and tables (:mod:`torchless.scan.cache`).

Severities: what runs code, imports, reaches processes/network/native code or deserialises
is ``critical`` wherever it is (at import or in a function: the loaders call ``__init__``,
``forward``, ``from_pretrained`` ... and any method may run); a file write is ``critical``
at import and ``high`` inside a function; an import that is neither allowed nor known to be
dangerous is ``medium``; an unparsable source is ``unanalysable`` (never clean).
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass, field

__all__ = [
    "MAX_SOURCE_BYTES",
    "MAX_DEPTH",
    "SourceProblem",
    "SourceReport",
    "SourceError",
    "parse",
    "dotted",
    "analyse",
    "SAFE_MODULES",
    "DANGEROUS_MODULES",
    "DANGEROUS_BUILTINS",
    "DANGEROUS_ATTRS",
    "RISKY_TORCH",
    "ESCAPE_DUNDERS",
]

#: the largest source parsed (bytes); larger is ``limit``
MAX_SOURCE_BYTES = 32 << 20
#: the deepest nesting of syntax nodes walked; deeper is ``limit``
MAX_DEPTH = 400
_MAX_PROBLEMS = 200

#: modules model code imports (a module or any submodule of it): imports pass, uses of the
#: watched ones (``os``, ``sys``, ``torch``, ``numpy``, ``transformers``, ``pathlib``,
#: ``io``, ``codecs``, ``types``) are judged by :data:`_CALLS`
SAFE_MODULES = frozenset(
    [
        "__future__",
        "typing",
        "typing_extensions",
        "dataclasses",
        "math",
        "cmath",
        "numbers",
        "decimal",
        "fractions",
        "collections",
        "functools",
        "itertools",
        "operator",
        "enum",
        "abc",
        "copy",
        "warnings",
        "logging",
        "re",
        "regex",
        "json",
        "string",
        "textwrap",
        "unicodedata",
        "contextlib",
        "inspect",
        "types",
        "time",
        "datetime",
        "random",
        "bisect",
        "heapq",
        "array",
        "struct",
        "io",
        "codecs",
        "pathlib",
        "urllib.parse",
        "shutil",
        "tempfile",
        "os",
        "sys",
        "hashlib",
        "uuid",
        "glob",
        "fnmatch",
        "traceback",
        "weakref",
        "queue",
        "dataclasses_json",
        "packaging",
        "tqdm",
        "torch",
        "numpy",
        "transformers",
        "tokenizers",
        "sentencepiece",
        "safetensors",
        "einops",
        "opt_einsum",
        "PIL",
        "torchvision",
        "torchaudio",
        "scipy",
        "accelerate",
        "flash_attn",
        "xformers",
        "triton",
        "timm",
        "huggingface_hub",
        "_mock",
        "torch_package_importer",
    ]
)
#: modules whose import alone is a finding (processes, network, import machinery,
#: deserialisers, native code, interpreter internals) -> why
DANGEROUS_MODULES = {
    **dict.fromkeys(
        ["subprocess", "_posixsubprocess", "pty", "pexpect", "multiprocessing", "posix", "nt", "asyncio.subprocess"],
        "runs processes",
    ),
    **dict.fromkeys(
        [
            "socket",
            "ssl",
            "urllib.request",
            "urllib2",
            "urllib3",
            "http",
            "httplib",
            "requests",
            "httpx",
            "aiohttp",
            "ftplib",
            "smtplib",
            "telnetlib",
            "paramiko",
            "webbrowser",
            "xmlrpc",
        ],
        "reaches the network",
    ),
    **dict.fromkeys(
        ["importlib", "imp", "zipimport", "pkgutil", "runpy", "code", "codeop", "builtins", "__builtin__"], "imports or runs code"
    ),
    **dict.fromkeys(
        ["pickle", "_pickle", "cPickle", "marshal", "dill", "cloudpickle", "shelve", "joblib"], "deserialises (runs) pickles"
    ),
    **dict.fromkeys(["ctypes", "cffi", "_ctypes"], "calls native code"),
    **dict.fromkeys(["gc", "ptrace", "sysconfig", "signal", "atexit"], "reaches the interpreter's internals or exit hooks"),
}
#: builtins that run code, import or reach the interpreter's internals
DANGEROUS_BUILTINS = frozenset(
    ["exec", "eval", "compile", "__import__", "breakpoint", "execfile", "reload", "__builtins__", "__loader__", "__spec__"]
)
#: attribute names that reach a module or a process from any object (``torch.serialization.os``)
DANGEROUS_ATTRS = frozenset(
    [
        "os",
        "sys",
        "subprocess",
        "builtins",
        "importlib",
        "ctypes",
        "pickle",
        "marshal",
        "shutil",
        "socket",
        "runpy",
        "pty",
        "system",
        "popen",
        "spawnv",
        "spawnve",
        "spawnl",
        "execv",
        "execve",
        "execl",
        "execvp",
        "fork",
        "forkpty",
        "posix_spawn",
        "load_library",
        "cpp_extension",
    ]
)
#: dunder attributes that escape to globals, builtins or code objects
ESCAPE_DUNDERS = frozenset(
    ["__globals__", "__builtins__", "__subclasses__", "__code__", "__import__", "__loader__", "__closure__"]
)
#: torch functions that load code, pickles, native libraries or files
RISKY_TORCH = (
    "torch.load",
    "torch.save",
    "torch.from_file",
    "torch.jit",
    "torch.hub",
    "torch.package",
    "torch.utils.cpp_extension",
    "torch.ops.load_library",
    "torch.classes.load_library",
    "torch._C._load_for_mobile",
    "torch._C.import_ir_module",
    "torch.compiler.load_cache_artifacts",
    "torch._inductor.codecache",
    "torch._inductor.cpp_builder",
    "torch._inductor.package",
    "torch._inductor.aoti_load_package",
    "torch.export.load",
)

_PROCESS = "runs a process or a shell command"
_FILES = "deletes, moves or changes files"
#: uses (dotted, after resolving imports and aliases) -> (severity, why); a prefix matches
#: its sub-names (``os.exec`` covers ``os.execv`` ...: :func:`_rule`)
_CALLS: dict[str, tuple[str, str]] = {
    **{
        f"os.{n}": ("critical", _PROCESS)
        for n in ["system", "popen", "exec", "spawn", "fork", "posix_spawn", "kill", "killpg", "startfile"]
    },
    **{
        f"os.{n}": ("critical", _FILES)
        for n in ["remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace", "chmod", "chown"]
    },
    **{
        f"os.{n}": ("critical", _FILES)
        for n in ["symlink", "link", "truncate", "open", "write", "dup2", "setuid", "setgid", "chroot"]
    },
    **{f"os.{n}": ("high", "changes the process environment") for n in ["putenv", "unsetenv", "chdir", "umask"]},
    **{f"shutil.{n}": ("critical", _FILES) for n in ["rmtree", "move", "copy", "chown", "unpack_archive", "make_archive"]},
    "tempfile": ("medium", "creates temporary files"),
    "sys.modules": ("critical", "reaches the import system's module table"),
    "sys.meta_path": ("critical", "hooks the import system"),
    "sys.path_hooks": ("critical", "hooks the import system"),
    "sys._getframe": ("critical", "reaches callers' frames and globals"),
    "sys.settrace": ("critical", "hooks every call"),
    "sys.setprofile": ("critical", "hooks every call"),
    "sys.addaudithook": ("critical", "hooks the interpreter"),
    "sys.path.insert": ("high", "changes where imports are found"),
    "sys.path.append": ("high", "changes where imports are found"),
    "sys.exit": ("medium", "ends the process"),
    "types.CodeType": ("critical", "builds code objects"),
    "operator.attrgetter": ("high", "looks attributes up by strings (hides what is reached)"),
    "operator.methodcaller": ("high", "calls methods named by strings (hides what is called)"),
    "types.FunctionType": ("critical", "builds functions from code objects"),
    "numpy.ctypeslib": ("critical", "calls native code"),
    "numpy.testing._private.utils.runstring": ("critical", "runs code"),
    "transformers.dynamic_module_utils": ("critical", "loads (and runs) more remote code"),
    "torch.load": ("medium", "loads a pickle (weights_only=True unless told otherwise)"),
    "torch.save": ("medium", "writes a file"),
    "torch.jit.load": ("high", "loads TorchScript (its own code and pickles)"),
    **{n: ("critical", "loads code, pickles or native libraries") for n in RISKY_TORCH[3:] if n != "torch.jit"},
}
#: method names that write or delete files on any object (``pathlib.Path`` ...)
_FILE_METHODS = frozenset(["write_text", "write_bytes", "symlink_to", "hardlink_to", "unlink", "rmdir", "rmtree"])
_OPENERS = frozenset({"builtins.open", "io.open", "codecs.open", "os.fdopen"})
#: builtins that look names up by a value (judged at their calls; passed as values they are a finding)
_REFLECTION = frozenset(["getattr", "setattr", "delattr", "vars", "globals", "locals"])


class SourceError(Exception):
    """A source that cannot be analysed (``kind``: ``unanalysable`` or ``limit``)."""

    def __init__(self, kind: str, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.kind, self.message, self.line = kind, message, line


@dataclass(frozen=True)
class SourceProblem:
    """One use outside model code: ``severity`` (or ``unanalysable``/``limit``), ``line``,
    ``call`` (what the source does, e.g. ``os.system(...)``), ``why`` and ``at_import``
    (module-level code, which runs when the module is imported)."""

    severity: str
    line: int | None
    call: str
    why: str
    at_import: bool = True

    def text(self) -> str:
        where = "at import" if self.at_import else "in a function the loader or the model may call"
        return f"line {self.line}: {self.call}: {self.why} ({where})" if self.line else f"{self.call}: {self.why}"


@dataclass
class SourceReport:
    """What :func:`analyse` found: problems, every import, and the relative imports (``level``,
    module) the module makes (loaders follow them to sibling files)."""

    problems: list[SourceProblem] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)
    relative: list[tuple[int, str]] = field(default_factory=list)
    lines: int = 0

    @property
    def worst(self) -> str | None:
        order = ("unanalysable", "limit", "critical", "high", "medium", "low", "info")
        sev = [p.severity for p in self.problems]
        return next((s for s in order if s in sev), None)


def parse(source: bytes | str, name: str = "<source>", *, max_bytes: int = MAX_SOURCE_BYTES) -> ast.Module:
    """``ast.parse`` of ``source`` within the limits; :class:`SourceError` when it does not
    parse (Python would not run it either, but it was not analysed) or is too large."""
    if len(source) > max_bytes:
        raise SourceError("limit", f"source of {len(source)} bytes exceeds the {max_bytes}-byte limit; not analysed")
    try:
        with warnings.catch_warnings():  # SyntaxWarnings of odd sources are not for the user
            warnings.simplefilter("ignore")
            return ast.parse(source, filename=name)
    except (SyntaxError, ValueError) as e:
        raise SourceError(
            "unanalysable",
            f"source does not parse ({type(e).__name__}: {str(e)[:120]}); not analysed",
            getattr(e, "lineno", None),
        ) from None
    except (RecursionError, MemoryError) as e:
        raise SourceError("limit", f"source nests too deeply to parse ({type(e).__name__})") from None


def dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ``["a", "b", "c"]``; None for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


def _top_in(mod: str, table: frozenset[str] | dict[str, str]) -> str | None:
    """The entry of ``table`` that ``mod`` is or is inside of (``urllib.request`` -> ``urllib``)."""
    parts = mod.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in table:
            return ".".join(parts[:i])
    return None


def _rule(full: str) -> tuple[str, str] | None:
    """The rule of :data:`_CALLS` for a dotted use (itself or a prefix of it; ``os.exec``
    covers ``os.execv``)."""
    parts = full.split(".")
    for i in range(len(parts), 1, -1):
        r = _CALLS.get(".".join(parts[:i]))
        if r is not None:
            return r
    root, _, last = full.rpartition(".")
    if root == "os":
        for k, r in _CALLS.items():
            if k.startswith("os.") and last.startswith(k[3:]) and k[3:] in ("exec", "spawn", "fork", "posix_spawn", "kill"):
                return r
    return None


def _fold(node: ast.AST | None, depth: int = 0) -> str | None:
    """A string the expression always evaluates to (literals, ``+``, f-strings of literals,
    ``"".join([...])`` of literals), else None."""
    if node is None or depth > 50:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _fold(node.left, depth + 1), _fold(node.right, depth + 1)
        return a + b if a is not None and b is not None else None
    if isinstance(node, ast.JoinedStr):
        out = []
        for v in node.values:
            s = _fold(v.value if isinstance(v, ast.FormattedValue) else v, depth + 1)
            if s is None:
                return None
            out.append(s)
        return "".join(out)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and len(node.args) == 1
        and isinstance(node.args[0], (ast.List, ast.Tuple))
    ):
        sep = _fold(node.func.value, depth + 1)
        items = [_fold(e, depth + 1) for e in node.args[0].elts]
        if sep is not None and all(i is not None for i in items):
            return sep.join(i for i in items if i is not None)
    return None


class _Analyser:
    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.alias: dict[str, str] = {}  # local name -> dotted origin (modules and their attributes)
        self.modules: set[str] = set()  # local names bound to modules
        self.rep = SourceReport()
        self._seen: set[tuple[int | None, str]] = set()

    def add(self, sev: str, line: int | None, call: str, why: str, at_import: bool) -> None:
        if (line, call) in self._seen or len(self.rep.problems) > _MAX_PROBLEMS:
            return
        self._seen.add((line, call))
        if len(self.rep.problems) == _MAX_PROBLEMS:
            self.rep.problems.append(SourceProblem("high", None, "more problems", f"more than {_MAX_PROBLEMS}; not listed"))
            return
        self.rep.problems.append(SourceProblem(sev, line, call, why, at_import))

    # -- names ---------------------------------------------------------------------------
    def bindings(self, nodes: list[ast.AST]) -> None:
        for n in nodes:
            if isinstance(n, ast.Import):
                for a in n.names:
                    local = a.asname or a.name.split(".", 1)[0]
                    self.alias[local] = a.name if a.asname else local
                    self.modules.add(local)
            elif isinstance(n, ast.ImportFrom) and not n.level and n.module:
                for a in n.names:
                    if a.name != "*":
                        self.alias[a.asname or a.name] = f"{n.module}.{a.name}"
        for _ in range(3):  # ``o = os``, ``s = os.system``, ``imp = __import__`` (a few hops)
            for n in nodes:
                if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                    full = self.resolve(n.value)
                    if full is not None and n.targets[0].id not in self.alias:
                        self.alias[n.targets[0].id] = full
                        if isinstance(n.value, ast.Name) and n.value.id in self.modules:
                            self.modules.add(n.targets[0].id)

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted origin of a name/attribute chain whose root is an import or a
        dangerous builtin; None for local values."""
        parts = dotted(node)
        if parts is None:
            return None
        root = self.alias.get(parts[0])
        if root is None:
            if parts[0] in DANGEROUS_BUILTINS or parts[0] in ("open", "getattr", "setattr", "globals", "vars", "locals"):
                root = "builtins." + parts[0]
            else:
                return None
        return ".".join([root, *parts[1:]])

    # -- walk ----------------------------------------------------------------------------
    def run(self) -> SourceReport:
        nodes: list[ast.AST] = []
        stack: list[tuple[ast.AST, int, bool]] = [(self.tree, 0, True)]
        ctx: list[tuple[ast.AST, bool]] = []
        while stack:
            node, depth, at_import = stack.pop()
            if depth > MAX_DEPTH:
                raise SourceError(
                    "limit", f"source nests more than {MAX_DEPTH} levels deep; not analysed", getattr(node, "lineno", None)
                )
            nodes.append(node)
            ctx.append((node, at_import))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                # decorators, defaults and annotations run where the def is; the body later
                body = node.body if isinstance(node.body, list) else [node.body]
                for c in ast.iter_child_nodes(node):
                    stack.append((c, depth + 1, at_import and not any(c is b for b in body)))
            else:
                for c in ast.iter_child_nodes(node):
                    stack.append((c, depth + 1, at_import))
        self.rep.lines = max((getattr(n, "end_lineno", 0) or 0) for n in nodes) if nodes else 0
        self.bindings(nodes)
        inner = {id(n.value) for n in nodes if isinstance(n, ast.Attribute)}
        self.called = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
        for node, at_import in ctx:
            self.visit(node, at_import, id(node) in inner)
        return self.rep

    def visit(self, n: ast.AST, at_import: bool, inner: bool) -> None:
        line = getattr(n, "lineno", None)
        if isinstance(n, ast.Import):
            for a in n.names:
                self.module_use(a.name, f"import {a.name}", line, at_import)
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                self.rep.relative.append((n.level, n.module or ""))
                if n.module is None:  # ``from . import x``: x is a sibling module
                    self.rep.relative.extend((n.level, a.name) for a in n.names if a.name != "*")
                return
            mod = n.module or ""
            for a in n.names:
                self.module_use(mod, f"from {mod} import {a.name}", line, at_import)
                if a.name != "*":
                    self.use(f"{mod}.{a.name}", f"from {mod} import {a.name}", line, at_import, binding=True)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            if n.id in DANGEROUS_BUILTINS and n.id not in self.alias:
                self.add("critical", line, n.id, "a builtin that runs code, imports or reaches the interpreter", at_import)
            elif n.id in self.alias and not inner:
                self.use(self.alias[n.id], n.id, line, at_import)
            elif n.id in _REFLECTION and id(n) not in self.called and n.id not in self.alias:
                self.add("high", line, n.id, "a reflection builtin passed as a value (its calls cannot be judged)", at_import)
        elif isinstance(n, ast.Attribute):
            if n.attr in ESCAPE_DUNDERS:
                self.add("critical", line, f".{n.attr}", "reaches globals, builtins or code objects", at_import)
            if not inner:
                full = self.resolve(n)
                if full is not None:
                    self.use(full, ".".join(dotted(n) or [n.attr]), line, at_import, store=not isinstance(n.ctx, ast.Load))
                else:
                    parts = dotted(n) or [n.attr]
                    bad = [p for p in parts[1:] if p in DANGEROUS_ATTRS]
                    if bad:
                        self.add("critical", line, ".".join(parts), f"reaches {bad[0]!r} through an attribute", at_import)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in ESCAPE_DUNDERS:
            self.add("critical", line, repr(n.value), "the name of a builtin or dunder that escapes to code", at_import)
        elif isinstance(n, ast.Call):
            self.call(n, line, at_import)
        elif isinstance(n, ast.Subscript):
            self.lookup(n, line, at_import)

    def module_use(self, mod: str, what: str, line: int | None, at_import: bool) -> None:
        self.rep.imports.append(mod)
        bad = _top_in(mod, DANGEROUS_MODULES)
        if bad is not None:
            self.add("critical", line, what, f"{bad}: {DANGEROUS_MODULES[bad]}", at_import)
        elif _top_in(mod, SAFE_MODULES) is None:
            self.add("medium", line, what, "a module outside the allowlist of model code", at_import)

    def use(self, full: str, what: str, line: int | None, at_import: bool, store: bool = False, binding: bool = False) -> None:
        root = full.split(".", 1)[0]
        if root == "builtins" and full.count(".") == 1 and full[9:] in DANGEROUS_BUILTINS:
            self.add("critical", line, what, "a builtin that runs code, imports or reaches the interpreter", at_import)
            return
        bad = _top_in(full, DANGEROUS_MODULES)
        if bad is not None:
            self.add("critical", line, what, f"{bad}: {DANGEROUS_MODULES[bad]}", at_import)
            return
        r = _rule(full + (".__setitem__" if store else ""))
        if r is None and store and root in ("os", "sys", "builtins", "torch"):
            r = ("critical", "replaces an attribute of a module for the whole process")
        if r is not None:
            sev, why = r
            if why == _FILES and binding:
                return  # ``from shutil import copyfile``: its calls are judged
            if why == _FILES and not at_import:
                sev = "medium"
            self.add(sev, line, what, why, at_import)
            return
        parts = full.split(".")
        if root in ("os", "sys", "builtins") and any(p.startswith("__") and p.endswith("__") for p in parts[1:]):
            self.add("critical", line, what, f"reaches the internals of module {root}", at_import)
            return
        hops = [p for p in parts[1:] if p in DANGEROUS_ATTRS]
        if hops and root not in ("os", "sys"):
            self.add("critical", line, what, f"reaches {hops[0]!r} through an attribute of {root}", at_import)

    def call(self, n: ast.Call, line: int | None, at_import: bool) -> None:
        full = self.resolve(n.func)
        if full in _OPENERS:
            mode = n.args[1] if len(n.args) > 1 else next((k.value for k in n.keywords if k.arg == "mode"), None)
            m = "r" if mode is None else _fold(mode)
            if m is None:
                self.add(
                    "high",
                    line,
                    f"{full[9:] if full.startswith('builtins.') else full}(..., mode=<computed>)",
                    "opens a file in a mode computed at run time",
                    at_import,
                )
            elif set(m) & set("wax+"):
                self.add("critical" if at_import else "medium", line, f"open(..., {m!r})", "writes a file", at_import)
        elif full in ("builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.hasattr"):
            self.getattr_call(n, full[9:], line, at_import)
        elif full in ("builtins.globals", "builtins.vars", "builtins.locals") and not n.args:
            pass  # ``globals()[k]`` is judged by its key (escape dunders, builtins) below
        elif full == "torch.load":
            wo = next((k.value for k in n.keywords if k.arg == "weights_only"), None)
            if isinstance(wo, ast.Constant) and wo.value is False:
                self.add("critical", line, "torch.load(..., weights_only=False)", "unpickles a file (runs code)", at_import)
        elif full == "numpy.load":
            ap = next((k.value for k in n.keywords if k.arg == "allow_pickle"), None)
            if not (isinstance(ap, ast.Constant) and ap.value is False) and ap is not None:
                self.add("critical", line, "numpy.load(..., allow_pickle=...)", "unpickles a file (runs code)", at_import)
        elif isinstance(n.func, ast.Attribute) and n.func.attr in _FILE_METHODS and full is None:
            self.add("critical" if at_import else "medium", line, f".{n.func.attr}(...)", "writes or deletes a file", at_import)

    def lookup(self, n: ast.Subscript, line: int | None, at_import: bool) -> None:
        """``globals()[k]``, ``vars(m)[k]``, ``__dict__[k]``: judged by the key."""
        v = n.value
        is_ns = (
            isinstance(v, ast.Call) and self.resolve(v.func) in ("builtins.globals", "builtins.vars", "builtins.locals")
        ) or (isinstance(v, ast.Attribute) and v.attr == "__dict__" and self.resolve(v.value) is not None)
        if not is_ns:
            return
        key = _fold(n.slice)
        if key is None:
            self.add("high", line, "globals()[<computed>]", "looks a name up by a key computed at run time", at_import)
        elif key in DANGEROUS_BUILTINS or key in DANGEROUS_ATTRS:
            self.add("critical", line, f"globals()[{key!r}]", f"reaches {key!r} by name", at_import)

    def getattr_call(self, n: ast.Call, fn: str, line: int | None, at_import: bool) -> None:
        if len(n.args) < 2:
            return
        obj, key = n.args[0], n.args[1]
        name = _fold(key)
        on_module = (isinstance(obj, ast.Name) and obj.id in self.modules) or (
            isinstance(obj, ast.Call) and self.resolve(obj.func) in ("builtins.__import__", "importlib.import_module")
        )
        base = self.resolve(obj) if isinstance(obj, (ast.Name, ast.Attribute)) else None
        if name is None:
            risky = base is not None and (
                base.split(".", 1)[0] in ("os", "sys", "builtins") or _top_in(base, DANGEROUS_MODULES) is not None
            )
            if base is not None and not risky and _top_in(base, SAFE_MODULES) is not None:
                self.add("medium", line, f"{fn}({base}, <computed name>)", "a module attribute chosen at run time", at_import)
            elif on_module or risky:
                self.add(
                    "critical",
                    line,
                    f"{fn}(<module>, <computed name>)",
                    "reaches a module attribute by a name computed at run time",
                    at_import,
                )
            return
        if fn in ("setattr", "delattr") and (on_module or base is not None):
            self.add(
                "critical",
                line,
                f"{fn}({base or '<module>'}, {name!r})",
                "replaces an attribute of a module for the whole process",
                at_import,
            )
            return
        if base is not None:
            self.use(f"{base}.{name}", f"{fn}({base}, {name!r})", line, at_import)
        if name in DANGEROUS_ATTRS or name in ESCAPE_DUNDERS or name in DANGEROUS_BUILTINS:
            self.add("critical", line, f"{fn}(..., {name!r})", f"reaches {name!r} by name", at_import)


def analyse(source: bytes | str, name: str = "<source>") -> SourceReport:
    """Parse ``source`` (never run) and list what it does outside model code.

    A source that cannot be parsed or exceeds the limits comes back with one problem of
    severity ``unanalysable`` or ``limit`` (never an empty, clean report).
    """
    try:
        tree = parse(source, name)
        return _Analyser(tree).run()
    except SourceError as e:
        return SourceReport([SourceProblem(e.kind, e.line, "source", e.message)])
    except RecursionError:
        return SourceReport([SourceProblem("limit", None, "source", "source nests too deeply to analyse")])
