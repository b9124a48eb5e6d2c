"""AOTInductor content in a PT2 archive: what ``torch.export.load`` turns into native code.

``torch.export.load`` (``load_pt2``) and ``torch._inductor.aoti_load_package`` hand every
model folder ``data/aotinductor/<model>/`` of a ``.pt2`` to the C++
``AOTIModelPackageLoader`` (``torch/csrc/inductor/aoti_package/model_package_loader.cpp``),
even when the archive is an ordinary ExportedProgram archive. For each model name the
loader:

* extracts every member whose name *starts with* ``<prefix>data/aotinductor/<model>``
  (no separator after the name, so ``model2/…`` and ``model.so`` are extracted for
  ``model`` too) or ``<prefix>data/constants`` into a temporary folder, joining the member
  name to the folder as is (``..`` in a name writes outside it);
* keeps the last ``.cpp``, the last ``.so`` and every ``.o`` (central-directory order);
* with a ``.so``: ``dlopen()`` s it (native code runs in the process, its constructors
  first);
* without one: reads ``<cpp stem>_compile_flags.json`` and ``<cpp stem>_linker_flags.json``
  and builds two command lines from them (``compiler``, ``cflags``, ``definitions``,
  ``include_dirs``, ``passthrough_args``, ``ldflags``, ``libraries``, ``libraries_dirs``,
  concatenated with spaces), which it runs through the shell with ``system()``, then
  ``dlopen()`` s the result;
* on CUDA/ROCm/XPU devices, loads the GPU binaries of the folder (``.cubin``, ``.fatbin``,
  ``.hsaco``, ``.spv``).

Each of those members is a ``native-code`` finding (critical) naming what would run; a
member name that leaves the extraction folder is a critical ``path-traversal``. Nothing
here is compiled, run or loaded.
"""

from __future__ import annotations

import json
from typing import Any

from ..container.zip import ZipReader
from ..core.errors import TorchlessError
from ..formats.aoti.spec import AOTINDUCTOR_DIR as AOTI_DIR
from ..formats.aoti.spec import COMPILE_FLAGS_SUFFIX, CONSTANTS_DIR, LINKER_FLAGS_SUFFIX, aoti_models

__all__ = ["report_aoti", "aoti_models", "compile_command", "MAX_FLAGS_BYTES"]

MAX_FLAGS_BYTES = 1 << 20  # a flags JSON larger than this is not rendered
_GPU_EXT = (".cubin", ".fatbin", ".hsaco", ".spv", ".ptx")
_LOADER = "torch.export.load"
_KEYS = ("compiler", "definitions", "cflags", "include_dirs", "passthrough_args", "ldflags", "libraries", "libraries_dirs")


def compile_command(flags: Any, sources: list[str], target: str) -> str:
    """The command line the loader builds from a flags JSON (``get_cpp_compile_command``).

    Unknown or mistyped fields are rendered as found (torch would throw on them, after
    or before running the other command); the result is for the report only.
    """
    if not isinstance(flags, dict):
        return f"<flags JSON is not an object: {type(flags).__name__}>"

    def items(key: str) -> list[str]:
        v = flags.get(key, [])
        return [str(x) for x in v] if isinstance(v, list) else [str(v)]

    parts = [str(flags.get("compiler", "?")), " ".join(sources)]
    parts += ["-D " + d for d in items("definitions")]
    parts += ["-" + c for c in items("cflags")]
    parts += ["-I" + d for d in items("include_dirs")]
    parts += items("passthrough_args")
    parts += ["-" + f for f in items("ldflags")]
    parts += ["-l" + x for x in items("libraries")]
    parts += ["-L" + x for x in items("libraries_dirs")]
    if flags.get("compile_only") is True:
        parts.append("-c")
    parts += ["-o", target]
    return " ".join(p for p in parts if p)


def _short(s: str, n: int = 300) -> str:
    return s if len(s) <= n else s[:n] + f"… ({len(s)} characters)"


def _folder_of(name: str) -> tuple[str, str] | None:
    """(model folder key, model name) when the loader could extract ``name`` for a model.

    Matching ignores the archive prefix: the C++ loader derives its own prefix from the
    first two names, which need not be the one the Python side (and torchless) uses;
    ``data/constants/*`` members are extracted into the model folder of every model.
    """
    n = name.replace("\\", "/")
    i = n.find(AOTI_DIR)
    if i >= 0:
        model = n[i + len(AOTI_DIR) :].split("/", 1)[0]
        return n[: i + len(AOTI_DIR)] + model, model
    if n.find(CONSTANTS_DIR) >= 0:
        return "*", "*"
    return None


def report_aoti(scanner: Any, zr: ZipReader, member: str | None) -> None:
    """Add ``native-code`` / ``path-traversal`` findings for the AOTInductor folders of one
    zip (the :class:`~torchless.scan.carriers.base.ScanEngine` hook); no-op without any.

    Every ``.so`` of every folder (and of ``data/constants``) is reported, not only the
    one the loader keeps, since which one it keeps depends on the model name asked for
    and on prefix rules that differ between torch's Python and C++ readers.
    """
    names = [e.name for e in zr.entries]
    folders: dict[str, list[str]] = {}
    for n in names:
        f = _folder_of(n)
        if f is not None:
            folders.setdefault(f[0], []).append(n)
    models = [k for k in folders if k != "*"]
    if not models:
        return
    pre = f"{member} > " if member else ""
    nested = "" if member is None else " (inside a nested archive: loaded if it is extracted and opened)"
    shared = folders.get("*", [])
    for key in models:
        model = key.rsplit("/", 1)[-1]
        # the loader's folder test is a prefix test: "model" also takes "model2/..."
        members = [n for k, ns in folders.items() if k != "*" and k.startswith(key) for n in ns] + shared
        cpps: list[str] = []
        sos: list[str] = []
        objs: list[str] = []
        for n in members:
            parts = n.replace("\\", "/").split("/")
            if ".." in parts or n.startswith(("/", "\\")):
                scanner.add(
                    "path-traversal",
                    "critical",
                    f"AOTInductor member {n!r} is extracted by the package loader to <temp folder>/{n}, "
                    f"which leaves the folder: a file written anywhere the user can write{nested}",
                    pre + n,
                    loader=_LOADER,
                )
            dot = n.rfind(".")
            ext = n[dot:] if dot > n.rfind("/") else ""
            if ext == ".cpp":
                cpps.append(n)
            elif ext == ".so":
                sos.append(n)
            elif ext == ".o":
                objs.append(n)
            elif ext in _GPU_EXT:
                scanner.add(
                    "native-code",
                    "critical",
                    f"GPU binary {n!r} of AOTInductor model {model!r} is loaded "
                    f"as device code when the model runs on a GPU{nested}",
                    pre + n,
                    loader=_LOADER,
                )
        for so in sos:
            scanner.add(
                "native-code",
                "critical",
                f"shared object {so!r} of AOTInductor model {model!r} is dlopen()ed by torch.export.load / "
                f"aoti_load_package: native code runs in the loading process (its initialisers at load){nested}",
                pre + so,
                loader=_LOADER,
            )
        if sos:
            continue
        for cpp in cpps:  # the loader compiles the last; each could be the last one
            _report_compile(scanner, zr, cpp, objs, model, pre, nested)


def _report_compile(scanner: Any, zr: ZipReader, cpp: str, objs: list[str], model: str, pre: str, nested: str) -> None:
    stem = cpp[: cpp.rfind(".")]
    out_o = stem + ".o"
    for suffix, sources, target in ((COMPILE_FLAGS_SUFFIX, [cpp], out_o), (LINKER_FLAGS_SUFFIX, objs + [out_o], stem + ".so")):
        fname = stem + suffix
        try:
            # the loader reads the extracted file; each name is extracted through
            # miniz's lookup, so duplicates resolve to the entry torch's reader picks
            hit = zr.lookup(fname, full=True)
            raw = zr.read_bytes(hit, max_size=MAX_FLAGS_BYTES) if hit is not None else None
        except TorchlessError as e:
            scanner.add(
                "native-code",
                "critical",
                f"{fname!r} (compile/link flags of AOTInductor model {model!r}) cannot be read "
                f"({e.message}); the loader would run the command line it holds through the shell",
                pre + fname,
                loader=_LOADER,
            )
            continue
        if raw is None:
            continue
        try:
            flags = json.loads(raw.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            flags = None
        cmd = compile_command(flags, sources, target) if flags is not None else "<not JSON: the loader throws>"
        scanner.add(
            "native-code",
            "critical",
            f"{fname!r} becomes a command line that torch.export.load / aoti_load_package runs through the shell "
            f"(system()): {_short(cmd)}{nested}",
            pre + fname,
            loader=_LOADER,
        )
    scanner.add(
        "native-code",
        "critical",
        f"AOTInductor model {model!r} has no shared object: the loader compiles "
        f"{cpp!r}{' and links ' + ', '.join(repr(o) for o in objs) if objs else ''} with its flags JSON and "
        f"dlopen()s the result{nested}",
        pre + cpp,
        loader=_LOADER,
    )
