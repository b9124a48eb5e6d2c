"""joblib files (``joblib.dump``) as ``joblib.load`` recognises them (joblib 1.x).

A pickle stream, optionally compressed as a whole; ``_detect_compressor`` decides by the
prefix table below (``ZF``: the pre-0.10 zfile layout, tested first), anything else is a
plain pickle. Arrays are ``joblib.numpy_pickle.NumpyArrayWrapper`` objects whose bytes
follow their BUILD opcode. The reader (:mod:`.joblib`) and the scanner take these facts
from here.
"""

from __future__ import annotations

__all__ = ["COMPRESSOR_PREFIXES", "ZFILE_HEADER", "WRAPPER", "MARKER", "EXTENSIONS", "compression_of"]

#: joblib 1.x ``_detect_compressor``: (prefix, compressor), tried in this order.
COMPRESSOR_PREFIXES: tuple[tuple[bytes, str], ...] = (
    (b"ZF", "zfile"),
    (b"\x78", "zlib"),
    (b"\x1f\x8b", "gzip"),
    (b"BZ", "bz2"),
    (b"\x5d\x00", "lzma"),
    (b"\xfd\x37\x7a\x58\x5a", "xz"),
    (b"\x04\x22\x4d\x18", "lz4"),
)
#: bytes before the zlib stream of a zfile: ``ZF`` and a 19-byte hex length
ZFILE_HEADER = 2 + 19
#: the class every array is pickled as
WRAPPER = ("joblib.numpy_pickle", "NumpyArrayWrapper")
#: its module name, as it appears in the stream (the sniff looks for it)
MARKER = WRAPPER[0].encode()
EXTENSIONS = (".joblib", ".jbl")


def compression_of(head: bytes) -> str | None:
    """joblib's compressor for a file starting with ``head`` (None: a plain pickle)."""
    for prefix, name in COMPRESSOR_PREFIXES:
        if head.startswith(prefix):
            return name
    return None
