"""The loader oracle's child process: run the real loaders with recording hooks, inert.

Usage: ``python child.py JOBS_JSON`` (a file holding ``[[loader, path], ...]``); prints one
JSON line per job::

    {"i", "loader", "path", "status", "error", "spans", "sources", "reached"}

* ``spans``: every stream an unpickler was handed, as ``{"sha256", "length", "complete"}``:
  the exact bytes from the unpickler's first read through STOP (``complete``: the
  unpickler returned), or, when it raised, the bytes it consumed (``sha256``) and the
  stream through the first STOP that :mod:`pickletools` finds from the same start
  (``stop_sha256``, null when there is none).
* ``sources``: ``{"sha256", "filename"}`` of every source text compiled whose file name is
  not a library file (packaged modules, remote code, code strings a pickle hands ``exec``).
* ``reached``: the effects a payload asked for (processes, ``os.system``, native libraries,
  writes, network, ``exec`` of code compiled from no file source), each refused by the
  audit hook *before* it happens: a payload never runs, it is only seen to be reached.

Hooks: the unpicklers (``pickle.Unpickler``/``_Unpickler``/``load``/``loads``, ``_pickle``'s,
``torch._weights_only_unpickler``'s) are replaced by recording subclasses before any loader
is imported; ``sys.addaudithook`` sees ``compile``, ``exec``, process, ``ctypes.dlopen``,
``open`` (write modes) and socket events. Each job runs in a forked child with a timeout.
Test helper only (never imported by torchless).
"""

from __future__ import annotations

import _pickle
import hashlib
import io
import json
import os
import pickle
import pickletools
import sys
import sysconfig
import time

TIMEOUT = float(os.environ.get("ORACLE_TIMEOUT", "20"))
_MAX_SPAN = 256 << 20

_ACTIVE = False
_OUT: dict = {}


def _lib_dirs() -> tuple[str, ...]:
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for k in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(k)
        if p:
            dirs.add(p)
    dirs |= {os.path.realpath(d) for d in list(dirs)}
    return tuple(sorted(d.rstrip("/") + "/" for d in dirs))


_LIBS = _lib_dirs()


def _is_library(filename: str) -> bool:
    if filename.startswith("<frozen") or filename in ("<unknown>",):
        return True
    f = os.path.abspath(filename) if filename and not filename.startswith("<") else filename
    return f.startswith(_LIBS) or os.path.realpath(f).startswith(_LIBS)


# -- the unpicklers ---------------------------------------------------------------------------
def _stop_end(data: bytes) -> int | None:
    try:
        for op, _arg, pos in pickletools.genops(data):
            if op.name == "STOP":
                return pos + 1
    except Exception:
        return None
    return None


def _span(file, start: int | None, ok: bool, globals_: int) -> None:
    if not _ACTIVE:
        return
    entry: dict = {"complete": ok, "globals": globals_}
    try:
        if start is None:
            raise OSError("not seekable")
        end = file.tell()
        file.seek(start)
        consumed = file.read(max(0, end - start))
        rest = b"" if ok else file.read(_MAX_SPAN)
        file.seek(end)
    except Exception as e:  # an unseekable file: the span cannot be told
        entry.update(sha256=None, length=None, error=f"{type(e).__name__}: {e}")
        _OUT["spans"].append(entry)
        return
    if ok:
        end_at = _stop_end(consumed)
        if end_at is not None:
            consumed = consumed[:end_at]  # a frame read whole past STOP
        entry.update(sha256=hashlib.sha256(consumed).hexdigest(), length=len(consumed))
    else:
        whole = consumed + rest
        stop = _stop_end(whole)
        entry.update(
            sha256=hashlib.sha256(consumed).hexdigest(),
            length=len(consumed),
            stop_sha256=None if stop is None else hashlib.sha256(whole[:stop]).hexdigest(),
        )
    _OUT["spans"].append(entry)


def _tell(file) -> int | None:
    try:
        return file.tell() if file.seekable() else None
    except Exception:
        return None


def _recording(base: type) -> type:
    class Recording(base):  # type: ignore[misc, valid-type]
        def __init__(self, file, *a, **kw):
            super().__init__(file, *a, **kw)
            self._oracle_file = file
            self._oracle_globals = 0

        def find_class(self, module, name):
            found = super().find_class(module, name)
            self._oracle_globals += 1  # resolved (a module that does not import ran nothing)
            return found

        def load(self):
            f = self._oracle_file
            start = _tell(f)
            try:
                out = super().load()
            except BaseException:
                _span(f, start, False, self._oracle_globals)
                raise
            _span(f, start, True, self._oracle_globals)
            return out

    Recording.__name__ = Recording.__qualname__ = base.__name__
    Recording.__module__ = base.__module__
    return Recording


def _install_unpicklers() -> None:
    """CPython's unpicklers (before joblib, numpy or torch is imported: joblib subclasses
    ``pickle._Unpickler`` at import)."""
    c_un = _recording(_pickle.Unpickler)
    py_un = _recording(pickle._Unpickler)

    def load(file, **kw):
        return c_un(file, **kw).load()

    def loads(data, /, **kw):
        return c_un(io.BytesIO(bytes(data)), **kw).load()

    def py_load(file, **kw):
        return py_un(file, **kw).load()

    def py_loads(data, /, **kw):
        return py_un(io.BytesIO(bytes(data)), **kw).load()

    pickle.Unpickler = c_un
    pickle.load, pickle.loads = load, loads
    pickle._Unpickler, pickle._load, pickle._loads = py_un, py_load, py_loads
    _pickle.load, _pickle.loads = load, loads  # type: ignore[assignment]


def _install_torch_unpickler() -> None:
    try:
        import torch._weights_only_unpickler as wou
    except ImportError:
        return
    wou.Unpickler = _recording(wou.Unpickler)  # its load() looks the class up at call time


# -- the audit hook -----------------------------------------------------------------------
_BLOCK = (
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.remove",
    "os.rmdir",
    "os.rename",
    "os.truncate",
    "os.symlink",
    "os.link",
    "os.chmod",
    "subprocess.Popen",
    "pty.spawn",
    "shutil.rmtree",
    "socket.connect",
    "socket.bind",
    "socket.getaddrinfo",
    "urllib.Request",
    "webbrowser.open",
    "ctypes.dlopen",
    "ctypes.call_function",
    "builtins.input",
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_compiled: set[str] = set()  # file names of sources compiled from the file (packaged modules...)
_WRITABLE: tuple[str, ...] = ()


class OracleBlocked(RuntimeError):
    """An effect the audit hook refused (the payload was reached)."""


def _reach(event: str, detail: str) -> None:
    _OUT["reached"].append({"event": event, "detail": detail[:300]})
    raise OracleBlocked(event)


_UNPICKLER_FILES = ("pickle.py", "_weights_only_unpickler.py", os.path.basename(__file__))


def _library_caller() -> bool:
    """The Python frame that asked for the event is library code other than an unpickler
    (``dataclasses`` and ``namedtuple`` compile ``<string>`` code; a pickle's REDUCE of
    ``exec`` comes from an unpickler's frame)."""
    fr = sys._getframe(2)
    fn = fr.f_code.co_filename
    return _is_library(fn) and os.path.basename(fn) not in _UNPICKLER_FILES


def _loopback_probe(args: tuple) -> bool:
    """``socket.bind`` to a loopback address on port 0 (an ephemeral port: nothing listens)."""
    addr = args[1] if len(args) > 1 else None
    return isinstance(addr, tuple) and len(addr) >= 2 and addr[0] in ("::1", "127.0.0.1") and addr[1] == 0


def _hook(event: str, args: tuple) -> None:
    if not _ACTIVE:
        return
    if event == "compile":
        src, filename = args[0], str(args[1])
        if src is None or _is_library(filename) or (filename == "<string>" and _library_caller()):
            return
        raw = src.encode("utf-8", "surrogatepass") if isinstance(src, str) else bytes(src)
        _OUT["sources"].append({"sha256": hashlib.sha256(raw).hexdigest(), "filename": filename[:200]})
        if filename not in ("<string>",):
            _compiled.add(filename)
    elif event == "exec":
        fn = getattr(args[0], "co_filename", "")
        if _is_library(fn) or fn in _compiled or (fn == "<string>" and _library_caller()):
            return
        _reach("exec", fn)
    elif event == "open":
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITE_FLAGS)
        if writes and not (isinstance(path, str) and path.startswith(_WRITABLE)):
            _reach("open-write", str(path))
    elif event == "ctypes.dlopen":
        name = args[0]
        if name is None or (isinstance(name, str) and _is_library(name)):
            return
        _reach(event, repr(args))
    elif event.startswith(_BLOCK):
        if event.startswith(("os.", "shutil.")) and any(isinstance(a, str) and a.startswith(_WRITABLE) for a in args):
            return  # a loader's own cache (Hugging Face's modules folder)
        if event == "socket.bind" and _loopback_probe(args) and _library_caller():
            return  # a library's capability probe on import (urllib3 binds ('::1', 0) to test IPv6)
        _reach(event, repr(args))


# -- the loaders ------------------------------------------------------------------------------
def _torch_load(path: str, weights_only: bool) -> None:
    import torch

    torch.load(path, weights_only=weights_only, map_location="cpu")


def _numpy(path: str) -> None:
    import numpy as np

    r = np.load(path, allow_pickle=True)
    if hasattr(r, "files"):
        for k in r.files:
            r[k]


def _dcp(path: str) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = dcp.FileSystemReader(path).read_metadata()
    state = {
        k: (torch.zeros(v.size, dtype=v.properties.dtype) if isinstance(v, TensorStorageMetadata) else None)
        for k, v in md.state_dict_metadata.items()
    }
    dcp.load(state, checkpoint_id=path, no_dist=True)


def _package(path: str, what: str) -> None:
    import zipfile

    from torch.package import PackageImporter

    with zipfile.ZipFile(path) as z:
        names = [n.split("/", 1)[1] for n in z.namelist() if "/" in n]
    imp = PackageImporter(path)
    errors = []
    for n in names:
        if n.startswith(".data/"):
            continue
        try:
            if what == "pickle" and n.endswith(".pkl"):
                pkg, _, res = n.rpartition("/")
                imp.load_pickle(pkg.replace("/", "."), res)
            elif what == "module" and n.endswith(".py"):
                mod = n[:-3].replace("/", ".").removesuffix(".__init__")
                imp.import_module(mod)
        except Exception as e:  # go on: a loader may load any resource
            errors.append(e)
    if errors:
        raise errors[0]


def _hf(path: str, auto: str) -> None:
    import transformers

    getattr(transformers, auto).from_pretrained(path, trust_remote_code=True)


def load(loader: str, path: str) -> None:
    if loader == "pickle":
        with open(path, "rb") as f:
            pickle.load(f)
    elif loader in ("gzip", "bz2", "xz", "lzma"):
        import bz2
        import gzip
        import lzma

        opener = {"gzip": gzip.open, "bz2": bz2.open, "xz": lzma.open, "lzma": lzma.open}[loader]
        with opener(path) as f:
            pickle.load(f)
    elif loader == "zlib":
        import zlib

        with open(path, "rb") as f:
            pickle.loads(zlib.decompress(f.read()))
    elif loader == "joblib":
        import joblib

        joblib.load(path)
    elif loader == "numpy":
        _numpy(path)
    elif loader in ("torch", "torch_wo"):
        _torch_load(path, loader == "torch_wo")
    elif loader == "jit":
        import torch

        torch.jit.load(path, map_location="cpu")
    elif loader == "export":
        import torch

        torch.export.load(path)
    elif loader == "dcp":
        _dcp(path)
    elif loader in ("package_pickle", "package_module"):
        _package(path, loader.split("_")[1])
    elif loader.startswith("hf_"):
        _hf(path, loader[3:])
    else:
        raise SystemExit(f"unknown loader {loader}")


def _run_one(i: int, loader: str, path: str) -> dict:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: hooks on, load, report through the pipe
        global _ACTIVE
        os.close(r)
        _OUT.update(i=i, loader=loader, path=path, status="done", error=None, spans=[], sources=[], reached=[])
        try:
            sys.stdout = sys.stderr = open(os.devnull, "w")
            _ACTIVE = True
            load(loader, path)
        except BaseException as e:  # loaders often fail after (or instead of) a payload
            _ACTIVE = False
            _OUT.update(status="raised", error=f"{type(e).__name__}: {str(e)[:300]}")
        _ACTIVE = False
        with os.fdopen(w, "w") as f:
            f.write(json.dumps(_OUT))
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + TIMEOUT
    chunks = []
    os.set_blocking(r, False)
    status = None
    while True:
        try:
            b = os.read(r, 1 << 16)
            if b:
                chunks.append(b)
                continue
        except BlockingIOError:
            b = None
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            os.set_blocking(r, True)
            chunks.append(os.read(r, 1 << 30) if b is None else b"")
            while True:
                more = os.read(r, 1 << 20)
                if not more:
                    break
                chunks.append(more)
            status = os.waitstatus_to_exitcode(st)
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            status = "timeout"
            break
        time.sleep(0.002)
    os.close(r)
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        return {
            "i": i,
            "loader": loader,
            "path": path,
            "status": "timeout" if status == "timeout" else "crashed",
            "error": str(status),
            "spans": [],
            "sources": [],
            "reached": [],
        }


def main(argv: list[str]) -> int:
    global _WRITABLE
    with open(argv[0]) as f:
        jobs = json.load(f)
    import tempfile
    import warnings

    warnings.simplefilter("ignore")
    hf_home = tempfile.mkdtemp(prefix="oracle_hf_")
    os.environ.update(HF_HOME=hf_home, HF_MODULES_CACHE=os.path.join(hf_home, "modules"), HF_HUB_OFFLINE="1")
    _WRITABLE = (hf_home, os.path.realpath(hf_home))
    _install_unpicklers()  # before any loader is imported (joblib subclasses pickle._Unpickler)
    loaders = {j[0] for j in jobs}
    if loaders & {"torch", "torch_wo", "jit", "export", "dcp", "package_pickle", "package_module"}:
        import torch  # noqa: F401  (once, before forking)
        import torch.distributed.checkpoint  # noqa: F401
        import torch.export  # noqa: F401
        import torch.package  # noqa: F401

        try:
            import torch._export.serde.serialize  # noqa: F401
        except ImportError:
            pass
        _install_torch_unpickler()
    if "joblib" in loaders:
        import joblib  # noqa: F401
    if any(ld.startswith("hf_") for ld in loaders):
        try:
            import transformers  # noqa: F401
        except ImportError:
            pass
    sys.addaudithook(_hook)
    for i, (loader, path) in enumerate(jobs):
        print(json.dumps(_run_one(i, loader, path)), flush=True)
    import shutil

    shutil.rmtree(hf_home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
