"""Inventory of a TorchInductor cache folder (``TORCHINDUCTOR_CACHE_DIR``).

Spec ``inductor_cache.md``. The folder is walked without following symbolic links and
every file is put in exactly one :class:`CacheEntry`, a unit that is created (and should
be pruned) together:

==================  ===============================================================
kind                files
==================  ===============================================================
fxgraph             ``fxgraph/<xx>/<f-key>/<content hash>``: a pickled CompiledFxGraph
aotautograd         ``aotautograd/<key>/<content hash>``: a pickled AOTAutogradResult
output_code         ``<xx>/c<51>.py``: generated Python wrapper ("output code")
triton_kernel       ``<xx>/c<51>.py`` containing ``@triton.jit`` (+ ``.best_config``)
cpp_kernel          ``<xx>/c<51>{.cpp,.so,.main.cpp,.main.so,.h,.o}``
gpu_kernel          ``<xx>/c<51>{.cubin,.ptx,.hsaco,.spv,.fatbin,.json}`` without a .py
triton_cache        ``triton/<device>/<hash>/``: one Triton compiler cache entry
autotune            ``cache/...`` (LocalCache JSON) and ``*.best_config`` files
aoti_build          ``c<51>/``: an AOTInductor build folder (``aoti.md``)
precompiled_header  ``precompiled_headers/...``
aoti_eager          ``aoti_eager/...``
dynamo              ``dynamo/...`` (PGO ``code_state_*``, DiskDynamoCache packages)
build_temp          ``gcc/...`` (cpp_builder helper output)
lock                ``locks/*.lock``
symlink             a symbolic link anywhere (listed, never followed)
other               anything else
==================  ===============================================================

The folder may be a URL of a filesystem that lists folders (``s3://``, ``gs://``,
``memory://`` ...): it is listed once, and only what the local walk reads is fetched (the
head of each ``.py`` / ``.cpp`` and the pickles, by range). A plain HTTP server cannot
list a folder: such a URL is a :class:`~torchless.core.errors.UsageError`.

Pickled entries (``fxgraph``, ``aotautograd``) are read only through torchless's pickle
machine with ``weights_only=False`` placeholders: every global becomes an inert
:class:`~torchless.pickle.globals.GlobalRef`, nothing is imported or called.
"""

from __future__ import annotations

import getpass
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import LimitError, NotFoundError, TorchlessError, UsageError
from ...io.store import FSSPEC, LOCAL, Store, resolve
from ...pickle.globals import AllowlistResolver, GlobalRef, PickledObject
from ...pickle.machine import Limits, Unpickler
from ...pickle.torch_globals import DEFAULT_ALLOWLIST
from .spec import CPP_EXT, GPU_EXT, PICKLED_KINDS, classify

__all__ = [
    "KINDS",
    "CacheEntry",
    "CacheFile",
    "CacheInventory",
    "default_cache_dir",
    "describe_pickle",
    "entry_source",
    "inventory",
    "resolve_cache_dir",
    "locate_cache_dir",
]

KINDS = (
    "fxgraph",
    "aotautograd",
    "output_code",
    "triton_kernel",
    "cpp_kernel",
    "gpu_kernel",
    "triton_cache",
    "autotune",
    "aoti_build",
    "precompiled_header",
    "aoti_eager",
    "dynamo",
    "build_temp",
    "lock",
    "symlink",
    "other",
)

#: ``"c"`` + 51 lower-case base32 characters (``cache_key.py``)
_CPP_EXT, _GPU_EXT = CPP_EXT, GPU_EXT
#: pickles larger than this are listed but not parsed
MAX_PICKLE_BYTES = 256 << 20
#: files read to classify a ``.py`` (Triton or not)
_SNIFF_BYTES = 1 << 16


def default_cache_dir() -> str:
    """``<tempfile.gettempdir()>/torchinductor_<sanitized user>`` (torch's default)."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        getuid = getattr(os, "getuid", None)
        user = f"uid_{getuid()}" if callable(getuid) else "unknown_user"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def resolve_cache_dir(path: Any = None) -> str:
    """The folder to inventory: ``path``, else ``$TORCHINDUCTOR_CACHE_DIR``, else the default.

    Like torch's ``cache_dir()`` the result is made absolute (an empty variable means the
    current folder); unlike it, nothing is created or exported.
    """
    return locate_cache_dir(path)[1]


def locate_cache_dir(path: Any) -> tuple[Store, str]:
    """``(store, folder)`` of :func:`resolve_cache_dir`: the location resolved once, here."""
    if path is not None:
        store, p = resolve(os.fspath(path))  # file:// URLs name a local folder
        if store.remote:
            from ...io import remote

            if not remote.listable(p):
                raise UsageError(
                    "this HTTP server does not list folders: a TorchInductor cache at a URL must be listed",
                    path=p,
                    hint="serve it from a store that lists folders (s3://, gs://, ...), or copy it here first",
                )
            return store, p.rstrip("/")
        return LOCAL, os.path.abspath(p)
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return LOCAL, os.path.abspath(env if env is not None else default_cache_dir())


@dataclass(frozen=True)
class CacheFile:
    """One file (or symlink) in the cache; ``rel`` is relative to the cache root, with ``/``."""

    rel: str
    size: int
    mtime: float
    is_symlink: bool = False


@dataclass
class CacheEntry:
    """A unit of the cache: the files one cache item consists of.

    Attributes:
        id: stable name of the entry (the relative path of its key file or folder).
        kind: one of :data:`KINDS`.
        files: its files.
        key: the cache key or hash the entry is stored under, when the layout names one.
        detail: extra facts (``isa_probe``, parsed pickle summary ...).
    """

    id: str
    kind: str
    files: list[CacheFile] = field(default_factory=list)
    key: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def mtime(self) -> float:
        """The newest modification time of its files (an entry is as young as its newest file)."""
        return max((f.mtime for f in self.files), default=0.0)

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        out: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "key": self.key,
            "size": self.size,
            "mtime": self.mtime,
            "age_s": round(max(0.0, now - self.mtime), 3),
            "files": [f.rel for f in self.files],
        }
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass
class CacheInventory:
    """Everything found under ``root``.

    Attributes:
        root: the absolute cache folder.
        entries: every entry, sorted by id.
        dirs: every folder below the root (relative), for prune's empty-folder cleanup.
        exists: False when the folder does not exist (an empty inventory).
        scanned_at: the time of the walk (ages are relative to it).
    """

    root: str
    entries: list[CacheEntry] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    exists: bool = True
    scanned_at: float = 0.0
    #: where the root's files live (the store :func:`inventory` resolved its location to)
    store: Store = field(default=LOCAL, repr=False, compare=False)

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    def by_kind(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for e in self.entries:
            d = out.setdefault(e.kind, {"entries": 0, "files": 0, "bytes": 0})
            d["entries"] += 1
            d["files"] += len(e.files)
            d["bytes"] += e.size
        return {k: out[k] for k in KINDS if k in out}

    def get(self, ident: str) -> CacheEntry:
        """The entry with id ``ident``, or the one owning the file ``ident`` (relative path)."""
        if self.store.remote and ident.startswith(self.root + "/"):
            ident = ident[len(self.root) + 1 :]
        elif os.path.isabs(ident) and not self.store.remote:
            rel = os.path.relpath(ident, self.root)
            if not rel.startswith(".."):
                ident = rel
        ident = ident.replace(os.sep, "/").strip("/")
        for e in self.entries:
            if e.id == ident or any(f.rel == ident for f in e.files):
                return e
        raise NotFoundError(f"no cache entry or file {ident!r}", path=self.root, hint="`torchless cache DIR` lists the entry ids")

    def to_dict(self, *, kind: str | None = None) -> dict[str, Any]:
        ents = [e for e in self.entries if kind is None or e.kind == kind]
        return {
            "root": self.root,
            "exists": self.exists,
            "entries": len(ents),
            "files": sum(len(e.files) for e in ents),
            "bytes": sum(e.size for e in ents),
            "by_kind": self.by_kind()
            if kind is None
            else {kind: self.by_kind().get(kind, {"entries": 0, "files": 0, "bytes": 0})},
            "items": [e.to_dict(self.scanned_at) for e in ents],
        }


# -- walking ---------------------------------------------------------------------------------
def _walk(store: Store, root: str, max_files: int) -> Iterator[tuple[str, int, float, bool, bool]]:
    """``(relative path, size, mtime, is_dir, is_link)`` for everything below ``root``,
    links not followed; sorted by name within a folder."""
    if store.remote:
        yield from _walk_url(root, max_files)
        return
    stack = [""]
    count = 0
    while stack:
        rel = stack.pop()
        full = os.path.join(root, rel) if rel else root
        try:
            it = list(os.scandir(full))
        except (PermissionError, FileNotFoundError, NotADirectoryError):
            continue
        for d in sorted(it, key=lambda d: d.name):
            count += 1
            if count > max_files:
                raise LimitError("cache folder has too many files to inventory", path=root, expected=f"<= {max_files}")
            r = f"{rel}/{d.name}" if rel else d.name
            try:
                st = d.stat(follow_symlinks=False)
            except FileNotFoundError:  # removed while walking (a concurrent compile)
                continue
            if stat.S_ISDIR(st.st_mode):
                yield r, st.st_size, st.st_mtime, True, False
                stack.append(r)
            else:
                yield r, st.st_size, st.st_mtime, False, stat.S_ISLNK(st.st_mode)


def _mtime(info: dict[str, Any]) -> float:
    """A listing entry's modification time, in the key each filesystem uses."""
    for k in ("mtime", "LastModified", "last_modified", "updated", "created", "modified"):
        v = info.get(k)
        if v is None:
            continue
        if hasattr(v, "timestamp"):
            return float(v.timestamp())
        try:
            return float(v)
        except (TypeError, ValueError):
            continue
    return 0.0


def _walk_url(root: str, max_files: int) -> Iterator[tuple[str, int, float, bool, bool]]:
    """:func:`_walk` for a URL: one recursive listing (object stores have no links)."""
    from ...io import remote

    fs, base = remote.filesystem(root)
    base = base.rstrip("/")
    try:
        found = fs.find(base, withdirs=True, detail=True)
    except FileNotFoundError:
        return
    out = []
    for name, info in found.items():
        rel = str(name).rstrip("/")[len(base) :].strip("/")
        if rel:
            out.append((rel, int(info.get("size") or 0), _mtime(info), info.get("type") == "directory", False))
    # an object store's folders are the prefixes of its objects, and a listing may leave
    # some out (s3fs lists the deepest ones): every ancestor of a file is a folder
    dirs = {r for r, _s, _m, d, _l in out if d}
    for r, _s, _m, _d, _l in list(out):
        parts = r.split("/")
        for i in range(1, len(parts)):
            a = "/".join(parts[:i])
            if a not in dirs:
                dirs.add(a)
                out.append((a, 0, 0.0, True, False))
    if len(out) > max_files:
        raise LimitError("cache folder has too many files to inventory", path=root, expected=f"<= {max_files}")
    yield from sorted(out)


_classify = classify


def _code_kind(store: Store, root: str, files: list[CacheFile], detail: dict[str, Any]) -> str:
    names = [f.rel.rsplit("/", 1)[-1] for f in files]
    py = [f for f, n in zip(files, names, strict=False) if n.endswith(".py")]
    if py:
        head = _read_head(store, root, py[0].rel)
        if head.startswith(b"# AOT ID:"):
            # output code; on GPU it embeds Triton kernel sources as strings, so this
            # test comes before the @triton.jit one
            detail["aot_id"] = head.split(b"\n", 1)[0][len(b"# AOT ID:") :].strip().decode("utf-8", "replace")
            return "output_code"
        if b"@triton.jit" in head or b"@triton_heuristics." in head:
            return "triton_kernel"
        return "output_code"
    if any(n.endswith(_CPP_EXT) for n in names):
        cpp = [f for f, n in zip(files, names, strict=False) if n.endswith(".cpp")]
        if cpp and b"_chk_kernel" in _read_head(store, root, cpp[0].rel):
            detail["isa_probe"] = True  # the CPU vector-ISA check compiled once per machine
        return "cpp_kernel"
    if any(n.endswith(_GPU_EXT) for n in names):
        return "gpu_kernel"
    return "other"


def _read_url(url: str, n: int) -> bytes:
    """The first ``n`` bytes of object ``url`` (one range request), counted in ``--stats``."""
    return FSSPEC.read_range(url, 0, n)


def _read_head(store: Store, root: str, rel: str, n: int = _SNIFF_BYTES) -> bytes:
    if store.remote:
        try:
            return _read_url(store.join(root, rel), n)
        except OSError:
            return b""
    try:
        fd = os.open(os.path.join(root, rel), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return b""
    try:
        return os.read(fd, n)
    finally:
        os.close(fd)


def inventory(
    path: Any = None,
    *,
    store: Store | None = None,
    parse_pickles: bool = True,
    max_files: int = 2_000_000,
    limits: Limits | None = None,
) -> CacheInventory:
    """Walk a cache folder and classify every file.

    Args:
        path: the cache folder (default: :func:`resolve_cache_dir`).
        store: the store holding ``path`` when the caller resolved it already:
            ``store, path = locate_cache_dir(...)`` (then ``path`` is not resolved again).
        parse_pickles: summarize ``fxgraph``/``aotautograd`` pickles (safe machine, placeholders).
        max_files: refuse folders with more entries than this.

    Returns:
        A :class:`CacheInventory` (``exists=False`` and empty when the folder is missing).

    Raises:
        UsageError: ``path`` is a file.
        LimitError: more than ``max_files`` entries.
    """
    if store is None or path is None:
        store, root = locate_cache_dir(path)
    else:
        root = os.fspath(path)
    inv = CacheInventory(root, scanned_at=time.time(), store=store)
    store = inv.store
    if store.remote:
        from ...io import remote

        if not remote.isdir(root):
            # present(), not exists(): a store that cannot answer must not make the
            # inventory an empty "no cache here"
            if remote.present(root, "cannot check the cache folder"):
                raise UsageError("the cache path is not a folder", path=root)
            inv.exists = False
            return inv
    elif not os.path.exists(root):
        inv.exists = False
        return inv
    elif not os.path.isdir(root):
        raise UsageError("the cache path is not a folder", path=root)
    groups: dict[str, CacheEntry] = {}
    for rel, size, mtime, is_dir, link in _walk(store, root, max_files):
        if is_dir:
            inv.dirs.append(rel)
            continue
        f = CacheFile(rel, size, mtime, link)
        if link:
            groups[rel] = CacheEntry(rel, "symlink", [f], None, {"target": _readlink(root, rel)})
            continue
        kind, ident, key = _classify(rel)
        ent = groups.get(ident)
        if ent is None:
            ent = groups[ident] = CacheEntry(ident, kind, [], key)
        ent.files.append(f)
    for ent in groups.values():
        ent.files.sort(key=lambda f: f.rel)
        if ent.kind == "code":
            ent.kind = _code_kind(store, root, ent.files, ent.detail)
        elif ent.kind == "triton_cache":
            ent.detail["kernels"] = sorted(
                {
                    f.rel.rsplit("/", 1)[-1].split(".", 1)[0]
                    for f in ent.files
                    if f.rel.endswith((".cubin", ".hsaco", ".spv", ".ptx", ".ttir"))
                }
            )
        if parse_pickles and ent.kind in PICKLED_KINDS:
            ent.detail.update(
                describe_pickle(store.join(root, ent.files[0].rel), limits=limits, size=ent.files[0].size, store=store)
            )
    inv.entries = sorted(groups.values(), key=lambda e: e.id)
    return inv


def _readlink(root: str, rel: str) -> str:
    try:
        return os.readlink(os.path.join(root, rel))
    except OSError:
        return "?"


# -- pickles ---------------------------------------------------------------------------------
def _load_pickle(
    path: str, limits: Limits | None, size: int | None = None, store: Store = LOCAL
) -> tuple[Any, AllowlistResolver, int]:
    url = store.remote
    if size is None:
        if url:
            from ...io import remote

            fs, p = remote.filesystem(path)
            size = int(fs.info(p).get("size") or 0)
        else:
            size = os.lstat(path).st_size
    if size > MAX_PICKLE_BYTES:
        raise LimitError("pickle too large to summarize", path=path, expected=f"<= {MAX_PICKLE_BYTES} bytes", found=size)
    if url:
        data = _read_url(path, size + 1)
    else:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            # read() preallocates its argument: ask for the file's size, not the limit
            data = fh.read(min(os.fstat(fh.fileno()).st_size, MAX_PICKLE_BYTES) + 1)
    resolver = AllowlistResolver(DEFAULT_ALLOWLIST, weights_only=False)
    up = Unpickler(data, resolver=resolver, limits=limits or Limits(max_input=MAX_PICKLE_BYTES), path=path)
    obj = up.load()
    return obj, resolver, up.info.protocol


def describe_pickle(path: str, *, limits: Limits | None = None, size: int | None = None, store: Store = LOCAL) -> dict[str, Any]:
    """What a pickled cache entry contains, without importing or calling anything.

    Returns a dict with ``object`` (the class the pickle would build), ``protocol``,
    ``attributes`` (names set on it), ``source_code_bytes`` when it carries generated
    code, ``globals`` (every global named) and ``globals_not_allowlisted`` (those torchless
    would refuse with ``weights_only=True``: they are placeholders here, never executed);
    or ``{"error": ...}`` when the bytes are not a valid pickle. ``store``: the store
    holding ``path`` (the inventory's).
    """
    try:
        obj, resolver, protocol = _load_pickle(path, limits, size, store)
    except TorchlessError as e:
        return {"error": str(e)}
    except OSError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    out: dict[str, Any] = {"protocol": protocol, "object": _type_name(obj)}
    attrs = _attrs(obj)
    if attrs:
        out["attributes"] = sorted(attrs)[:200]
        src = attrs.get("source_code")
        if isinstance(src, str):
            out["source_code_bytes"] = len(src.encode("utf-8", "surrogatepass"))
        for k in ("cache_key", "guards_expr"):
            v = attrs.get(k)
            if isinstance(v, str):
                out[k] = v[:500]
    names = sorted({g for g, _ok in resolver.seen})
    out["globals"] = names[:500]
    out["globals_not_allowlisted"] = sorted({g for g, ok in resolver.seen if not ok})[:500]
    return out


def _type_name(obj: Any) -> str:
    if isinstance(obj, PickledObject):
        return obj.class_name
    if isinstance(obj, GlobalRef):
        return f"<global {obj.qualname}>"
    return type(obj).__name__


def _attrs(obj: Any) -> dict[str, Any]:
    if isinstance(obj, PickledObject):
        a = obj.attrs
        if not a and obj.args and isinstance(obj.args[-1], dict):
            a = obj.args[-1]
        return {str(k): v for k, v in a.items()} if isinstance(a, dict) else {}
    if isinstance(obj, dict):
        return {str(k): v for k, v in obj.items()}
    return {}


def _find_source(obj: Any, depth: int = 0) -> str | None:
    """The generated module text a pickled entry carries (``source_code``), if any."""
    attrs = _attrs(obj)
    src = attrs.get("source_code")
    if isinstance(src, str):
        return src
    if depth < 3:
        for v in attrs.values():
            if isinstance(v, (PickledObject, dict)):
                s = _find_source(v, depth + 1)
                if s is not None:
                    return s
    return None


def entry_source(inv: CacheInventory, ident: str, *, max_bytes: int = 64 << 20) -> tuple[str, str]:
    """``(file, text)`` to show for an entry or file: a kernel's source (``.py``/``.cpp``),
    a JSON/text file, or the ``source_code`` carried by a pickled FX graph entry.

    Raises:
        NotFoundError: no such entry or file.
        UnsupportedError: the entry holds only binaries (``.so``, ``.cubin``).
    """
    from ...core.errors import UnsupportedError

    ent = inv.get(ident)
    ident_n = ident.replace(os.sep, "/").strip("/")
    chosen = next((f for f in ent.files if f.rel == ident_n or ident_n.endswith("/" + f.rel)), None)
    if ent.kind in PICKLED_KINDS and (chosen is None or chosen == ent.files[0]):
        obj, _res, _p = _load_pickle(inv.store.join(inv.root, ent.files[0].rel), None, ent.files[0].size, inv.store)
        src = _find_source(obj)
        if src is None:
            raise UnsupportedError(
                "this pickled entry carries no source code",
                path=inv.root,
                member=ent.id,
                hint="`torchless cache --json` shows what it contains",
            )
        return ent.files[0].rel, src
    if chosen is None:
        order = (".py", ".cpp", ".main.cpp", ".h", ".ttir", ".ttgir", ".llir", ".ptx", ".json", ".best_config", ".txt", ".lock")
        for suf in order:
            chosen = next((f for f in ent.files if f.rel.endswith(suf)), None)
            if chosen is not None:
                break
        if chosen is None:
            chosen = ent.files[0]
    if chosen.is_symlink:
        raise UnsupportedError("refusing to follow a symbolic link", path=inv.root, member=chosen.rel)
    if chosen.size > max_bytes:
        raise LimitError(
            "file too large to show", path=inv.root, member=chosen.rel, expected=f"<= {max_bytes} bytes", found=chosen.size
        )
    data = _read_head(inv.store, inv.root, chosen.rel, max_bytes + 1)
    if b"\0" in data[:8192] or data[:4] == b"\x7fELF":
        raise UnsupportedError(f"{chosen.rel} is a binary file ({chosen.size} bytes)", path=inv.root, member=chosen.rel)
    return chosen.rel, data.decode("utf-8", "replace")
