"""Constants and small helpers shared by the carrier walkers."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from ...formats.pt import spec as pt_spec
from ...formats.pt.spec import LEGACY_MAGIC
from ...formats.pt2 import spec as pt2_spec
from ...formats.torchscript import spec as ts_spec

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["LEGACY_MAGIC", "MAX_DEPTH", "MAX_MEMBER", "walks"]

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


def walks(loader: str) -> Callable[[F], F]:
    """Decorate a carrier walker: findings it adds name ``loader`` unless they name one."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self: Any, *a: Any, **kw: Any) -> Any:
            with self.loading(loader):
                return fn(self, *a, **kw)

        return cast(F, wrapper)  # functools.wraps keeps fn's signature

    return deco
