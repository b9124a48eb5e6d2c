"""NumPy's ``.npy`` / ``.npz`` layout as ``numpy.load`` recognises it.

``numpy.load``: ``PK\\x03\\x04`` or ``PK\\x05\\x06`` -> an ``.npz`` read through Python's
``zipfile`` (torch tests the first only); ``\\x93NUMPY`` -> ``.npy``; otherwise
``pickle.load`` (``allow_pickle=True``). The reader (:mod:`.npz`) and the scanner take
these facts from here; the ``.npy`` header itself is parsed by
:mod:`torchless.core.npyheader`.
"""

from __future__ import annotations

from typing import Any

from ..container.zip import EOCD_SIG, LOCAL_SIG
from ..core.npyheader import MAGIC as NPY_MAGIC

__all__ = [
    "NPY_MAGIC",
    "NPY_SUFFIX",
    "ZIP_MAGICS",
    "DTYPES_MEMBER",
    "DTYPE_COMMENT",
    "is_npy",
    "is_npz_head",
    "member_key",
    "check_name",
    "classify_member",
]

#: numpy.load's zip test (a local header, or the end record of an empty archive)
ZIP_MAGICS = (LOCAL_SIG, EOCD_SIG)
#: ``NpzFile`` strips this from member names to make keys
NPY_SUFFIX = ".npy"
#: older torchless versions' side member naming dtypes NumPy lacks
DTYPES_MEMBER = "__torchless_dtypes__.json"
#: the member comment torchless writes for such dtypes
DTYPE_COMMENT = b"torchless.dtype="


def check_name(name: str, path: Any = None) -> None:
    """Refuse a tensor name ``numpy.load`` cannot give back: a NUL (Python's ``zipfile``
    cuts a member name at the first NUL, so ``"a\\x00b"`` would come back as ``"a"``) and
    names that are not valid UTF-8 (lone surrogates: ``np.savez`` fails with a plain
    ``UnicodeEncodeError``). Any other string round-trips (``""``, ``"a/b"``, ``"x.npy"``,
    ``"../x"``: ``np.load`` returns the member name less one ``.npy``).

    Raises:
        UsageError: naming the tensor (escaped).
    """
    from ..core.errors import UsageError
    from ..core.tensor import require_utf8_name

    if "\x00" in name:
        raise UsageError(
            f"tensor name {ascii(name)} holds a NUL, which a zip member name cannot (numpy.load would return it cut)",
            path=path,
            member=name,
            hint="rename the tensor",
        )
    require_utf8_name(name, path, fmt="npz")


def is_npy(head: bytes | bytearray | memoryview) -> bool:
    """``numpy.load`` reads these bytes as an ``.npy`` array."""
    return head[: len(NPY_MAGIC)] == NPY_MAGIC


def is_npz_head(head: bytes | bytearray | memoryview) -> bool:
    """``numpy.load`` reads these bytes as an ``.npz`` through ``zipfile``."""
    return head[:4] in ZIP_MAGICS


def member_key(name: str) -> str:
    """The ``NpzFile`` key of a member (its name without ``.npy``)."""
    return name.removesuffix(NPY_SUFFIX)


def classify_member(name: str, head: bytes) -> str:
    """``storage`` (an ``.npy`` array: ``NpzFile.__getitem__`` parses it, and unpickles
    an object array with ``allow_pickle``), ``metadata`` (torchless's dtype side member)
    or ``other`` (bytes ``NpzFile`` returns as they are)."""
    if is_npy(head):
        return "storage"
    if name == DTYPES_MEMBER:
        return "metadata"
    return "other"
