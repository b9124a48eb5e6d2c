"""NumPy carriers, read as ``numpy.load`` reads them.

``.npy`` (``numpy/lib/format.py``): magic, version (1.0, 2.0 or 3.0 only), a header length
(``<H`` for 1.0, ``<I`` for 2.0/3.0), the header text (latin-1 for 1.0/2.0, UTF-8 for 3.0),
which must be a dict literal with exactly the keys ``descr``, ``fortran_order``, ``shape``.
``descr`` becomes a dtype through NumPy's own ``descr_to_dtype``; when that dtype holds an
object anywhere (structured fields and sub-arrays included: ``dtype.hasobject``), the bytes
after the header are a pickle that ``numpy.load(allow_pickle=True)`` unpickles.

The header literal is parsed by :func:`torchless.core.npyheader.parse_header_literal`, the
same strict parser the ``.npy``/``.npz`` readers use (the literal grammar NumPy writes, with
size and depth limits, never ``tokenize``/``ast`` on the whole header). A header it does not
accept but NumPy might is ``unanalysable``.

``.npz``: NumPy opens the archive with Python's ``zipfile`` (which shifts every offset when
data precede the archive, reads the last of duplicate names, supports bzip2/lzma members
and checks CRCs only at a member's end), so the scan reads it with ``zipfile`` too: each
member ``NpzFile.__getitem__`` would parse as ``.npy`` (the ``\\x93NUMPY`` magic), exactly
as ``zipfile`` delivers its bytes. ``zipfile`` never executes anything.
"""

from __future__ import annotations

import os
import struct
import zipfile
import zlib
from typing import Any

from ...core.errors import TorchlessError
from ...core.npyheader import VERSIONS as _VERSIONS
from ...core.npyheader import parse_header_literal
from ...formats.npz_spec import NPY_MAGIC
from ...io.source import ByteSource, BytesSource, SourceFile
from .common import Carrier, walks
from .pickles import PickleCarrier

__all__ = ["NumpyCarrier", "read_npy_header"]

MAX_HEADER = 1 << 20  # header bytes parsed (NumPy has no limit under allow_pickle=True)
MAX_DEPTH = 64  # nesting of the header literal
_LOADER = "numpy.load(allow_pickle=True)"
_DIGITS = frozenset("0123456789")


def read_npy_header(src: ByteSource, total: int | None = None) -> tuple[str, Any]:
    """NumPy's reading of an ``.npy`` header: ``("object", offset of the pickle)``,
    ``("plain", None)`` (no pickle), ``("refused", reason)`` (numpy.load raises: nothing
    runs), or ``("unanalysable", reason)`` (NumPy may accept what the strict parser does not).
    ``src`` may hold only the beginning of a member of ``total`` bytes (header included)."""
    total = src.size if total is None else total
    head = src.read_at(0, min(src.size, 12))
    if len(head) < 8 or head[:6] != NPY_MAGIC:
        return "refused", "no .npy magic"
    version = (head[6], head[7])
    if version not in _VERSIONS:
        return "refused", f"version {version[0]}.{version[1]} (NumPy reads 1.0, 2.0 and 3.0 only)"
    fmt, encoding = _VERSIONS[version]
    width = struct.calcsize(fmt)
    if len(head) < 8 + width:
        return "refused", "truncated header length"
    (hlen,) = struct.unpack_from(fmt, head, 8)
    start = 8 + width
    if start + hlen > total:
        return "refused", f"header of {hlen} bytes runs past the end"
    if hlen > MAX_HEADER:
        return (
            "unanalysable",
            f"header of {hlen} bytes is over the scanner's {MAX_HEADER}-byte limit (NumPy reads it under allow_pickle=True)",
        )
    try:
        text = src.read_at(start, hlen).decode(encoding)
    except UnicodeDecodeError:
        return "refused", f"header is not {encoding}"
    try:
        d = parse_header_literal(text, allow_long=version <= (2, 0), max_depth=MAX_DEPTH)
    except TorchlessError as e:
        return "unanalysable", f"header literal not parsed ({e}); NumPy's ast.literal_eval may accept it"
    if not isinstance(d, dict):
        return "refused", "header is not a dict"
    if set(d) != {"descr", "fortran_order", "shape"}:
        return "refused", f"header keys {sorted(map(str, d))} (NumPy needs exactly descr, fortran_order, shape)"
    if not isinstance(d["shape"], tuple) or not all(isinstance(x, int) for x in d["shape"]):
        return "refused", "shape is not a tuple of ints"
    if not isinstance(d["fortran_order"], bool):
        return "refused", "fortran_order is not a bool"
    try:
        from numpy.lib.format import descr_to_dtype  # NumPy's own rules: structured, sub-arrays, titles

        dtype = descr_to_dtype(d["descr"])
    except (RecursionError, MemoryError) as e:
        return "unanalysable", f"descr too complex to evaluate ({type(e).__name__})"
    except Exception as e:  # noqa: BLE001 - NumPy's own function refuses it: so does numpy.load
        return "refused", f"descr {str(d['descr'])[:80]!r} is not a dtype NumPy accepts ({type(e).__name__})"
    if dtype.hasobject:
        return "object", start + hlen
    return "plain", None


class NumpyCarrier(Carrier):
    """A carrier run by the scan engine (:class:`~torchless.scan.carriers.base.ScanEngine`): ``.npy`` and ``.npz``."""

    @walks(_LOADER)
    def scan_npy(self, src: ByteSource, member: str | None, base: int | None, depth: int, total: int | None = None) -> None:
        """An ``.npy`` file or member: the pickle of an object array, as NumPy finds it."""
        if member is None:
            self.engine.report.kind = "npy"
        what, detail = read_npy_header(src, total)
        if what == "refused":
            self.engine.add(
                "unrecognized",
                "info",
                f".npy that numpy.load refuses before reading data ({detail}): nothing runs",
                member,
                0,
                loader=_LOADER,
            )
        elif what == "unanalysable":
            self.engine.add(
                "unanalysable",
                "high",
                f".npy header: {detail}; if NumPy reads an object dtype, the bytes after the header are unpickled",
                member,
                0,
                loader=_LOADER,
            )
        elif what == "object":
            n = src.size - detail
            loc = f"{member or os.path.basename(self.engine.path)} > object array pickle"
            self.engine.carrier(PickleCarrier).scan_pickles(
                BytesSource(src.view(detail, n)), loc, None if base is None else base + detail, depth, strict=True
            )

    @walks(_LOADER)
    def scan_npz(self, src: ByteSource, member: str | None, base: int | None, depth: int) -> None:
        """The archive as ``numpy.load`` opens it: Python's ``zipfile`` (the oracle)."""
        pre = f"{member} > " if member else ""
        try:
            zf = zipfile.ZipFile(SourceFile(src))
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, NotImplementedError, struct.error) as e:
            self.engine.add(
                "unrecognized",
                "info",
                f"numpy.load's zipfile refuses this archive ({type(e).__name__}: {str(e)[:80]}): nothing in it is loaded as .npz",
                member,
                loader=_LOADER,
            )
            return
        with zf:
            infos = {}
            for info in zf.infolist()[:100_000]:
                infos[info.filename] = info  # zipfile.getinfo: the last entry of a name
            npz_members = 0
            for name, info in infos.items():
                loc = f"{pre}{name} (numpy.load via zipfile)"
                if not self.engine.spend("nodes", 1, loc, "visiting .npz members"):
                    return
                try:
                    with zf.open(info) as fh:
                        head = fh.read(12)
                        if head[:6] != NPY_MAGIC:
                            continue  # NpzFile returns such members as raw bytes: nothing runs
                        width = 2 if head[6:8] == b"\x01\x00" else 4
                        hlen = int.from_bytes(head[8 : 8 + width], "little") if len(head) >= 8 + width else 0
                        head += fh.read(max(0, min(8 + width + hlen, 8 + width + MAX_HEADER + 1) - len(head)))
                except (zipfile.BadZipFile, RuntimeError, NotImplementedError, OSError, ValueError, EOFError, zlib.error) as e:
                    # encrypted, unsupported method, broken stream (the torch view reports
                    # these): NpzFile raises on access, nothing runs
                    del e
                    continue
                npz_members += 1
                if not self.engine.budget.once(
                    ("npz-member", self.engine.source_key(src), info.header_offset, info.compress_size, info.compress_type)
                ):
                    continue
                # the header decides; only an object array's bytes are read (plain arrays of
                # any size cost a header read)
                what, detail = read_npy_header(BytesSource(head, loc), total=info.file_size)
                if what != "object":
                    self.scan_npy(BytesSource(head, loc), loc, None, depth + 1, total=info.file_size)
                    continue
                data = self._read_zipfile_member(zf, info, loc)
                if data is None:
                    continue
                self.scan_npy(BytesSource(data, loc), loc, None, depth + 1)
            if npz_members and member is None and self.engine.report.kind in ("unknown", "zip"):
                self.engine.report.kind = "npz"

    def _read_zipfile_member(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo, loc: str) -> bytes | None:
        """The bytes zipfile delivers before anything fails (a loader unpickles a stream as
        it reads, so a CRC error at the end does not stop what ran before it)."""
        if info.compress_type != zipfile.ZIP_STORED and not self.engine.spend(
            "inflate", info.file_size, loc, "inflating .npz members", _LOADER
        ):
            return None
        chunks: list[bytes] = []
        total = 0
        cap = (
            max(0, min(self.engine.budget.inflate + info.compress_size, 1 << 31))
            if info.compress_type != zipfile.ZIP_STORED
            else 1 << 31
        )
        try:
            with zf.open(info) as fh:
                while total < cap:
                    b = fh.read(1 << 20)
                    if not b:
                        break
                    chunks.append(b)
                    total += len(b)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, zlib.error) as e:
            self.engine.add(
                "zip-crc" if "CRC" in str(e) else "trailing-data",
                "high",
                f"zipfile stops reading this member after {total} bytes ({type(e).__name__}: {str(e)[:80]}): "
                "numpy.load has unpickled what came before",
                loc,
                loader=_LOADER,
            )
        return b"".join(chunks)
