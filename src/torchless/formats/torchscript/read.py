"""Reading TorchScript archives (``torch.jit.save``, ``.pt``/``.ptl``) without torch.

Spec: ``torchscript.md``. The pickles (``data.pkl``, ``constants.pkl``, ``bytecode.pkl``,
``traced_inputs.pkl``, ``*.debug_pkl``) run in torchless's pickle machine with
:data:`TORCHSCRIPT_ALLOWLIST`; ``__torch__.*`` classes become :class:`ScriptObject`
instances (the class is *compiled from the archive's code* by torch, never imported, so
the name alone is safe to honour); nothing the archive names is imported or called.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ...container.zip import RecordLoader, ZipEntry, ZipReader
from ...core.errors import FormatError, NotFoundError, TorchlessError, TruncatedError, UnsupportedError, short_repr
from ...core.tensor import Storage, Tensor
from ...core.values import StateDict, StorageType
from ...io.source import ByteSource
from ...pickle.globals import Allowlist, AllowlistResolver, Rebuilder
from ...pickle.machine import Limits, Unpickler
from ...pickle.torch_globals import DEFAULT_ALLOWLIST
from ..pt.read import CHECKPOINT_ALLOWLIST, _pid_parts
from . import spec
from .bytecode import Bytecode, parse_bytecode
from .code import ClassSource, CodeFile, FunctionSource, parse_code_file
from .spec import is_torchscript_zip  # noqa: F401 - re-exported

__all__ = [
    "TORCHSCRIPT_ALLOWLIST",
    "ScriptObject",
    "TorchScriptArchive",
    "TorchScriptResolver",
    "read_archive",
    "is_torchscript_zip",
]


# -- the C++ pickler's globals ---------------------------------------------------------
def _typed_list(name: str, kinds: tuple[type, ...]) -> Rebuilder:
    def call(args: tuple) -> Any:
        if len(args) != 1 or not isinstance(args[0], list):
            raise FormatError(f"{name} takes one list", found=short_repr(args, 60))
        for v in args[0]:
            if not isinstance(v, kinds):
                raise FormatError(f"{name}: element of the wrong type", found=type(v).__name__)
        return args[0]

    return Rebuilder(name, call)


def _restore_type_tag(args: tuple) -> Any:
    if len(args) != 2 or not isinstance(args[1], str):
        raise FormatError("restore_type_tag takes (value, type string)", found=short_repr(args, 60))
    return args[0]


def _ts_table() -> Allowlist:
    al = Allowlist("torchscript")
    al.add(
        "torch.jit._pickle.build_intlist",
        _typed_list("torch.jit._pickle.build_intlist", (int,)),
        "identity on a List[int] (TorchScript type tag)",
    )
    al.add(
        "torch.jit._pickle.build_doublelist",
        _typed_list("torch.jit._pickle.build_doublelist", (float, int)),
        "identity on a List[float] (TorchScript type tag)",
    )
    al.add(
        "torch.jit._pickle.build_boollist",
        _typed_list("torch.jit._pickle.build_boollist", (bool,)),
        "identity on a List[bool] (TorchScript type tag)",
    )
    al.add(
        "torch.jit._pickle.build_tensorlist",
        _typed_list("torch.jit._pickle.build_tensorlist", (Tensor, type(None))),
        "identity on a List[Tensor] (TorchScript type tag)",
    )
    al.add(
        "torch.jit._pickle.restore_type_tag",
        Rebuilder("torch.jit._pickle.restore_type_tag", _restore_type_tag),
        "returns its value; the second argument is only a type string",
    )
    for sname, dt in spec.SCALAR_TYPE_DTYPES.items():
        if f"torch.{sname}" not in DEFAULT_ALLOWLIST:
            al.add(f"torch.{sname}", StorageType(sname, dt), "a C++-pickler storage class marker carrying its dtype")
    return al


#: the globals TorchScript archives use, on top of torchless's default allowlist.
TORCHSCRIPT_ALLOWLIST = CHECKPOINT_ALLOWLIST.merged(_ts_table(), name="torchscript")


class ScriptObject:
    """An object of a TorchScript class (``__torch__.…``): a module or a class instance.

    Built from ``GLOBAL '__torch__ <Class>'`` + ``NEWOBJ`` + ``BUILD`` without running
    anything; the class's declarations come from the archive's ``code/``.

    Attributes:
        qualified_name: the TorchScript class name (``__torch__.torch.nn.modules.linear.Linear``).
        attrs: the attributes in slot order (what BUILD set), for modules and classes
            whose state is a dict.
        state: the BUILD state when it is not a dict (classes with ``__getstate__``,
            custom C++ classes such as ``LinearPackedParamsBase``).
        args: what the pickle passed to the class: the value of an enum member
            (``GLOBAL '__torch__ Color' K2 REDUCE``), empty for objects.
        class_source: the parsed class from ``code/``, or None when the archive has none.
    """

    __slots__ = ("qualified_name", "attrs", "state", "args", "class_source", "__weakref__")

    def __init__(self, qualified_name: str, args: tuple = ()) -> None:
        self.qualified_name = qualified_name
        self.attrs: dict[str, Any] = {}
        self.state: Any = None
        self.args = args
        self.class_source: ClassSource | None = None

    def __torchless_build__(self, state: Any) -> ScriptObject:
        if isinstance(state, dict):
            self.attrs.update({str(k): v for k, v in state.items()})
        else:
            self.state = state
        return self

    # -- structure ---------------------------------------------------------------------
    @property
    def original_name(self) -> str:
        """The class name without its module (``Linear``), as torch's ``original_name``."""
        return self.qualified_name.rsplit(".", 1)[-1]

    @property
    def value(self) -> Any:
        """An enum member's value (``Color.GREEN`` -> 2); None for other objects."""
        return self.args[0] if len(self.args) == 1 else None

    @property
    def is_module(self) -> bool:
        if self.class_source is not None:
            return self.class_source.is_module
        return "training" in self.attrs

    @property
    def parameter_names(self) -> list[str]:
        return list(self.class_source.parameters) if self.class_source else []

    @property
    def buffer_names(self) -> list[str]:
        return list(self.class_source.buffers) if self.class_source else []

    def _kind(self, name: str) -> str:
        v = self.attrs.get(name)
        cs = self.class_source
        if cs is not None:
            if name in cs.parameter_set:
                return "parameter"
            if name in cs.buffer_set:
                return "buffer"
        if isinstance(v, ScriptObject) and v.is_module:
            return "module"
        return "attribute"

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        yield from self._named("parameter", prefix, recurse)

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        yield from self._named("buffer", prefix, recurse)

    def _named(self, kind: str, prefix: str, recurse: bool) -> Iterator[tuple[str, Tensor]]:
        seen: set[int] = set()
        for mprefix, mod in self.named_modules(prefix) if recurse else [(prefix, self)]:
            for k, v in mod.attrs.items():
                if isinstance(v, Tensor) and mod._kind(k) == kind and id(v) not in seen:
                    seen.add(id(v))
                    yield (f"{mprefix}.{k}" if mprefix else k), v

    def named_children(self) -> Iterator[tuple[str, ScriptObject]]:
        for k, v in self.attrs.items():
            if isinstance(v, ScriptObject) and v.is_module:
                yield k, v

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, ScriptObject]]:
        """Every module, depth-first, each once (like ``nn.Module.named_modules``)."""
        seen: set[int] = set()
        stack: list[tuple[str, ScriptObject]] = [(prefix, self)]
        while stack:
            p, m = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield p, m
            kids = [(f"{p}.{k}" if p else k, v) for k, v in m.named_children()]
            stack.extend(reversed(kids))

    def state_dict(self, prefix: str = "") -> StateDict:
        """What ``torch.jit.load(path).state_dict()`` returns: parameters then buffers
        of each module (slot order), then its submodules; None values skipped, shared
        tensors under every name."""
        out = StateDict()
        # a module shared under two names appears under both (as in torch); a module
        # containing itself (only a hostile file can say so) is refused
        stack: list[tuple[str, ScriptObject, int]] = [(prefix, self, 0)]
        visits = 0
        while stack:
            p, m, depth = stack.pop()
            visits += 1
            if depth > 1000 or visits > 1_000_000:
                raise FormatError(
                    "module tree nested too deeply, too large or cyclic",
                    expected="<= 1000 levels",
                    found=f"{(p or '<root>')[:80]} at depth {depth}",
                )
            for kind in ("parameter", "buffer"):
                for k, v in m.attrs.items():
                    if isinstance(v, Tensor) and m._kind(k) == kind:
                        out[p + k] = v
            kids = [(f"{p}{k}.", v, depth + 1) for k, v in m.named_children()]
            stack.extend(reversed(kids))
        return out

    # -- source ------------------------------------------------------------------------
    @property
    def methods(self) -> list[str]:
        return list(self.class_source.methods) if self.class_source else []

    def method_source(self, name: str) -> FunctionSource:
        if self.class_source is None or name not in self.class_source.methods:
            raise NotFoundError(f"{self.qualified_name} has no method {name!r}", expected=", ".join(self.methods) or "no methods")
        return self.class_source.methods[name]

    @property
    def code(self) -> str:
        """The ``forward`` method as ``torch.jit.load(path).code`` prints it."""
        return self.method_source("forward").code

    # -- attribute access ----------------------------------------------------------------
    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        attrs = object.__getattribute__(self, "attrs")
        if item in attrs:
            return attrs[item]
        raise AttributeError(item)

    def __getitem__(self, item: str) -> Any:
        return self.attrs[item]

    def __repr__(self) -> str:
        if self.args:
            return f"<TorchScript {self.qualified_name}{self.args!r}>"
        kind = "module" if self.is_module else "object"
        return f"<TorchScript {kind} {self.qualified_name}>"

    def __reduce__(self) -> Any:
        raise TypeError("ScriptObject placeholders cannot be pickled")


class TorchScriptResolver:
    """Resolve the C++ pickler's GLOBALs: ``__torch__.*`` classes to :class:`ScriptObject`
    makers, the rest through :data:`TORCHSCRIPT_ALLOWLIST` (refused or placeholders)."""

    def __init__(
        self, weights_only: bool = True, extra: dict[str, Any] | None = None, allowlist: Allowlist | None = None
    ) -> None:
        self.inner = AllowlistResolver(allowlist or TORCHSCRIPT_ALLOWLIST, weights_only=weights_only, extra=dict(extra or {}))
        self._classes: dict[str, Rebuilder] = {}

    @property
    def seen(self) -> list[tuple[str, bool]]:
        return self.inner.seen

    def resolve(self, module: str, name: str) -> Any:
        if module == "__torch__" or module.startswith("__torch__."):
            qual = f"{module}.{name}"
            self.inner.seen.append((qual, True))
            rb = self._classes.get(qual)
            if rb is None:
                # enums are written as GLOBAL '__torch__ <Enum>' <value> REDUCE: a bare argument
                rb = Rebuilder(
                    qual,
                    partial(ScriptObject, qual),
                    lambda args, kw: ScriptObject(qual, args),
                    wraps_single_arg=True,
                )
                self._classes[qual] = rb
            return rb
        return self.inner.resolve(module, name)


# -- the archive -----------------------------------------------------------------------
@dataclass
class TorchScriptArchive:
    """A parsed TorchScript archive.

    Attributes:
        module: the root :class:`ScriptObject` (``data.pkl``).
        constants: the tuple of ``constants.pkl`` (``CONSTANTS.cN`` in code).
        code: code record -> :class:`~torchless.formats.torchscript.code.CodeFile`.
        classes: qualified class name -> :class:`ClassSource`.
        extra: extra file name -> zip entry (read with :meth:`extra_file`).
        records: small metadata records (``version``, ``byteorder``, ...).
        storages: ``"data/0"``-style record -> Storage, for every tensor read.
        globals_seen: every global the pickles named, with whether it was allowed.
        zip: the open :class:`~torchless.container.zip.ZipReader`.
    """

    module: Any
    constants: Any
    code: dict[str, CodeFile]
    classes: dict[str, ClassSource]
    extra: dict[str, ZipEntry]
    records: dict[str, str]
    storages: dict[str, Storage] = field(default_factory=dict)
    globals_seen: list[tuple[str, bool]] = field(default_factory=list)
    zip: ZipReader | None = None
    weights_only: bool = True
    limits: Limits = Limits()

    @property
    def prefix(self) -> str:
        return self.zip.prefix if self.zip else ""

    @property
    def file_format_version(self) -> int | None:
        for r in spec.VERSION_RECORDS:
            if r in self.records:
                try:
                    return int(self.records[r].strip())
                except ValueError:
                    return None
        return None

    @property
    def is_lite(self) -> bool:
        return self.zip is not None and self.zip.lookup(spec.BYTECODE_PKL) is not None

    def extra_file(self, name: str) -> bytes:
        """The bytes of extra file ``name`` (``_extra_files`` key)."""
        e = self.extra.get(name)
        if e is None or self.zip is None:
            raise NotFoundError(f"no extra file {name!r}", expected=", ".join(self.extra) or "no extra files")
        return self.zip.read_bytes(e)

    def function(self, qualified_name: str) -> FunctionSource:
        """A method (``__torch__.M.forward``) or free function by qualified name."""
        owner, _, name = qualified_name.rpartition(".")
        cs = self.classes.get(owner)
        if cs is not None and name in cs.methods:
            return cs.methods[name]
        for cf in self.code.values():
            if cf.module == owner and name in cf.functions:
                return cf.functions[name]
        raise NotFoundError(f"no method or function {qualified_name!r} in the archive's code")

    def debug_info(self, code_record: str) -> Any:
        """The parsed ``<code record>.debug_pkl`` source-range table (data only, §4)."""
        assert self.zip is not None
        return load_pickle(self.zip, code_record + spec.DEBUG_SUFFIX, (), TorchScriptResolver(True), {}, self.limits)

    def bytecode(self) -> Bytecode:
        """The lite-interpreter bytecode: ``bytecode.pkl`` read and parsed (tensors shared
        with ``constants.pkl``/``data.pkl`` are the same Storage objects).

        Raises:
            NotFoundError: not a lite-interpreter archive (no ``bytecode.pkl``).
        """
        zr = self.zip
        assert zr is not None
        if zr.lookup(spec.BYTECODE_PKL) is None:
            raise NotFoundError("not a lite-interpreter archive: no bytecode.pkl", path=zr.path)
        # version 4 wrote bytecode tensors to bytecode/, later versions share constants/
        head = zr.read(spec.BYTECODE_PKL)[:4].tobytes()
        old = len(head) >= 4 and head[2] == 0x4B and head[3] <= 4
        dirs = (
            (spec.BYTECODE_DIR, spec.CONSTANTS_DIR, spec.DATA_DIR)
            if old
            else (spec.CONSTANTS_DIR, spec.BYTECODE_DIR, spec.DATA_DIR)
        )
        try:
            value = load_pickle(zr, spec.BYTECODE_PKL, dirs, TorchScriptResolver(self.weights_only), self.storages, self.limits)
            return parse_bytecode(value)
        except TorchlessError as e:
            e.with_context(path=zr.path, member=f"{zr.prefix}/{spec.BYTECODE_PKL}")
            raise

    def traced_inputs(self) -> Any:
        """``traced_inputs.pkl`` (example inputs of ``torch.jit.trace``) or None.

        torch writes empty storage records for these, so their tensors have no data
        (``Tensor.storage is None``).
        """
        assert self.zip is not None
        if self.zip.lookup(spec.TRACED_INPUTS_PKL) is None:
            return None
        return load_pickle(
            self.zip,
            spec.TRACED_INPUTS_PKL,
            (spec.TRACED_INPUTS_DIR,),
            TorchScriptResolver(self.weights_only),
            {},
            self.limits,
            allow_short=True,
        )

    def close(self) -> None:
        if self.zip is not None:
            self.zip.source.close()


def _head(st: Storage, n: int) -> memoryview:
    """The first ``n`` bytes of ``st`` (a storage record read as a shorter storage)."""
    return st.bytes()[:n]


def load_pickle(
    zr: ZipReader,
    name: str,
    dirs: tuple[str, ...],
    resolver: TorchScriptResolver,
    storages: dict[str, Storage],
    limits: Limits = Limits(),
    *,
    allow_short: bool = False,
) -> Any:
    """Unpickle record ``name``; storage keys are looked up in ``dirs`` in order.

    ``storages`` caches Storage objects by record name, so pickles sharing a record
    (``bytecode.pkl`` and ``constants.pkl``) share the Storage.
    """
    byteorder = "little"
    bo = zr.lookup(spec.BYTEORDER)
    if bo is not None and bo.size <= 16:
        byteorder = zr.read_bytes(bo).decode("ascii", "replace").strip() or "little"
        if byteorder not in ("little", "big"):
            raise FormatError(
                "unknown byte order record",
                path=zr.path,
                member=spec.BYTEORDER,
                expected="'little' or 'big'",
                found=short_repr(byteorder),
            )

    def persistent_load(pid: Any) -> Any:
        stype, key, location, numel, _view = _pid_parts(pid)
        dtype = stype.dtype
        if dtype is None:
            raise FormatError("TorchScript storages are typed", path=zr.path, member=name, found=stype.name)
        entry = None
        rec = ""
        for d in dirs:
            rec = f"{d}/{key}"
            entry = zr.lookup(rec)
            if entry is not None:
                break
        nbytes = numel * dtype.itemsize
        if entry is None:
            raise FormatError(
                "archive references a storage record that does not exist",
                path=zr.path,
                member=f"{zr.prefix}/{dirs[0] if dirs else 'data'}/{key}",
            )
        st = storages.get(rec)
        if st is not None:
            if st.nbytes != nbytes or st.dtype is not dtype:
                return Storage(
                    key,
                    nbytes,
                    dtype,
                    location,
                    loader=partial(_head, st, nbytes),
                    byteorder=byteorder,
                    origin=entry.name,
                )
            return st
        if entry.size < nbytes:
            if allow_short:
                return _NoData(dtype, location)
            raise TruncatedError(
                "storage record smaller than its declared size",
                path=zr.path,
                member=entry.name,
                expected=f"{nbytes} bytes",
                found=f"{entry.size} bytes",
            )

        st = Storage(key, nbytes, dtype, location, loader=RecordLoader(zr, entry, nbytes), byteorder=byteorder, origin=entry.name)
        storages[rec] = st
        return st

    e = zr.lookup(name)
    if e is None:
        raise NotFoundError(f"archive has no {name}", path=zr.path, member=f"{zr.prefix}/{name}")
    data = zr.read(e, max_size=limits.max_input)
    up = Unpickler(data, resolver=resolver, persistent_load=persistent_load, limits=limits, path=zr.path, member=e.name)
    return up.load()


class _NoData(Storage):
    """A storage whose record torch left empty (traced example inputs)."""

    def __init__(self, dtype: Any, location: str) -> None:
        super().__init__("", 0, dtype, location)


def _small_records(zr: ZipReader) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in spec.SMALL_RECORDS:
        e = zr.lookup(name)
        if e is not None and e.size <= 256:
            out[name] = zr.read_bytes(e).decode("utf-8", "replace")
    return out


def read_code(zr: ZipReader, limits: Limits = Limits()) -> tuple[dict[str, CodeFile], dict[str, ClassSource]]:
    """Parse every ``code/*.py`` record."""
    code: dict[str, CodeFile] = {}
    classes: dict[str, ClassSource] = {}
    for rec in zr.records():
        if not rec.startswith(spec.CODE_DIR) or not rec.endswith(".py"):
            continue
        module = spec.module_of_code_record(rec)
        if module is None:
            continue
        e = zr.lookup(rec)
        if e is None:
            continue
        text = zr.read_bytes(e, max_size=min(limits.max_input, 1 << 30)).decode("utf-8", "replace")
        cf = parse_code_file(rec, module, text)
        code[rec] = cf
        for cs in cf.classes.values():
            classes[cs.qualified_name] = cs
    return code, classes


def _attach_classes(root: Any, classes: dict[str, ClassSource], limit: int = 50_000_000) -> None:
    """Give every ScriptObject reachable from ``root`` its parsed class (iteratively)."""
    seen: set[int] = set()
    stack = [root]
    n = 0
    while stack:
        x = stack.pop()
        n += 1
        if n > limit:
            raise FormatError("object tree too large")
        if id(x) in seen:
            continue
        if isinstance(x, ScriptObject):
            seen.add(id(x))
            x.class_source = classes.get(x.qualified_name)
            if x.class_source is not None:
                for pname in x.class_source.parameters:
                    t = x.attrs.get(pname)
                    if isinstance(t, Tensor):
                        t.is_parameter = True  # torch.nn.Parameter in the loaded module
            stack.extend(x.attrs.values())
            if x.state is not None:
                stack.append(x.state)
        elif isinstance(x, (list, tuple)):
            seen.add(id(x))
            stack.extend(x)
        elif isinstance(x, dict):
            seen.add(id(x))
            stack.extend(x.values())


def read_archive(
    source: ByteSource | ZipReader,
    *,
    weights_only: bool = True,
    limits: Limits = Limits(),
    extra_globals: dict[str, Any] | None = None,
) -> TorchScriptArchive:
    """Parse a TorchScript archive: module tree, constants, code and extra files.

    Args:
        source: the file (a :class:`~torchless.io.source.ByteSource`) or an open zip.
        weights_only: refuse globals outside :data:`TORCHSCRIPT_ALLOWLIST` (the
            default); with False they become inert placeholders. Nothing is ever run.

    Raises:
        UnsafeGlobalError: a pickle names a global that is not allowed.
        FormatError / TruncatedError / LimitError: a malformed archive.
        UnsupportedError: file format versions torch 2.13 cannot read either.
    """
    zr = source if isinstance(source, ZipReader) else ZipReader(source)
    try:
        records = _small_records(zr)
        if zr.lookup(spec.DATA_PKL) is None:
            if zr.lookup("model.json") is not None:
                raise UnsupportedError("legacy (torch < 1.3) TorchScript archive with model.json", path=zr.path)
            raise FormatError("TorchScript archive has no data.pkl", path=zr.path, member=f"{zr.prefix}/data.pkl")
        for r in spec.VERSION_RECORDS:
            if r in records:
                try:
                    v = int(records[r].strip())
                except ValueError:
                    raise FormatError(
                        "version record is not a number", path=zr.path, member=r, found=short_repr(records[r], 20)
                    ) from None
                if not spec.MIN_FILE_FORMAT_VERSION <= v <= spec.MAX_FILE_FORMAT_VERSION:
                    raise UnsupportedError(
                        "TorchScript file format version out of range",
                        path=zr.path,
                        member=r,
                        expected=f"{spec.MIN_FILE_FORMAT_VERSION}..{spec.MAX_FILE_FORMAT_VERSION}",
                        found=v,
                    )
        resolver = TorchScriptResolver(weights_only, extra_globals)
        storages: dict[str, Storage] = {}
        constants: Any = ()
        if zr.lookup(spec.CONSTANTS_PKL) is not None:
            constants = load_pickle(zr, spec.CONSTANTS_PKL, (spec.CONSTANTS_DIR,), resolver, storages, limits)
        module = load_pickle(zr, spec.DATA_PKL, (spec.DATA_DIR,), resolver, storages, limits)
        code, classes = read_code(zr, limits)
        _attach_classes(module, classes)
        _attach_classes(constants, classes)
        extra = {}
        for rec in zr.records():
            if rec.startswith(spec.EXTRA_DIR):
                e = zr.lookup(rec)
                if e is not None:
                    extra[rec[len(spec.EXTRA_DIR) :]] = e
        return TorchScriptArchive(
            module, constants, code, classes, extra, records, storages, list(resolver.seen), zr, weights_only, limits
        )
    except TorchlessError as e:
        e.with_context(path=zr.path)
        raise
