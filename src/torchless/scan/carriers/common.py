"""Constants and small helpers shared by the carrier walkers."""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["LEGACY_MAGIC", "MAX_DEPTH", "MAX_INFLATE", "MAX_MEMBER", "sniff", "join"]

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
MAX_DEPTH = 6  # nesting of carriers (zip in pickle in zip ...)
MAX_INFLATE = 1 << 30  # decompressed bytes accepted from one compressed carrier
MAX_MEMBER = 1 << 31  # bytes of one pickle-carrying member read for analysis
_WINDOW = 1 << 22  # bytes of a raw file analysed before deciding whether it is a pickle

_STORAGE_RECORD = re.compile(r"^(?:.*/)?(?:data|constants|tensors)/\d+$|^(?:.*/)?data/weights/weight_\d+$|^(?:.*/)?data/constants/tensor_\d+$|^(?:.*/)?xl_model_weights/")
_KNOWN_RECORDS = ("data.pkl", "constants.pkl", "bytecode.pkl", "traced_inputs.pkl", "version", "byteorder", ".data/version", ".format_version", ".storage_alignment", ".data/serialization_id", "archive_format")
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

        return wrapper  # type: ignore[return-value]

    return deco


def join(member: str | None, name: str) -> str:
    """``member > name`` (the location of something inside ``member``)."""
    return f"{member} > {name}" if member else name


def sniff(head: bytes) -> str:
    if head[:4] == _ZIP_SIG:
        return "zip"
    if head[:6] == b"\x93NUMPY":
        return "npy"
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[:3] == b"BZh":
        return "bz2"
    if head[:6] == b"\xfd7zXZ\x00":
        return "xz"
    if head[:3] == b"\x5d\x00\x00":
        return "lzma"
    if len(head) >= 2 and head[0] == 0x78 and (head[0] * 256 + head[1]) % 31 == 0:
        return "zlib"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    if head[:1] == b"\x80" and len(head) > 1 and head[1] <= 5:
        return "pickle"
    return "other"
