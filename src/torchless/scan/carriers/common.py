"""Constants and small helpers shared by the carrier walkers, and their base class."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from ...formats.pt import spec as pt_spec
from ...formats.pt.spec import LEGACY_MAGIC
from ...formats.pt2 import spec as pt2_spec
from ...formats.torchscript import spec as ts_spec

if TYPE_CHECKING:
    from ...io.source import ByteSource
    from ..budget import Budget
    from ..findings import FileReport

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["Carrier", "Engine", "LEGACY_MAGIC", "MAX_DEPTH", "MAX_MEMBER", "walks"]

MAX_DEPTH = 6  # nesting of carriers (zip in pickle in zip ...)
MAX_MEMBER = 1 << 31  # bytes of one pickle-carrying member read for analysis
_WINDOW = 1 << 22  # bytes of a raw file analysed before deciding whether it is a pickle


def _is_storage_record(rel: str) -> bool:
    """Raw tensor bytes of any torch zip flavour (never unpickled by name): the pt /
    TorchScript storage folders and the PT2 weights and constants."""
    return pt_spec.is_storage_record(rel) or pt2_spec.is_storage_record(rel)


#: records torch reads by exact (case-insensitive) name in some zip flavour
_KNOWN_RECORDS = tuple(p for p, _d in ts_spec.PICKLES) + pt_spec.METADATA_RECORDS + (pt2_spec.ARCHIVE_FORMAT_PATH,)
_OK_FLAGS = 0x0808 | 0x0006  # data descriptor, UTF-8 names, deflate speed bits


#: allowlisted callables that call (or instantiate) some of their arguments: those
#: arguments must be plain globals (classified on their own), never computed values.
_HIGHER_ORDER: dict[str, tuple[int, ...]] = {
    "torch._tensor._rebuild_from_type_v2": (0, 1),
    "torch.tensor._rebuild_from_type_v2": (0, 1),
    "copyreg._reconstructor": (0, 1),
    "copyreg.__newobj__": (0,),
    "copyreg.__newobj_ex__": (0,),
    "torch._utils._rebuild_wrapper_subclass": (0,),
}


C = TypeVar("C", bound="Carrier")


class Engine(Protocol):
    """What a carrier uses of the scan engine (:class:`.base.ScanEngine` is one): the file,
    its report, the work budget, the findings, and the dispatch that takes what a carrier
    finds inside it."""

    path: str
    root: str | None
    unknown_severity: str
    report: FileReport
    budget: Budget

    def add(
        self,
        rule: str,
        severity: str,
        message: str,
        member: str | None = None,
        offset: int | None = None,
        file_offset: int | None = None,
        global_name: str | None = None,
        disassembly: list[str] | None = None,
        loader: str | None = None,
    ) -> None: ...
    def spend(self, what: str, n: int, member: str | None, doing: str, loader: str | None = None) -> bool: ...
    def covered(
        self, what: str, member: str | None, data: bytes | str, offset: int | None = None, finished: bool = True
    ) -> None: ...
    def loading(self, loader: str | None) -> AbstractContextManager[None]: ...
    def source_key(self, src: ByteSource) -> int: ...
    def scan_source(
        self,
        src: ByteSource,
        member: str | None,
        base: int | None,
        depth: int,
        *,
        toplevel: bool = False,
        context: str = "member",
        loader: str | None = None,
    ) -> None: ...
    def scan_bytes(
        self, data: Any, member: str | None, base: int | None, depth: int, *, context: str = "member", loader: str | None = None
    ) -> None: ...
    def carrier(self, kind: type[C]) -> C:
        """The engine's carrier of class ``kind`` (a carrier that hands bytes to another
        carrier, as a zip member's pickle to :class:`.pickles.PickleCarrier`, asks for it)."""
        ...


class Carrier:
    """One carrier's analysis (pickle streams, zip archives, tar, DCP items, NumPy files,
    ONNX, compressed streams, nested payloads), run by the scan engine.

    A carrier keeps no state of its own: what a scan accumulates (findings, the work
    budget, coverage, the loader being modelled) is the engine's (:attr:`engine`), so a
    carrier object can be made on any engine and run alone
    (``ZipCarrier(ScanEngine(path)).scan_zip(src, None, 0, 0)``). What it finds inside its
    carrier (a member, an inflated stream, a nested payload) it hands back to the engine's
    dispatch (:meth:`Engine.scan_source`), or to the carrier that reads it
    (``engine.carrier(PickleCarrier).scan_pickles``).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine


def walks(loader: str) -> Callable[[F], F]:
    """Decorate a carrier walker: findings it adds name ``loader`` unless they name one."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self: Carrier, *a: Any, **kw: Any) -> Any:
            with self.engine.loading(loader):
                return fn(self, *a, **kw)

        return cast(F, wrapper)  # functools.wraps keeps fn's signature

    return deco
