"""Constants and small helpers shared by the carrier walkers."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["LEGACY_MAGIC", "MAX_DEPTH", "MAX_MEMBER", "walks"]

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
MAX_DEPTH = 6  # nesting of carriers (zip in pickle in zip ...)
MAX_MEMBER = 1 << 31  # bytes of one pickle-carrying member read for analysis
_WINDOW = 1 << 22  # bytes of a raw file analysed before deciding whether it is a pickle

_STORAGE_RECORD = re.compile(
    r"^(?:.*/)?(?:data|constants|tensors)/\d+$|^(?:.*/)?data/weights/weight_\d+$|^(?:.*/)?data/constants/tensor_\d+$|^(?:.*/)?xl_model_weights/"
)
_KNOWN_RECORDS = (
    "data.pkl",
    "constants.pkl",
    "bytecode.pkl",
    "traced_inputs.pkl",
    "version",
    "byteorder",
    ".data/version",
    ".format_version",
    ".storage_alignment",
    ".data/serialization_id",
    "archive_format",
)
_ZIP_SIG = b"PK\x03\x04"
_EOCD_SIG = b"PK\x05\x06"
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
