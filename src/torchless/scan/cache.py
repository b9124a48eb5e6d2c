"""TorchInductor cache entries (``TORCHINDUCTOR_CACHE_DIR``), judged by what torch loads.

On a cache hit ``torch.compile`` does not recompile; it loads (torch 2.13,
``torch/_inductor/codecache.py``, ``output_code.py``,
``torch/_functorch/_aot_autograd/autograd_cache.py``):

==========================================  ===========================================
file                                        what torch does with it
==========================================  ===========================================
``fxgraph/<xx>/f<key>/<hash>``              ``pickle.loads``: a ``CompiledFxGraph``; its
                                            ``source_code`` is written to
                                            ``<xx>/c<key>.py`` **unless that file exists**,
                                            and the file is then executed as a module
``aotautograd/<key>/<hash>``                ``pickle.loads``: an ``AOTAutogradResult``
                                            naming the FX graph entries it uses
``<xx>/c<key>.py``                          executed (``PyCodeCache.load_by_key_path``):
                                            the generated "output code", or a Triton
                                            kernel module on GPUs
``<xx>/c<key>.so``, ``.main.so``            ``dlopen()`` ed by the output code
                                            (``async_compile.cpp_pybinding``) when its
                                            name matches the hash of the C++ source the
                                            output code embeds
``<xx>/c<key>.cpp``                         compiled (then loaded) when its ``.so`` is
                                            missing: torch keeps an existing ``.cpp``
==========================================  ===========================================

So the scan of a cache file:

* runs the pickles symbolically with an allowlist of the record classes torch writes
  there (:data:`CACHE_SAFE`, each with a reason); anything else keeps its usual verdict;
* parses every generated Python source (the ``.py`` files and each ``source_code`` in a
  ``CompiledFxGraph``) with the scanner's one source parser (:func:`torchless.scan.source.parse`,
  the parser of torch.package and remote-code sources too), never executing it, and flags imports and names
  inductor's code generator does not emit (:data:`ALLOWED_IMPORTS`,
  :data:`SAFE_BUILTINS`): ``os``/``subprocess`` calls, ``exec``, ``__import__``,
  ``open``, dunder attribute walks (``torch.__builtins__``), modules reached through
  attributes (``torch.os.system``), risky torch functions (``torch.load``,
  ``torch.ops.load_library`` ...);
* reads C++ sources (files, and those embedded in output code) for ``#include`` lines
  other than inductor's and for calls that run processes, open files or load libraries;
* reports each ``.so`` as ``native-code``: ``info`` (not counted) when it sits beside the
  ``.cpp`` inductor compiled it from, ``high`` otherwise. Machine code is not analysed:
  a cache whose ``.so`` was replaced is not detected (see docs/scan.md, Limitations).

Limits: :data:`MAX_SOURCE_BYTES` per source; deeper nesting than CPython's parser
accepts is ``unanalysable``.
"""

from __future__ import annotations

import ast
import os
import re
from typing import TYPE_CHECKING, Any

from ..core.errors import TorchlessError
from ..formats.inductor_cache.spec import loaded_kind as cache_kind
from ..formats.joblib_spec import compression_of
from ..formats.pt.spec import ZIP_MAGIC
from ..io.source import ByteSource
from .policy import Verdict
from .source import DANGEROUS_ATTRS, MAX_SOURCE_BYTES, RISKY_TORCH, SourceError, dotted, parse

if TYPE_CHECKING:
    from ..io.store import Store

__all__ = [
    "cache_kind",
    "scan_cache_file",
    "check_python",
    "check_cpp",
    "CACHE_SAFE",
    "ALLOWED_IMPORTS",
    "SAFE_BUILTINS",
    "MAX_SOURCE_BYTES",
]

MAX_PROBLEMS = 200  # problems listed per source
_LOADER = "torch.compile (inductor cache)"

#: globals torch's cache pickles name, safe to rebuild (NEWOBJ/REDUCE + BUILD of plain
#: records: dataclasses, enums, holders); qualname -> reason
CACHE_SAFE: dict[str, str] = {
    "torch._inductor.output_code.CompiledFxGraph": (
        "the FX graph cache record (a dataclass: fields only); its source_code is analysed as generated Python"
    ),
    "torch._inductor.metrics.CachedMetricsDeltas": "counters recorded with the entry (dataclass of numbers)",
    "torch._inductor.utils.BoxedBool": "a mutable bool box (dataclass)",
    "torch._inductor.cudagraph_utils.BoxedDeviceIndex": "a mutable device-index box",
    "torch._inductor.triton_bundler.TritonBundle": (
        "lists of Triton kernel artefacts (dataclass; their bytes are written to the Triton cache)"
    ),
    "torch._inductor.triton_bundler.TritonKernelArtifacts": "one kernel's artefact list (dataclass)",
    "torch._inductor.triton_bundler.TritonKernelArtifact": "one artefact: file name and bytes (dataclass)",
    "torch._inductor.decomposition.select_decomp_table": "returns inductor's decomposition table; takes no argument",
    "torch.utils._ordered_set.OrderedSet": "an insertion-ordered set built from its argument",
    "torch._inductor.output_code.CompiledFxGraphConstantsWithGm": "constants record (dataclass)",
    "torch._functorch._aot_autograd.aot_autograd_result.AOTAutogradResult": (
        "the AOTAutograd cache record (dataclass: fields only)"
    ),
    "torch._functorch._aot_autograd.aot_autograd_result.CompiledForward": (
        "names the FX graph cache key of the forward graph (dataclass)"
    ),
    "torch._functorch._aot_autograd.aot_autograd_result.CompiledBackward": (
        "names the FX graph cache key of the backward graph (dataclass)"
    ),
    "torch._functorch._aot_autograd.aot_autograd_result.GenericAOTAutogradResult": "the AOTAutograd cache record (dataclass)",
    "torch._functorch._aot_autograd.aot_autograd_result.BundledAOTAutogradResult": (
        "the AOTAutograd cache record with its graphs (dataclass)"
    ),
    "torch._functorch._aot_autograd.schemas.ViewAndMutationMeta": "input/output aliasing metadata (dataclass)",
    "torch._functorch._aot_autograd.schemas.InputAliasInfo": "input aliasing metadata (dataclass)",
    "torch._functorch._aot_autograd.schemas.OutputAliasInfo": "output aliasing metadata (dataclass)",
    "torch._functorch._aot_autograd.schemas.MutationType": "an enum",
    "torch._functorch._aot_autograd.schemas.OutputType": "an enum",
    "torch._functorch._aot_autograd.schemas.PlainTensorMeta": "tensor metadata (dataclass)",
    "torch._functorch._aot_autograd.schemas.SubclassCreationMeta": "tensor-subclass metadata (dataclass)",
    "torch._functorch._aot_autograd.schemas.MemoryFormatMeta": "memory-format metadata (dataclass)",
    "torch._functorch._aot_autograd.schemas.CacheableAOTConfig": "AOT config fields (dataclass)",
    "torch._functorch._aot_autograd.runtime_wrappers.AOTDedupeWrapper": (
        "runtime wrapper record: argument de-duplication indices (dataclass)"
    ),
    "torch._functorch._aot_autograd.runtime_wrappers.AOTSyntheticBaseWrapper": (
        "runtime wrapper record: synthetic-base indices (dataclass)"
    ),
    "torch._functorch._aot_autograd.runtime_wrappers.AOTDispatchSubclassWrapper": "runtime wrapper record (dataclass)",
    "torch._functorch._aot_autograd.runtime_wrappers.FakifiedOutWrapper": "runtime wrapper record (dataclass)",
    "torch._functorch._aot_autograd.runtime_wrappers.FunctionalizedRngRuntimeWrapper": "runtime wrapper record (dataclass)",
    "torch._functorch._aot_autograd.runtime_wrappers.RuntimeWrapper": "runtime wrapper record (dataclass)",
    "torch._dynamo.source.LocalSource": "a guard source description (frozen dataclass)",
    "torch._dynamo.source.AttrSource": "a guard source description (frozen dataclass)",
    "torch._dynamo.source.GetItemSource": "a guard source description (frozen dataclass)",
    "torch._dynamo.source.DictGetItemSource": "a guard source description (frozen dataclass)",
    "torch._dynamo.source.GlobalSource": "a guard source description (frozen dataclass)",
    "torch._dynamo.source.ConstantSource": "a guard source description (frozen dataclass)",
    "torch._dynamo.source.UnspecializedNNModuleSource": "a guard source description (frozen dataclass)",
    "torch._dynamo.source.UnspecializedBuiltinNNModuleSource": "a guard source description (frozen dataclass)",
    "torch._dynamo.source.UnspecializedParamBufferSource": "a guard source description (frozen dataclass)",
    "torch._dynamo.source.NNModuleSource": "a guard source description (frozen dataclass)",
    "torch._dynamo.source.ParamBufferSource": "a guard source description (frozen dataclass)",
    # dynamo/code_state_<key>.pkl (profile-guided dynamic shapes, torch/_dynamo/pgo.py)
    "torch._dynamo.pgo.CodeId": "PGO: a code object's file, line and name (frozen dataclass)",
    "torch._dynamo.pgo.CodeState": "PGO: per-frame size records (dataclass)",
    "torch._dynamo.pgo.FrameStateSizeEntry": "PGO: observed sizes and strides (dataclass)",
    "torch._dynamo.pgo.InferStride": "PGO: a stride marker (frozen dataclass)",
    "torch._dynamo.pgo.AutoUnset": "PGO: an enum",
    "torch._dynamo.pgo.AutoDynamic": "PGO: an enum",
    "collections.defaultdict": "PGO: the code-state table; built empty (its factory is a BUILD-free argument checked on its own)",
}

#: globals safe only as values (referenced, never called by the pickle)
CACHE_REFERENCED: dict[str, str] = {
    "torch._subclasses.functional_tensor.FunctionalTensor": "a tensor-subclass type recorded as metadata",
}

#: modules (and the names taken from them) inductor's generated Python imports
#: (``codegen/wrapper.py`` header, ``codegen/triton.py`` ``gen_common_triton_imports``);
#: None: any name from that module
ALLOWED_IMPORTS: dict[str, frozenset[str] | None] = {
    "torch": None,
    "math": None,
    "cmath": None,
    "random": None,
    "os": frozenset(),  # imported by the header, never used by generated code
    "tempfile": frozenset(),  # idem
    "ctypes": frozenset({"c_void_p", "c_long", "c_int"}),
    "triton": None,
    "triton.language": None,
    "triton.language.extra.tlx": None,
    "triton.compiler.compiler": frozenset({"AttrsDescriptor"}),
    "torch.cuda": frozenset({"nvtx"}),
    "torch.profiler": frozenset({"record_function"}),
    "torch._dynamo.testing": frozenset({"rand_strided"}),
    "torch._C._dynamo.guards": None,
    "torch._dynamo.graph_bytecode_inputs": None,
    "torch._C": frozenset({"_cuda_getCurrentRawStream", "_xpu_getCurrentRawStream", "_mtia_getCurrentRawStream"}),
    "triton.profiler": None,
    "triton.profiler.language": None,
    "triton.profiler.hooks": frozenset({"HookManager"}),
    "atexit": frozenset(),
}
#: module prefixes any name may be imported from (inductor's runtime helpers)
ALLOWED_IMPORT_PREFIXES = ("torch._inductor.", "torch._inductor")
#: modules whose attributes generated code never uses
_NO_ATTRS = {"os", "tempfile", "ctypes"}

#: ``async_compile`` methods that take kernel source -> (Python (imported) or native
#: (compiled), position of the source argument), as ``torch/_inductor/async_compile.py``
_SOURCE_METHODS = {
    "triton": ("python", 1),
    "cutedsl": ("python", 1),
    "pallas": ("python", 1),
    "cpp": ("c++", 0),
    "cpp_pybinding": ("c++", 1),
    "cuda": ("c++", 0),
    "xpu": ("c++", 0),
    "rocm": ("c++", 0),
    "cutlass": ("c++", 1),
    "halide": ("c++", 1),
    "metal": ("c++", 1),
}

#: builtins inductor's generated code uses (anything else that is not defined in the file
#: is a finding)
SAFE_BUILTINS = frozenset(
    [
        "len",
        "range",
        "int",
        "float",
        "bool",
        "str",
        "tuple",
        "list",
        "dict",
        "set",
        "frozenset",
        "min",
        "max",
        "abs",
        "sum",
        "any",
        "all",
        "enumerate",
        "zip",
        "isinstance",
        "issubclass",
        "print",
        "globals",
        "super",
        "object",
        "type",
        "slice",
        "round",
        "divmod",
        "pow",
        "reversed",
        "sorted",
        "iter",
        "next",
        "map",
        "filter",
        "hasattr",
        "repr",
        "hash",
        "id",
        "bytes",
        "bytearray",
        "complex",
        "callable",
        "property",
        "staticmethod",
        "classmethod",
        "NotImplemented",
        "Ellipsis",
        "None",
        "True",
        "False",
        "Exception",
        "RuntimeError",
        "ValueError",
        "TypeError",
        "AssertionError",
        "KeyError",
        "IndexError",
        "NotImplementedError",
        "AttributeError",
        "StopIteration",
        "ZeroDivisionError",
        "OverflowError",
        "ImportError",
        "__name__",
        "__file__",
        "locals",
    ]
)
#: builtins that run code, import, or open files
_DANGEROUS_BUILTINS = frozenset(
    [
        "exec",
        "eval",
        "compile",
        "__import__",
        "open",
        "breakpoint",
        "input",
        "getattr",
        "setattr",
        "delattr",
        "vars",
        "memoryview",
        "exit",
        "quit",
        "help",
        "__builtins__",
        "__loader__",
        "__spec__",
    ]
)
#: attribute names that reach modules or interpreter internals from any object
_DANGEROUS_ATTRS = DANGEROUS_ATTRS | {"code", "codeop", "hub"}  # inductor never names these either
_RISKY_TORCH = RISKY_TORCH
_DANGEROUS_STRINGS = _DANGEROUS_ATTRS | frozenset(
    [
        "exec",
        "eval",
        "compile",
        "__import__",
        "open",
        "getattr",
        "setattr",
        "delattr",
        "__builtins__",
        "__loader__",
        "__globals__",
        "__subclasses__",
        "__code__",
        "__dict__",
        "__class__",
        "__bases__",
        "__mro__",
        "__reduce__",
        "__reduce_ex__",
        "__getattribute__",
    ]
)

#: C++: includes inductor emits, and calls that reach processes, files or libraries
_CPP_INCLUDE_OK = re.compile(
    r'^\s*#\s*include\s*(?:"[^"]*torch/_inductor/codegen/[\w./]+\.h"|<(?:ATen/|c10/|torch/csrc/inductor/)[\w./]+>|<(?:Python|immintrin|arm_neon|arm_sve|omp|sleef|cuda|mutex|sstream|stdexcept|cerrno|cmath|cstdint|cstdlib|cstddef|climits|cstring|algorithm|atomic|limits|array|vector|string|optional|tuple|utility|type_traits|functional|memory|iostream|unordered_map|map|set)(?:\.h)?>)'
)
_CPP_INCLUDE = re.compile(r"^\s*#\s*include\b.*$", re.M)
_CPP_RISKY = re.compile(
    r"\b(system|popen|execl|execlp|execle|execv|execvp|execve|fork|vfork|posix_spawn|dlopen|dlsym|fopen|freopen|open|openat|creat|socket|connect|unlink|rename|chmod|setenv|putenv|ptrace|syscall)\s*[(\[]|\b(asm|__asm__|__asm)\b|\b(constructor|destructor|init_priority)\b"
)


# -- Python ---------------------------------------------------------------------------


_dotted = dotted


def check_python(source: bytes | str, *, name: str = "<source>", _depth: int = 0) -> list[tuple[str, str, int | None]]:
    """What in a generated Python source inductor would not have emitted.

    Returns:
        ``(severity, message, line)`` per problem; ``("unanalysable", ...)`` when the
        source cannot be parsed or exceeds :data:`MAX_SOURCE_BYTES`.
    """
    try:  # one parser for every Python source the scanner reads (scan.source: bounded, never run)
        tree = parse(source, name)
    except SourceError as e:
        return [("unanalysable", f"generated {e.message}", e.line)]
    out: list[tuple[str, str, int | None]] = []
    defined: set[str] = set()
    imported_mod: dict[str, str] = {}  # local name -> module it is
    try:
        nodes = list(ast.walk(tree))
    except RecursionError:
        return [("unanalysable", "generated source nests too deeply to analyse", None)]
    # bindings and imports
    for n in nodes:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(n.name)
        elif isinstance(n, ast.arg):
            defined.add(n.arg)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            defined.add(n.id)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            defined.add(n.name)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            defined.update(n.names)
        elif isinstance(n, ast.Import):
            for a in n.names:
                ok = a.name in ALLOWED_IMPORTS or a.name.startswith(ALLOWED_IMPORT_PREFIXES)
                if not ok:
                    out.append(("critical", f"imports {a.name!r}, a module inductor's generated code never imports", n.lineno))
                local = a.asname or a.name.split(".", 1)[0]
                defined.add(local)
                imported_mod[local] = a.name if a.asname else a.name.split(".", 1)[0]
        elif isinstance(n, ast.ImportFrom):
            mod = "." * n.level + (n.module or "")
            allowed = ALLOWED_IMPORTS.get(mod, frozenset()) if not mod.startswith(ALLOWED_IMPORT_PREFIXES) else None
            known = mod in ALLOWED_IMPORTS or mod.startswith(ALLOWED_IMPORT_PREFIXES)
            for a in n.names:
                if not known or (allowed is not None and a.name not in allowed) or a.name == "*":
                    out.append(
                        ("critical", f"imports {a.name!r} from {mod!r}, which inductor's generated code never does", n.lineno)
                    )
                defined.add(a.asname or a.name)
                imported_mod[a.asname or a.name] = f"{mod}.{a.name}"
    # uses; dotted chains are checked once, at their outermost attribute (linear work)
    inner = {id(n.value) for n in nodes if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)}
    for n in nodes:
        if len(out) > MAX_PROBLEMS:
            out.append(("high", f"more than {MAX_PROBLEMS} problems; the rest are not listed", None))
            break
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            if n.id in _DANGEROUS_BUILTINS and n.id not in defined:
                out.append(
                    (
                        "critical",
                        f"uses the builtin {n.id!r} (runs code, imports or opens files): inductor never emits it",
                        n.lineno,
                    )
                )
            elif n.id not in defined and n.id not in SAFE_BUILTINS:
                out.append(
                    (
                        "high",
                        f"uses {n.id!r}, which is neither defined in the file nor a builtin inductor's generated code uses",
                        n.lineno,
                    )
                )
        elif isinstance(n, ast.Attribute):
            if n.attr.startswith("__") and n.attr.endswith("__") and n.attr not in ("__name__", "__init__"):
                out.append(
                    ("critical", f"reads the attribute {n.attr!r} (interpreter internals): inductor never emits it", n.lineno)
                )
            elif n.attr in _DANGEROUS_ATTRS:
                out.append(
                    (
                        "critical",
                        f"reads the attribute {n.attr!r} (a module or function that runs processes, imports or loads code)",
                        n.lineno,
                    )
                )
            parts = _dotted(n) if id(n) not in inner else None
            if parts is not None and isinstance(getattr(n, "ctx", None), ast.Load):
                root = imported_mod.get(parts[0], parts[0] if parts[0] not in defined else "")
                if root in _NO_ATTRS:
                    out.append(("critical", f"uses {'.'.join(parts)!r}: inductor imports {root!r} but never uses it", n.lineno))
                full = ".".join([root] + parts[1:]) if root else ""
                for r in _RISKY_TORCH:
                    if full == r or full.startswith(r + "."):
                        out.append(("critical", f"uses {full!r}, which loads code or files", n.lineno))
                        break
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in _DANGEROUS_STRINGS:
            out.append(
                (
                    "high",
                    f"string {n.value!r}: the name of a code-running builtin or module, as used by getattr/globals tricks",
                    getattr(n, "lineno", None),
                )
            )
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _SOURCE_METHODS:
            # sources the output code hands to async_compile: Python kernels are written
            # to the cache and imported, C++/CUDA ones compiled and loaded. Inductor
            # always passes a literal; a computed source cannot be analysed.
            lang, idx = _SOURCE_METHODS[n.func.attr]
            src_arg = (
                n.args[idx]
                if idx < len(n.args)
                else next((k.value for k in n.keywords if k.arg in ("source_code", "source")), None)
            )
            if src_arg is None:
                continue
            if not (isinstance(src_arg, ast.Constant) and isinstance(src_arg.value, str)):
                out.append(
                    (
                        "critical",
                        f"passes a computed kernel source to {n.func.attr}(): inductor passes a "
                        "string literal; what would be compiled or imported is not known",
                        n.lineno,
                    )
                )
            elif lang == "python":
                if _depth >= 2:
                    out.append(
                        ("unanalysable", f"Python source nested in {n.func.attr}() more than twice; not analysed", n.lineno)
                    )
                    continue
                for sev, msg, line in check_python(src_arg.value, name=f"{name} > {n.func.attr}()", _depth=_depth + 1):
                    out.append((sev, f"in the kernel source passed to {n.func.attr}() (its line {line}): {msg}", n.lineno))
            else:
                for sev, msg in check_cpp(src_arg.value):
                    out.append((sev, f"embedded C++ passed to {n.func.attr}(): {msg}", n.lineno))
    # one finding per (message, line)
    seen: set[tuple[str, int | None]] = set()
    uniq = []
    for sev, msg, line in out:
        if (msg, line) not in seen:
            seen.add((msg, line))
            uniq.append((sev, msg, line))
    return uniq


def check_cpp(text: str) -> list[tuple[str, str]]:
    """``#include`` lines inductor does not emit and calls that reach processes, files or
    libraries, in a C++ kernel source (inductor compiles it when its ``.so`` is missing)."""
    out: list[tuple[str, str]] = []
    if len(text) > MAX_SOURCE_BYTES:
        return [("unanalysable", f"C++ source of {len(text)} bytes exceeds the {MAX_SOURCE_BYTES}-byte limit; not analysed")]
    for m in _CPP_INCLUDE.finditer(text):
        if not _CPP_INCLUDE_OK.match(m.group(0)):
            out.append(("high", f"includes {m.group(0).strip()[:120]!r}, a header inductor's kernels do not include"))
    line = 1
    last = 0
    for m in _CPP_RISKY.finditer(text):
        line += text.count("\n", last, m.start())  # incremental: linear in the text
        last = m.start()
        if m.group(1):
            out.append(
                (
                    "critical",
                    f"calls {m.group(1)!r} (line {line}): processes, files or libraries, which inductor's kernels never touch",
                )
            )
        else:
            out.append(
                (
                    "critical",
                    f"uses {m.group(0)!r} (line {line}): inline assembly or code run at load "
                    "(static constructors), which inductor's kernels never contain",
                )
            )
        if len(out) > 50:
            break
    return out


# -- the scanner hook -----------------------------------------------------------------


def _report_python(scanner: Any, data: bytes | str, member: str | None, what: str) -> None:
    spend = getattr(scanner, "spend", None)  # the scan's work budget (bytes analysed)
    if spend is not None and not spend("pickle", len(data), member, "parsing generated Python", loader=_LOADER):
        return
    found = check_python(data, name=member or scanner.path)
    if hasattr(scanner, "covered"):
        scanner.covered("source", member, data)
    for sev, msg, line in found:
        where = f" (line {line})" if line else ""
        if sev == "unanalysable":
            scanner.add("unanalysable", "high", f"{what}: {msg}{where}", member, loader=_LOADER)
        else:
            scanner.add(
                "cache-code", sev, f"{what} {msg}{where}; torch.compile runs this file on a cache hit", member, loader=_LOADER
            )


def _source_codes(value: Any, budget: int = 200_000) -> list[str]:
    """``source_code`` strings in a (symbolic) CompiledFxGraph value."""
    out: list[str] = []
    stack = [value]
    seen: set[int] = set()
    while stack and budget > 0:
        budget -= 1
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "source_code" and isinstance(x, str):
                    out.append(x)
                else:
                    stack.append(x)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif type(v).__name__ == "Sym":
            for attr in ("state", "args", "items"):
                sub = getattr(v, attr, None)
                if sub:
                    stack.append(sub)
    return out


def scan_cache_file(scanner: Any, src: ByteSource, kind: str) -> None:
    """Scan one cache file the way ``torch.compile`` loads it (see module doc)."""
    from .analysis import analyse

    path = scanner.path
    scanner.report.kind = f"inductor-cache-{kind}"
    if kind in ("fxgraph", "aotautograd", "pgo"):
        data = bytes(src.view(0, src.size))
        res = analyse(data)
        scanner.report.streams += 1
        for g in res.globals:
            if g.qualname in CACHE_SAFE:
                g.verdict = Verdict("safe", "inductor cache record: " + CACHE_SAFE[g.qualname])
            elif g.qualname in CACHE_REFERENCED and not g.called:
                g.verdict = Verdict("safe", "inductor cache record: " + CACHE_REFERENCED[g.qualname])
        scanner.pickles.report_stream(res, data, None, 0, 0)
        if res.end is not None and res.end < len(data):
            scanner.add(
                "trailing-data",
                "medium",
                f"{len(data) - res.end} bytes after the pickle's STOP (pickle.loads ignores them)",
                None,
                res.end,
            )
        for i, code in enumerate(_source_codes(res.value)):
            _report_python(
                scanner,
                code,
                f"source_code #{i + 1} of the cached graph",
                "cached graph source (written to <cache>/<xx>/c<key>.py when that file is missing, then executed):",
            )
        return
    if kind == "py":
        _report_python(scanner, bytes(src.view(0, src.size)), None, "generated Python")
        return
    if kind == "cpp":
        text = bytes(src.view(0, min(src.size, MAX_SOURCE_BYTES + 1))).decode("utf-8", "replace")
        for sev, msg in check_cpp(text):
            rule, s = ("unanalysable", "high") if sev == "unanalysable" else ("cache-code", sev)
            scanner.add(
                rule, s, f"C++ kernel source (compiled by torch.compile when its .so is missing): {msg}", None, loader=_LOADER
            )
        return
    if kind == "triton-binary":
        scanner.add(
            "native-code",
            "info",
            "Triton compiler output (launcher or device code) that Triton loads on a cache hit; machine code is not analysed",
            None,
            loader=_LOADER,
        )
        return
    # .so
    head = bytes(src.view(0, min(src.size, 4)))
    cpp = path[: -len(".so")] + ".cpp"
    if head != b"\x7fELF":
        scanner.add(
            "native-code",
            "high",
            "cache shared object is not an ELF file; torch.compile would dlopen() it on a cache hit",
            None,
            0,
            loader=_LOADER,
        )
    elif _is_file(cpp, scanner.store):
        scanner.add(
            "native-code",
            "info",
            f"shared object compiled by inductor from {os.path.basename(cpp)} (analysed as C++); "
            "torch.compile dlopen()s it on a cache hit. Its machine code is not analysed",
            None,
            loader=_LOADER,
        )
    else:
        scanner.add(
            "native-code",
            "high",
            f"cache shared object without the C++ source it would be built from ({os.path.basename(cpp)} is "
            "missing): torch.compile dlopen()s it on a cache hit; its machine code is not analysed",
            None,
            loader=_LOADER,
        )


def _is_file(path: str, store: Store) -> bool:
    """A regular file (not a link) at ``path``; an object at a URL (a HEAD request).
    ``store``: the store of the cache being scanned (the scan engine's)."""
    if store.remote:
        # a failed check raises (the file is reported unanalysed, with the store's
        # reason) rather than reading as "the .cpp is missing"
        return store.isfile(path, "cannot check for the kernel's C++ source") and not store.isdir(path)
    return os.path.isfile(path) and not os.path.islink(path)


def scan_if_cache(scanner: Any, src: ByteSource) -> bool:
    """The :class:`~torchless.scan.carriers.base.ScanEngine` hook: scan ``src`` as a cache file
    when its path is in the cache layout; False when it is not one."""
    kind = cache_kind(scanner.path)
    if kind is None:
        return False
    try:
        scan_cache_file(scanner, src, kind)
    except TorchlessError as e:
        scanner.add("unanalysable", "high", f"cache file not analysed: {e.message}", e.member, e.offset, loader=_LOADER)
    if kind in ("py", "cpp", "so", "triton-binary"):
        # the name says source or library; bytes that are not (a pickle, an archive
        # named .py) are also scanned as whatever other loaders would read them as
        head = bytes(src.view(0, min(src.size, 512)))
        binary_head = head.startswith((b"\x80", ZIP_MAGIC[:2])) or compression_of(head) == "gzip"
        text_like = kind in ("py", "cpp") and b"\0" not in head and not binary_head
        if not text_like and head[:4] != b"\x7fELF":
            return False
    return True
