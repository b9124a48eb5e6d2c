"""Which globals a scan trusts: an allowlist with reasons, a curated danger list, and the rest.

Every global a pickle names gets one of four verdicts:

* ``safe`` - on torchless's allowlist (:data:`SAFE`): the default table torchless loads
  with (``DEFAULT_ALLOWLIST``) plus the container-specific names below. Each entry carries
  a one-line reason.
* ``dangerous`` - a known way to run code, touch files, the network or the interpreter,
  or an indirection that reaches one (:data:`DANGEROUS_MODULES`, :data:`DANGEROUS_NAMES`).
  The reason says what it does.
* ``nested`` - a global that deserialises its argument (:data:`NESTED_LOADERS`): never
  safe; the scan follows the payload and judges it.
* ``unknown`` - everything else. Unknown is not "probably fine": ``pickle.load`` imports
  the module and calls whatever it names. Its severity is configurable.

The verdict never depends on a blocklist alone: a name is safe only when it is listed as
safe, and a dotted name (``argparse._os.system``, resolved by attribute walk in protocol 4
and later) is never safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..pickle.globals import Allowlist, Entry
from ..pickle.torch_globals import DEFAULT_ALLOWLIST, TORCH_ALLOWLIST

__all__ = [
    "SAFE",
    "TORCHSCRIPT_SAFE",
    "DANGEROUS_MODULES",
    "DANGEROUS_NAMES",
    "NESTED_LOADERS",
    "Verdict",
    "classify",
    "torch_allows",
]

_TS = "TorchScript-only name: resolved by torch's C++ unpickler to a type or identity function, never imported"
_DCP = "torch.distributed.checkpoint dataclass: a plain record of fields, no code runs on construction"


def _scan_extras() -> Allowlist:
    a = Allowlist("scan-extras")
    for n in (
        "restore_type_tag",
        "build_intlist",
        "build_doublelist",
        "build_boollist",
        "build_tensorlist",
        "build_tensor_from_id",
    ):
        a.add(f"torch.jit._pickle.{n}", None, f"{_TS} (torch.jit._pickle.{n} returns its argument)")
    for n in (
        "Metadata",
        "TensorStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    ):
        a.add(f"torch.distributed.checkpoint.metadata.{n}", None, _DCP)
    a.add("torch.distributed.checkpoint.filesystem._StorageInfo", None, _DCP)
    a.add("torch.distributed.checkpoint.planner.WriteItemType", None, "an enum of DCP write item kinds")
    a.add("torch.distributed.checkpoint.planner.LoadItemType", None, "an enum of DCP load item kinds")
    a.add("torch.distributed.checkpoint.metadata.TensorProperties.create_from_tensor", None, _DCP)
    a.add("enum.Enum", None, "Enum lookup by value (DCP pickles _MEM_FORMAT_ENCODING through it)")
    for n in (
        "ComplexHalf",
        "UInt16",
        "UInt32",
        "UInt64",
        "Float8_e4m3fn",
        "Float8_e5m2",
        "Float8_e4m3fnuz",
        "Float8_e5m2fnuz",
        "Float8_e8m0fnu",
        "Float4_e2m1fn_x2",
        "QUInt4x2",
        "QUInt2x4",
        "Bits8",
        "Bits16",
        "Bits1x8",
        "Bits2x4",
        "Bits4x2",
    ):
        name = f"torch.{n}Storage"
        if name not in DEFAULT_ALLOWLIST:
            a.add(name, None, f"{_TS} (storage class name written by the C++ pickler)")
    return a


#: Everything a scan calls safe: torchless's load allowlist plus names only torch's own
#: C++/format loaders resolve (TorchScript tags, DCP metadata records).
SAFE: Allowlist = DEFAULT_ALLOWLIST.merged(_scan_extras(), name="scan")

#: In TorchScript archives, ``__torch__.*`` classes are TorchScript types defined in the
#: archive's ``code/`` (scanned separately), not Python imports.
TORCHSCRIPT_SAFE = "__torch__."

#: module (and everything under it) -> why it is dangerous.
DANGEROUS_MODULES: dict[str, str] = {
    "os": "operating-system interface: runs commands, writes and deletes files",
    "posix": "the os module's implementation on POSIX (os.system is posix.system)",
    "nt": "the os module's implementation on Windows",
    "posixpath": "os.path; its module namespace reaches os",
    "ntpath": "os.path on Windows; its module namespace reaches os",
    "subprocess": "runs external programs",
    "_posixsubprocess": "runs external programs (subprocess internals)",
    "pty": "spawns processes on a pseudo-terminal",
    "sys": "interpreter state: modules, import hooks, exit",
    "runpy": "runs Python modules and code",
    "importlib": "imports arbitrary modules",
    "imp": "imports arbitrary modules",
    "pkgutil": "resolves and imports modules by name",
    "pydoc": "pydoc.locate imports arbitrary objects by name",
    "zipimport": "imports code from archives",
    "pickle": "a nested unpickler: runs a second, unscanned pickle",
    "_pickle": "a nested unpickler: runs a second, unscanned pickle",
    "cPickle": "a nested unpickler (Python 2 name)",
    "dill": "a nested unpickler that also rebuilds code objects",
    "cloudpickle": "rebuilds functions and code objects",
    "joblib": "joblib.load is a nested unpickler",
    "marshal": "loads Python code objects",
    "shelve": "a pickle-backed database: unpickles on access",
    "dbm": "opens, creates and truncates database files (anydbm, dumbdbm, gdbm, dbhash in Python 2)",
    "shutil": "copies, moves and deletes files and trees",
    "tempfile": "creates files",
    "socket": "opens network connections",
    "_socket": "opens network connections",
    "ssl": "opens network connections",
    "http": "network client and server",
    "urllib": "fetches URLs",
    "ftplib": "network client",
    "smtplib": "sends mail",
    "telnetlib": "network client",
    "xmlrpc": "network RPC",
    "requests": "fetches URLs",
    "ctypes": "calls native code and reads/writes raw memory",
    "_ctypes": "calls native code and reads/writes raw memory",
    "cffi": "calls native code",
    "webbrowser": "launches programs to open URLs",
    "code": "an interactive interpreter: runs source code",
    "codeop": "compiles source code",
    "pdb": "the debugger: runs code",
    "bdb": "the debugger core: runs code",
    "timeit": "timeit.timeit/repeat exec a statement string",
    "cProfile": "cProfile.run execs a statement string",
    "profile": "profile.run execs a statement string",
    "trace": "runs code under tracing",
    "doctest": "runs code found in docstrings",
    "multiprocessing": "starts processes and unpickles what they send",
    "concurrent": "starts threads and processes",
    "threading": "starts threads running any callable",
    "_thread": "starts threads running any callable",
    "asyncio": "event loop: runs subprocesses and network I/O",
    "signal": "installs signal handlers",
    "fileinput": "opens files",
    "glob": "lists files",
    "io": "opens files (io.open, io.FileIO)",
    "_io": "opens files (_io.open, _io.FileIO)",
    "gc": "reaches every live object (gc.get_objects)",
    "inspect": "reaches frames and their globals",
    "venv": "creates environments and runs pip",
    "ensurepip": "installs packages",
    "pip": "installs packages",
    "setuptools": "builds and runs setup code",
    "distutils": "builds and runs setup code",
    "site": "changes import paths, runs .pth code",
    "builtins.__builtins__": "the builtins namespace",
    "torch.hub": "downloads and runs code from the network",
    "torch.jit": "torch.jit.load runs TorchScript and C++ loaders (only torch.jit._pickle tags are safe)",
    "torch.package": "torch.package importers run pickled code",
    "torch.utils.cpp_extension": "compiles and loads native code",
    "torch._inductor": "compiles and loads generated code",
    "torch._dynamo": "compiles and runs Python bytecode",
    "torch.distributed.rpc": "remote procedure calls",
    "torch._C": "torch's native bindings (load_library, _jit_* ...): native code reachable by name",
    "torch.ops": "custom operators; torch.ops.load_library loads native code",
    "torch.classes": "TorchBind classes; torch.classes.load_library loads native code",
}

#: exact qualified name -> why it is dangerous.
DANGEROUS_NAMES: dict[str, str] = {
    "builtins.eval": "evaluates a Python expression",
    "builtins.exec": "executes Python source",
    "builtins.compile": "compiles Python source into code",
    "builtins.execfile": "executes a Python file (Python 2)",
    "builtins.getattr": "attribute access by name: the classic indirection to reach any callable",
    "builtins.setattr": "overwrites attributes of modules and objects",
    "builtins.delattr": "deletes attributes of modules and objects",
    "builtins.__import__": "imports any module",
    "builtins.open": "opens (and creates or truncates) files",
    "builtins.input": "reads the terminal",
    "builtins.breakpoint": "starts the debugger",
    "builtins.globals": "reaches module globals",
    "builtins.locals": "reaches local variables",
    "builtins.vars": "reaches an object's namespace",
    "builtins.apply": "calls any callable (Python 2)",
    "builtins.memoryview": "raw buffer access",
    "builtins.type": "creates classes at load time",
    "builtins.super": "reaches methods of base classes",
    "builtins.staticmethod": "wraps callables",
    "builtins.classmethod": "wraps callables",
    "builtins.property": "wraps callables",
    "builtins.map": "calls a callable for each item (an indirection)",
    "builtins.filter": "calls a callable for each item (an indirection)",
    "builtins.help": "starts the interactive help (pager, imports)",
    "builtins.exit": "exits the interpreter",
    "builtins.quit": "exits the interpreter",
    "types.CodeType": "builds Python bytecode",
    "types.FunctionType": "builds a function from bytecode",
    "types.MethodType": "binds callables to objects",
    "types.LambdaType": "builds a function from bytecode",
    "types.ModuleType": "creates modules",
    "operator.attrgetter": "attribute access by name (an indirection like getattr)",
    "operator.methodcaller": "calls a method by name (an indirection)",
    "operator.getitem": "item access on any object (reaches os.environ, __dict__ ...)",
    "operator.call": "calls any callable",
    "_operator.attrgetter": "attribute access by name (an indirection like getattr)",
    "_operator.methodcaller": "calls a method by name (an indirection)",
    "_operator.getitem": "item access on any object",
    "functools.partial": "binds arguments to any callable, called later",
    "functools.partialmethod": "binds arguments to any callable",
    "functools.reduce": "calls a callable repeatedly",
    "_functools.partial": "binds arguments to any callable, called later",
    "_functools.reduce": "calls a callable repeatedly",
    "copyreg._reconstructor_unsafe": "constructs arbitrary classes",
    "codecs.open": "opens files",
    "numpy.load": "numpy.load(allow_pickle=True) is a nested unpickler",
    "numpy.lib.npyio.load": "a nested unpickler",
    "numpy.testing._private.utils.runstring": "execs a source string",
    "numpy.f2py.crackfortran.myeval": "evals a source string",
    "numpy.distutils.exec_command.exec_command": "runs a shell command",
    "pandas.read_pickle": "a nested unpickler",
    "torch.load": "a nested torch.load (weights_only may be False)",
    "torch.serialization.load": "a nested torch.load (weights_only may be False)",
    "torch.serialization._load": "a nested torch.load",
    "torch._weights_only_unpickler._get_allowed_globals": "reaches torch's allowlist",
    "torch.fx.graph_module.reduce_graph_module": "execs generated Python source of an fx graph",
    "torch.fx.graph_module.reduce_package_graph_module": "execs generated Python source",
    "torch.fx.graph_module._forward_from_src": "execs Python source",
    "torch.fx.graph_module._exec_with_source": "execs Python source",
    "torch.utils.data.datapipes.utils.decoder.basichandlers": "decodes pickles",
    "torch.serialization.add_safe_globals": "widens torch's allowlist at load time",
    "torch.from_file": "maps (and with shared=True creates) a file",
    "torch.save": "writes files",
}

#: globals that deserialise one of their arguments at load time: "nested-loader" edges.
#: qualname -> (loader that runs the payload, index of the argument it reads or None
#: when the payload is not an argument, what it does). The scan follows the argument
#: whatever its encoding and first bytes (:mod:`torchless.scan.carriers.nested`); an
#: argument that is not a concrete value is ``unanalysable``. None of these is ever
#: "safe": those that are not also dangerous get the verdict ``nested``.
NESTED_LOADERS: dict[str, tuple[str, int | None, str]] = {
    "torch.storage._load_from_bytes": (
        "torch.load(weights_only=False)",
        0,
        "torch.load(io.BytesIO(b), weights_only=False) of its argument (how torch pickles storages)",
    ),
    "torch.load": ("torch.load(weights_only=False)", 0, "torch.load of its argument"),
    "torch.serialization.load": ("torch.load(weights_only=False)", 0, "torch.load of its argument"),
    "torch.serialization._load": ("torch.load(weights_only=False)", 0, "torch.load of its argument"),
    "torch.serialization._legacy_load": ("torch.load(weights_only=False)", 0, "torch.load of its argument"),
    "pickle.loads": ("pickle.load", 0, "unpickles its argument"),
    "pickle.load": ("pickle.load", 0, "unpickles its argument"),
    "pickle._loads": ("pickle.load", 0, "unpickles its argument"),
    "pickle._load": ("pickle.load", 0, "unpickles its argument"),
    "_pickle.loads": ("pickle.load", 0, "unpickles its argument"),
    "_pickle.load": ("pickle.load", 0, "unpickles its argument"),
    "pickle.Unpickler": ("pickle.load", 0, "an unpickler over its argument"),
    "_pickle.Unpickler": ("pickle.load", 0, "an unpickler over its argument"),
    "pickle._Unpickler": ("pickle.load", 0, "an unpickler over its argument"),
    "dill.loads": ("pickle.load", 0, "unpickles its argument"),
    "dill.load": ("pickle.load", 0, "unpickles its argument"),
    "dill._dill.loads": ("pickle.load", 0, "unpickles its argument"),
    "cloudpickle.loads": ("pickle.load", 0, "unpickles its argument"),
    "cloudpickle.load": ("pickle.load", 0, "unpickles its argument"),
    "pandas.read_pickle": ("pickle.load", 0, "unpickles its argument"),
    "pandas.io.pickle.read_pickle": ("pickle.load", 0, "unpickles its argument"),
    "numpy.load": ("numpy.load(allow_pickle=True)", 0, "numpy.load of its argument"),
    "numpy.lib.npyio.load": ("numpy.load(allow_pickle=True)", 0, "numpy.load of its argument"),
    "numpy.lib._npyio_impl.load": ("numpy.load(allow_pickle=True)", 0, "numpy.load of its argument"),
    "numpy.loads": ("pickle.load", 0, "pickle.loads (old NumPy alias)"),
    "numpy.core.multiarray.loads": ("pickle.load", 0, "pickle.loads (old NumPy alias)"),
    "joblib.load": ("joblib.load", 0, "joblib.load of its argument"),
    "joblib.numpy_pickle.load": ("joblib.load", 0, "joblib.load of its argument"),
    "joblib.numpy_pickle.NumpyArrayWrapper": (
        "joblib.load",
        None,
        "joblib reads the array's bytes (for object arrays: a further pickle) from the stream right after this object's BUILD",
    ),
    "joblib.numpy_pickle_compat.NDArrayWrapper": (
        "joblib.load",
        None,
        "old joblib format: numpy.load of a sibling file named in the pickle",
    ),
    "joblib.numpy_pickle_compat.ZNDArrayWrapper": (
        "joblib.load",
        None,
        "old joblib format: a zlib-compressed sibling file named in the pickle",
    ),
}

#: substrings of a dotted attribute path that reach interpreter internals.
_DUNDER_REACH = (
    "__builtins__",
    "__globals__",
    "__class__",
    "__subclasses__",
    "__mro__",
    "__bases__",
    "__code__",
    "__dict__",
    "__getattribute__",
    "__import__",
    "__loader__",
    "__spec__",
    "__init__",
    "__reduce__",
    "__reduce_ex__",
    "__self__",
    "__func__",
    "__closure__",
)


#: last components of dotted names that run code or touch files wherever they are defined.
_DANGEROUS_ATTRS = frozenset(
    [
        "system",
        "popen",
        "popen2",
        "popen3",
        "exec",
        "eval",
        "compile",
        "getattr",
        "setattr",
        "execv",
        "execve",
        "execvp",
        "execvpe",
        "execl",
        "execle",
        "execlp",
        "execlpe",
        "spawnl",
        "spawnle",
        "spawnlp",
        "spawnv",
        "spawnve",
        "spawnvp",
        "fork",
        "forkpty",
        "run",
        "call",
        "check_call",
        "check_output",
        "getoutput",
        "getstatusoutput",
        "Popen",
        "loads",
        "load",
        "open",
        "remove",
        "unlink",
        "rmtree",
        "rmdir",
        "removedirs",
        "kill",
        "import_module",
        "run_path",
        "run_module",
        "_run_code",
        "_run_module_code",
        "startfile",
        "putenv",
        "write_text",
        "write_bytes",
    ]
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The classification of one global."""

    verdict: str  # "safe" | "nested" | "unknown" | "dangerous"
    reason: str


def _dangerous(qual: str) -> str | None:
    r = DANGEROUS_NAMES.get(qual)
    if r is not None:
        return r
    parts = qual.split(".")
    for i in range(len(parts) - 1, 0, -1):
        r = DANGEROUS_MODULES.get(".".join(parts[:i]))
        if r is not None:
            return r
    return None


def classify(module: str, name: str, *, torchscript: bool = False) -> Verdict:
    """Classify ``module.name`` (after Python-2 renames) for a scan.

    Args:
        module, name: as the pickle names them (``STACK_GLOBAL``'s two strings).
        torchscript: the pickle is inside a TorchScript archive, where ``__torch__.*``
            are TorchScript classes defined by the archive's own ``code/``.
    """
    qual = f"{module}.{name}"
    if "." in name:
        # protocol >= 4 resolves dotted names by attribute walk from the module, so
        # ``argparse._os.system`` is os.system. Check every sub-path for a danger.
        parts = qual.split(".")
        for i in range(len(parts)):
            for j in range(len(parts), i, -1):
                r = _dangerous(".".join(parts[i:j]))
                if r is not None:
                    sub = ".".join(parts[i:j])
                    return Verdict("dangerous", f"dotted name reaches {sub} by attribute walk: {r}")
        stripped = ".".join(p.lstrip("_") or p for p in parts)  # argparse._os -> argparse.os
        if stripped != qual:
            sp = stripped.split(".")
            for i in range(len(sp)):
                r = _dangerous(".".join(sp[i:]))
                if r is not None:
                    return Verdict(
                        "dangerous",
                        f"dotted name reaches {'.'.join(parts[i:])} (an alias of {'.'.join(sp[i:])}) by attribute walk: {r}",
                    )
        if parts[-1] in _DANGEROUS_ATTRS:
            return Verdict(
                "dangerous",
                f"dotted name ends in {parts[-1]!r}, a name that runs code or touches files in the modules that define it",
            )
        for d in _DUNDER_REACH:
            if d in qual:
                return Verdict("dangerous", f"reaches interpreter internals through {d}")
        walked = SAFE.get(qual)
        if walked is not None and "." not in name:
            return Verdict("safe", walked.reason)
        return Verdict("unknown", "dotted name resolved by attribute walk (never allowlisted)")
    r = _dangerous(qual)
    nested = NESTED_LOADERS.get(qual)
    if nested is not None and (r is None or nested[1] is None):  # a nested loader is never safe
        return Verdict("nested", f"nested loader: {nested[2]} (the payload is followed and analysed)")
    entry: Entry | None = SAFE.get(qual)
    if entry is not None and nested is None:  # exact, curated names win over module-wide dangers
        return Verdict("safe", entry.reason)
    if r is not None:
        return Verdict("dangerous", r)
    if torchscript and qual.startswith(TORCHSCRIPT_SAFE):
        return Verdict("safe", "TorchScript class defined in this archive's code/ (scanned separately)")
    return Verdict("unknown", "not on torchless's allowlist: pickle.load would import and call it")


def torch_allows(qual: str) -> bool:
    """Whether ``torch.load(weights_only=True)`` of torch 2.13 allows ``qual`` by default."""
    return qual in TORCH_ALLOWLIST
