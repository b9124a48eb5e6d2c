"""What every format handler provides, and the lazy handle it returns.

A :class:`FormatHandler` knows one artifact kind: how to recognize it (:meth:`sniff` on a
:class:`Probe`), how to open it as an :class:`Artifact`, and optionally how to write
tensors in it. The CLI's generic commands (``info``, ``ls``, ``convert``, ``diff``,
``verify``) only use these two contracts, so every format gets them.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from stat import S_ISDIR
from typing import Any, ClassVar, TypeVar

from ..container.zip import ZipReader, is_zip
from ..core.errors import NotFoundError, TorchlessError, UsageError
from ..core.findings import Problem
from ..core.tensor import Tensor
from ..core.values import GlobalRef
from ..pickle.machine import Limits

__all__ = [
    "CAPABILITIES",
    "ZIP_CRC",
    "CAPABILITY_TEXT",
    "Artifact",
    "Capabilities",
    "FormatHandler",
    "LoadPolicy",
    "Probe",
    "Problem",
    "accepted_options",
    "check_options",
    "summarize_tensors",
]


@dataclass(frozen=True)
class LoadPolicy:
    """How an artifact is read: decided once, when it is opened, and held to after.

    Give it to :func:`torchless.open` / :func:`torchless.load` as ``policy=``, or give its
    fields as keyword options (``weights_only=False``); both at once must agree. Every
    format takes every field; a format without pickles has nothing to apply
    ``weights_only``, ``allowed_globals`` or ``encoding`` to, and one that is not memory
    mapped ignores ``mmap``.

    Attributes:
        weights_only: refuse (``UnsafeGlobalError``) any global not on torchless's
            allowlist; with False, unknown globals become inert placeholders. Nothing a
            file names is imported or called either way.
        limits: bounds for every pickle read (:class:`~torchless.pickle.machine.Limits`).
        allowed_globals: ``"module.name"`` globals to accept under ``weights_only`` as
            inert placeholders (:class:`~torchless.pickle.globals.GlobalRef`) instead of
            refusing them, like torch's ``add_safe_globals`` without importing anything.
        mmap: map storages from the file (True) or read each into its own buffer.
        encoding: how Python-2 ``str`` pickles are decoded (``torch.load(encoding=)``).

    Raises:
        UsageError: a field of the wrong type.
    """

    weights_only: bool = True
    limits: Limits = field(default_factory=Limits)
    allowed_globals: frozenset[str] = frozenset()
    mmap: bool = True
    encoding: str = "utf-8"

    def __post_init__(self) -> None:
        for k in ("weights_only", "mmap"):
            if type(getattr(self, k)) is not bool:
                raise UsageError(f"{k} must be True or False", found=repr(getattr(self, k))[:40])
        if not isinstance(self.limits, Limits):
            raise UsageError("limits must be a torchless.Limits", found=type(self.limits).__name__)
        if not isinstance(self.encoding, str):
            raise UsageError("encoding must be a str", found=type(self.encoding).__name__)
        names = self.allowed_globals
        if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
            raise UsageError('allowed_globals must be a collection of "module.name" strings', found=repr(names)[:40])
        names = frozenset(names)
        bad = sorted(repr(n)[:40] for n in names if not isinstance(n, str) or "." not in n.strip("."))
        if bad:
            raise UsageError('allowed_globals holds names that are not "module.name"', found=", ".join(bad[:4]))
        object.__setattr__(self, "allowed_globals", names)

    def extra_globals(self) -> dict[str, Any]:
        """``{"module.name": placeholder}`` for the pickle resolver's ``extra``."""
        out: dict[str, Any] = {}
        for qual in self.allowed_globals:
            module, _, name = qual.rpartition(".")
            out[qual] = GlobalRef(module, name)
        return out


#: the policy's field names: every handler's ``open`` accepts them
LOAD_POLICY_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(LoadPolicy))
#: what every handler's ``open`` accepts: the policy's fields
OPEN_OPTIONS: tuple[str, ...] = LOAD_POLICY_FIELDS
#: what every writer (``save`` / ``write_tensors``) accepts
WRITE_OPTIONS: tuple[str, ...] = ("progress",)

#: the capability flags of :class:`Capabilities`, in the order listings show them
#: the :attr:`Capabilities.checksum` of the zip containers torch writes
ZIP_CRC = "zip CRC-32 of every record"

CAPABILITIES: tuple[str, ...] = ("read", "list", "verify", "write_tensors", "write_objects", "edit")


@dataclass(frozen=True)
class Capabilities:
    """What a format handler can do, declared once on its class (never probed).

    The API and the CLI ask this declaration before they call a handler, and derive
    their error messages ("npz cannot store objects; formats that can: pt, pt2") from
    the declarations of every registered handler.

    Attributes:
        read: ``open`` returns an :class:`Artifact` whose ``load()`` gives the object tree.
        list: the artifact lists its tensors (``tensors()``, ``ls``).
        verify: the artifact checks its structure and payloads (``verify()``).
        write_tensors: the handler writes ``(name, tensor)`` pairs (``write_tensors``,
            the destination of ``convert``).
        write_objects: the handler writes whole object trees (``save``: nested dicts,
            numbers, strings... besides tensors).
        edit: an existing artifact's weights can be replaced in a new file
            (``set-weights``), keeping everything else.
        open_options: the handler's own ``open`` options, besides the load policy
            (:data:`OPEN_OPTIONS`).
        write_options: the handler's own writer options, besides :data:`WRITE_OPTIONS`.
        checksum: what the format's own integrity check covers (``verify`` checks it),
            or ``""``: the format carries no checksum, so a flipped payload byte passes
            ``verify`` unseen (``verify --sha256``/``--manifest`` compare digests).
    """

    read: bool = True
    list: bool = True
    verify: bool = True
    write_tensors: bool = False
    write_objects: bool = False
    edit: bool = False
    open_options: tuple[str, ...] = ()
    write_options: tuple[str, ...] = ()
    checksum: str = ""

    def flags(self) -> tuple[str, ...]:
        """The names of the capabilities that are declared true, in :data:`CAPABILITIES` order."""
        return tuple(c for c in CAPABILITIES if getattr(self, c))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: every flag, and the option names."""
        return {
            **{c: bool(getattr(self, c)) for c in CAPABILITIES},
            "open_options": list(accepted_options(self, "open")),
            "write_options": list(accepted_options(self, "write")) if self.write_tensors or self.write_objects else [],
            "checksum": self.checksum or None,
        }


def _capabilities_of(h: Any) -> Capabilities:
    if isinstance(h, Capabilities):
        return h
    caps = getattr(h, "capabilities", None)
    if not isinstance(caps, Capabilities):
        raise TypeError(f"format handler {getattr(h, 'name', h)!r} declares no Capabilities")
    return caps


def accepted_options(h: Any, kind: str) -> tuple[str, ...]:
    """The option names handler ``h`` (or a :class:`Capabilities`) accepts for ``kind``
    (``"open"`` or ``"write"``): the common ones plus the declared ``open_options`` /
    ``write_options``."""
    caps = _capabilities_of(h)
    own = caps.open_options if kind == "open" else caps.write_options
    common = OPEN_OPTIONS if kind == "open" else WRITE_OPTIONS
    return tuple(sorted(set(common) | set(own)))


def resolve_policy(
    h: Any, policy: LoadPolicy | None, given: Mapping[str, Any], *, path: Any = None
) -> tuple[LoadPolicy, dict[str, Any]]:
    """The one :class:`LoadPolicy` of an ``open`` call, and the handler's own options.

    ``given`` are the keyword options of the call: the policy's fields, and the options
    handler ``h`` declares (``capabilities.open_options``).

    Raises:
        UsageError: an option ``h`` does not take (naming the accepted ones), a policy
            that is not a :class:`LoadPolicy`, or a keyword option that contradicts the
            ``policy`` given with it.
    """
    check_options(h, "open", given, path=path)
    fields_given = {k: v for k, v in given.items() if k in LOAD_POLICY_FIELDS}
    own = {k: v for k, v in given.items() if k not in LOAD_POLICY_FIELDS}
    if policy is None:
        return LoadPolicy(**fields_given), own
    if not isinstance(policy, LoadPolicy):
        raise UsageError("policy must be a torchless.LoadPolicy", path=path, found=type(policy).__name__)
    merged = replace(policy, **fields_given)
    conflicts = [k for k in fields_given if getattr(merged, k) != getattr(policy, k)]
    if conflicts:
        shown = ", ".join(f"{k}={fields_given[k]!r}" for k in conflicts)
        raise UsageError(
            f"{shown} conflicts with the policy given ({', '.join(f'{k}={getattr(policy, k)!r}' for k in conflicts)})",
            path=path,
            hint="give the load policy once: policy=LoadPolicy(...) or keyword options",
        )
    return policy, own


def check_options(h: Any, kind: str, given: Mapping[str, Any], *, path: Any = None) -> None:
    """Refuse options handler ``h`` does not take, naming them and the accepted ones.

    Raises:
        UsageError: an option that is not in :func:`accepted_options`.
    """
    ok = accepted_options(h, kind)
    unknown = sorted(k for k in given if k not in ok)
    if unknown:
        what = "opening" if kind == "open" else "writing"
        raise UsageError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(repr(k) for k in unknown)} for {what} {h.name} files",
            path=path,
            expected="one of: " + ", ".join(ok),
            found=", ".join(unknown),
        )


class Probe:
    """What detection looks at: the path, the first bytes, and (lazily) zip record names.

    A probe is made of a path (:meth:`of`) or of any byte source (:meth:`of_source`: bytes,
    a zip member, a DCP item), so the same sniffers run on nested members.

    Attributes:
        path: the file or directory as a :class:`pathlib.Path` (for a byte source, its
            name; a URL: a :class:`~torchless.io.remote.RemotePath`).
        is_dir: True for directories (DCP checkpoints, caches, unpacked packages).
        head: the first 4096 bytes of a file (empty for directories).
        store: the :class:`~torchless.io.store.Store` holding :attr:`path`, resolved once
            where the location entered (:meth:`of`); sniffers that look at a folder's files
            ask it (a probe of bytes: the local store, with nothing beside it).
    """

    __slots__ = ("_text", "_path", "is_dir", "head", "_reader", "_records", "_zip_done", "_source", "_store", "_given")

    def __init__(self, path: Any, is_dir: bool, head: bytes, *, _source: Any = None, store: Any = None) -> None:
        # ``path``: a Path, a RemotePath, or the text of a path that pathlib would spell
        # the same (:func:`_plain_path`), whose Path is made when first asked for: detection
        # of a file needs only its name, and importing pathlib is a noticeable part of the
        # command line's start-up
        self._path: Any = None if type(path) is str else path
        self._text: str = path if type(path) is str else str(path)
        self.is_dir = is_dir
        self.head = head
        self._reader: ZipReader | None = None
        self._records: list[str] | None = None
        self._zip_done = False
        self._source = _source  # a byte source's bytes (remote, nested), shared with the zip reader
        self._store = store  # None: the local store (looked up when first asked: start-up)
        self._given: str | None = None  # the location as the caller gave it (see store_of)

    def __repr__(self) -> str:
        return f"Probe(path={self.path!r}, is_dir={self.is_dir!r}, head={self.head!r})"

    @property
    def text(self) -> str:
        """The path or URL as text (no pathlib import: the command line's start-up)."""
        return self._text

    @property
    def store(self) -> Any:
        """The store holding :attr:`path` (see the class's attributes)."""
        if self._store is None:
            from ..io.store import LOCAL

            self._store = LOCAL
        return self._store

    @property
    def path(self) -> Any:
        if self._path is None:
            from pathlib import Path

            self._path = Path(self._text)
        return self._path

    @classmethod
    def of(cls, path: Any) -> Probe:
        if not isinstance(path, (str, os.PathLike)):  # a file object, bytes of a name, None...
            raise UsageError(
                "expected a path or a URL",
                expected="str or os.PathLike (torchless.open also takes a checkpoint's bytes)",
                found=type(path).__name__,
            )
        given = os.fspath(path)
        if isinstance(path, str) and "://" in path:
            from ..io.store import resolve

            store, path = resolve(path)  # a file:// URL names a local path
            if store.remote:
                probe = cls._of_url(path, store)
                probe._given = given
                return probe
        probe = cls._of_local(path)
        if os.fspath(path) == given:  # (not a file:// URL read as the local path it names)
            probe._given = given
        return probe

    def store_of(self, path: Any) -> Any:
        """The store detection resolved for ``path`` when ``path`` is the location this probe
        was made of (a handler passes it to its artifact: the location is not asked again),
        else None (a ``file://`` URL, which detection read as the local path it names, is
        opened as given: its artifact resolves it)."""
        return (
            self.store
            if self._given is not None and isinstance(path, (str, os.PathLike)) and os.fspath(path) == self._given
            else None
        )

    @classmethod
    def _of_local(cls, path: Any) -> Probe:
        where: Any = os.fspath(path)
        if not _plain_path(where):
            from pathlib import Path

            where = Path(where)  # pathlib's spelling (``./a//b/`` is ``a/b``), as messages show it
        st = _stat(where)  # what Path.is_dir() and Path.exists() look at: one stat for both
        if st is not None and S_ISDIR(st.st_mode):
            return cls(where, True, b"")
        if st is None:
            raise NotFoundError("no such file or directory", path=where)
        with open(where, "rb") as f:
            head = f.read(4096)
        return cls(where, False, head)

    @classmethod
    def _of_url(cls, url: str, store: Any) -> Probe:
        from ..io import remote

        # a RemotePath stands where detection expects a Path: it has the Path members that
        # sniffers use (name, suffix, /, is_dir, exists) but is a str, not a Path
        if remote.isdir(url):
            return cls(remote.RemotePath(url), True, b"", store=store)
        from ..io.source import RemoteSource

        src = RemoteSource(url)
        return cls(remote.RemotePath(url), False, src.read_at(0, min(4096, src.size)), _source=src, store=store)

    @classmethod
    def of_source(cls, data: Any, name: str = "<bytes>") -> Probe:
        """A probe of bytes, a memoryview or a :class:`~torchless.io.source.ByteSource`
        (``name``: what the suffix rules see, e.g. the member name)."""
        from ..io.source import open_source

        src = open_source(data)
        where: Any = name
        if not _plain_path(name):
            from pathlib import Path

            where = Path(name)  # pathlib's spelling of it
        return cls(where, False, src.read_at(0, min(src.size, 4096)), _source=src)

    @property
    def name(self) -> str:
        """The last part of the path (a file's name)."""
        return os.path.basename(self._text)

    @property
    def suffix(self) -> str:
        if self._path is not None:
            return str(self._path.suffix.lower())
        name = self.name  # Path.suffix of a plain path
        i = name.rfind(".")
        return name[i:].lower() if 0 < i < len(name) - 1 else ""

    def _parse_zip(self) -> None:
        if not self._zip_done:
            self._zip_done = True
            if not self.is_dir and is_zip(self.head):
                try:
                    src = self._source  # a remote object's source, or None: map the file
                    self._reader = ZipReader(src if src is not None else self._text, require_prefix=False)
                    self._records = self._reader.records()
                except TorchlessError:
                    self._reader = None

    def zip_records(self) -> list[str] | None:
        """Record names relative to the archive folder, or None when not a zip (the
        central directory is parsed once, on the first call)."""
        self._parse_zip()
        return self._records

    def read_record(self, name: str, *, max_size: int) -> bytes | None:
        """The bytes of record ``name`` (relative to the archive folder) from the archive
        detection already parsed, or None: not a zip, no such record, or larger than
        ``max_size`` (a sniffer's bounded look inside; the archive stays with the probe).

        Raises:
            TorchlessError: the record cannot be read (damaged, compressed wrongly).
        """
        self._parse_zip()
        zr = self._reader
        e = zr.lookup(name) if zr is not None else None
        if zr is None or e is None or e.size > max_size:
            return None
        return bytes(zr.read(e, max_size=max_size))

    def take_zip(self, *, require_prefix: bool = True) -> ZipReader | None:
        """The parsed archive, handed over to the caller (who closes it), or None when the
        probe parsed none (not a zip, or detection never looked inside).

        Raises:
            FormatError: ``require_prefix`` and the first entry is not inside a folder.
        """
        zr, self._reader = self._reader, None
        if zr is not None and require_prefix:
            try:
                zr.check_prefix()
            except BaseException:
                zr.close()
                raise
        return zr

    def close(self) -> None:
        """Release the parsed archive unless it was handed over."""
        zr, self._reader = self._reader, None
        if zr is not None:
            zr.close()


def _plain_path(text: Any) -> bool:
    """True when ``text`` is a POSIX path that :class:`pathlib.Path` spells the same: no
    empty or ``.`` parts, no trailing slash."""
    return (
        os.name == "posix"
        and type(text) is str
        and text not in ("", ".")
        and "//" not in text
        and not text.endswith(("/", "/."))
        and not text.startswith("./")
        and "/./" not in text
    )


def _stat(path: Any) -> os.stat_result | None:
    """``os.stat``, None where :meth:`pathlib.Path.exists` says False (a missing file or
    folder, a loop, a bad name); other errors (permission denied) raise, as Path's do."""
    try:
        return os.stat(path)
    except OSError as e:
        if e.errno not in _MISSING:
            raise
        return None
    except ValueError:  # an embedded NUL
        return None


#: the errors :meth:`pathlib.Path.exists` and ``is_dir`` take for "not there"
_MISSING = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)


#: how an error message says what a capability does
CAPABILITY_TEXT = {
    "read": "open files",
    "list": "list tensors",
    "verify": "verify files",
    "write_tensors": "write tensors",
    "write_objects": "store objects",
    "edit": "replace weights in an existing file",
}


def _cannot(h: Any, capability: str, path: Any) -> UsageError:
    # the default writers of a handler that does not declare them (the registry checks
    # declaration against methods; the public functions refuse first, naming the formats
    # that can: formats.registry.require)
    return UsageError(
        f"{h.name} cannot {CAPABILITY_TEXT[capability]}",
        path=path,
        hint="torchless.capabilities() (or `torchless formats`) lists what each format can do",
    )


class FormatHandler:
    """One artifact kind. Subclasses set the class attributes and implement :meth:`sniff`
    and :meth:`open`; writers implement ``write_tensors`` / ``save`` and declare them in
    :attr:`capabilities` (the registry checks that the declaration matches the methods).

    Attributes:
        name: short id used by ``--format`` and in ``info`` (``"pt"``, ``"onnx"``).
        extensions: file suffixes, lowercase with dot, for the extension fallback.
        priority: lower sniffs first (specific zip flavours before plain checkpoints).
        description: one line for listings (``torchless formats``).
        capabilities: what the handler can do; see :class:`Capabilities`.
    """

    name: ClassVar[str] = "?"
    extensions: ClassVar[tuple[str, ...]] = ()
    priority: ClassVar[int] = 100
    description: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities()

    def sniff(self, probe: Probe) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def open(self, path: Any, policy: LoadPolicy | None = None, /, *, probe: Probe | None = None, **options: Any) -> Artifact:
        """Open ``path`` lazily under one :class:`LoadPolicy`.

        Args:
            policy: the load policy (default: ``LoadPolicy()`` updated by ``options``).
            probe: the :class:`Probe` detection already made of ``path`` (its parsed zip
                directory is reused, not read again); the artifact takes it over.
            **options: the policy's fields (``weights_only``, ``limits``...) and the
                handler's own declared ``capabilities.open_options``.

        Raises:
            UsageError: an option the handler does not take (naming the accepted ones),
                or one contradicting ``policy``.
        """
        try:
            pol, own = resolve_policy(
                self, policy, options, path=None if isinstance(path, (bytes, bytearray, memoryview)) else path
            )
        except BaseException:
            if probe is not None:
                probe.close()
            raise
        art = self._open(path, pol, probe, **own)
        art.policy = pol
        return art

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> Artifact:  # pragma: no cover - abstract
        """Open ``path`` under ``policy``; handlers add their declared open options as
        keyword parameters. ``probe`` (may be None) is detection's look at ``path``."""
        raise NotImplementedError

    def write_tensors(
        self, items: Iterable[tuple[str, Any]], path: Any, *, progress: Callable[[int], None] | None = None
    ) -> list[str] | None:
        """Write ``(name, tensor)`` pairs to ``path``; returns the files written (None: ``path``).

        Handlers declaring ``write_tensors`` override this, adding their own options as
        keyword parameters (declared in ``capabilities.write_options``); :func:`torchless.write_tensors`
        refuses undeclared options before calling it.

        Raises:
            UsageError: the format does not write tensors (``torchless.write_tensors`` names
                the formats that do).
        """
        raise _cannot(self, "write_tensors", path)

    def save(self, obj: Any, path: Any, *, progress: Callable[[int], None] | None = None) -> None:
        """Write the object tree ``obj`` to ``path``.

        Raises:
            UsageError: the format does not store objects (``torchless.save`` names the
                formats that do).
        """
        raise _cannot(self, "write_objects", path)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {', '.join(self.capabilities.flags())}>"


_A = TypeVar("_A", bound="Artifact")


class Artifact:
    """A lazy handle on an opened artifact. Use as a context manager.

    Subclasses implement :meth:`tensors` and :meth:`info`; the rest has defaults.
    Indexing by tensor name returns the lazy tensor.
    """

    format: str = "?"
    #: the load policy, decided once when the artifact is opened
    policy: LoadPolicy = LoadPolicy()

    def __init__(self, path: Any, policy: LoadPolicy | None = None, *, store: Any = None) -> None:
        self.path = os.fspath(path)
        self.policy = policy if policy is not None else LoadPolicy()
        self._index: dict[str, Any] | None = None
        if store is not None:
            self._store = store

    #: the store given at construction (None: looked up from the path when first asked)
    _store: Any = None

    @property
    def store(self) -> Any:
        """The :class:`~torchless.io.store.Store` holding :attr:`path`: the one its
        location resolved to where it entered (detection's probe, handed over by the
        handler); an artifact made directly of a path or URL resolves it here, once."""
        if self._store is None:
            from ..io.store import store_for

            self._store = store_for(self.path)
        return self._store

    @store.setter
    def store(self, value: Any) -> None:
        self._store = value

    @property
    def weights_only(self) -> bool:
        """The policy's ``weights_only``: what :meth:`load` returns was read under it."""
        return self.policy.weights_only

    def load_policy(self, weights_only: bool | None) -> bool:
        """The ``weights_only`` policy for a :meth:`load` call: the one the artifact was
        opened with. Asking for the other one is refused, never silently overridden.

        Raises:
            UsageError: ``weights_only`` differs from the policy given at open.
        """
        if weights_only is None or bool(weights_only) == self.weights_only:
            return self.weights_only
        raise UsageError(
            f"this artifact was opened with weights_only={self.weights_only}; "
            f"load(weights_only={bool(weights_only)}) would return data read under the other policy",
            path=self.path,
            hint=f"open it with weights_only={bool(weights_only)}",
        )

    # -- to implement --------------------------------------------------------------
    def tensors(self) -> Iterator[tuple[str, Any]]:
        """``(name, tensor)`` for every tensor, without reading tensor payloads."""
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        """A JSON-ready summary; the generic part comes from :func:`summarize_tensors`."""
        return {"format": self.format, "path": self.path, **summarize_tensors(self.tensors())}

    # -- defaults ------------------------------------------------------------------
    def load(self, *, weights_only: bool | None = None) -> Any:
        """The artifact's object tree (default: a dict of its tensors).

        ``weights_only`` may only repeat the policy the artifact was opened with."""
        self.load_policy(weights_only)
        return dict(self.tensors())

    def convert_to(
        self,
        dst: Any,
        *,
        format: str,
        progress: Callable[[int], None] | None = None,
        strict: bool = False,
        options: Mapping[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """Write this artifact into ``dst`` its own streaming way (DCP, Hugging Face
        checkpoints), or None: :func:`torchless.convert`'s generic conversion applies.

        ``options`` are the destination writer's options, already checked against its
        declaration."""
        return None

    def verify(self) -> list[Problem]:
        """Problems found by reading every structure and payload (empty: sound)."""
        problems: list[Problem] = []
        for name, t in self.tensors():
            try:
                if isinstance(t, Tensor) and t.storage is not None:
                    t._check_bounds()
                    t.storage.check()
            except TorchlessError as e:
                problems.append(Problem("tensor", str(e), name))
        return problems

    def close(self) -> None:
        """Release every file descriptor and memory map this artifact opened (idempotent).

        Arrays already taken with ``Tensor.numpy()`` stay valid: they keep the pages they
        view mapped until they are dropped, as torch's ``mmap=True`` tensors do. Reading a
        tensor's values after ``close`` raises :class:`~torchless.core.errors.UsageError`
        unless its bytes were already copied into memory (inflated, fetched). Handlers
        override this; the conformance checks ``close``, ``release`` and ``after-close``
        hold every handler to it."""

    def keys(self) -> list[str]:
        return list(self._names())

    def _names(self) -> dict[str, Any]:
        if self._index is None:
            self._index = dict(self.tensors())
        return self._index

    def __getitem__(self, name: str) -> Any:
        try:
            return self._names()[name]
        except KeyError:
            raise NotFoundError(f"no tensor named {name!r}", path=self.path) from None

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __enter__(self: _A) -> _A:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.format} {self.path!r}>"


def summarize_tensors(items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Counts, parameter count and bytes by dtype of ``(name, tensor)`` pairs."""
    count = 0
    numel = 0
    params = 0
    by_dtype: dict[str, int] = {}
    storages: set[Any] = set()
    stored = 0
    for _name, t in items:
        count += 1
        n = t.numel()
        numel += n
        if getattr(t, "is_parameter", False):
            params += n
        dn = t.dtype.name
        by_dtype[dn] = by_dtype.get(dn, 0) + t.nbytes
        st = getattr(t, "storage", None)
        if st is not None and st not in storages:  # the object (held), not id(): items may be temporaries
            storages.add(st)
            stored += st.nbytes
    return {
        "tensors": count,
        "elements": numel,
        "parameters": params,
        "bytes_by_dtype": dict(sorted(by_dtype.items())),
        "tensor_bytes": sum(by_dtype.values()),
        "storage_bytes": stored,
    }
