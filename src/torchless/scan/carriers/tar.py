"""The legacy torch tar layout, read exactly as torch 2.13's ``_legacy_load`` reads it.

torch opens the file with ``tarfile.open(fileobj=f, mode="r:", format=PAX_FORMAT)`` (any
header ``tarfile`` accepts: ustar, GNU, PAX or v7 without the ``ustar`` magic), then
``tar.extract("storages")``, ``tar.extract("tensors")`` and ``tar.extractfile("pickle")``:
``tarfile`` picks the *last* member of each name and reassembles sparse members. Each
member's bytes are taken from ``tarfile`` itself (the oracle), never recomputed.

``storages``: a count pickle (``range()`` of it: an int or a bool), then per storage an
``(key, location, storage_type)`` pickle, an int64 element count and that many elements of
``storage_type``'s size; then the ``storage_views`` pickle. ``tensors``: a count pickle,
then per tensor an args pickle, an int32 ``ndim`` (any non-negative value: torch has no
64-dim cap here), 4 skipped bytes, ``ndim`` sizes, ``ndim`` strides and an offset (int64).
``pickle``: the object, unpickled with torch's persistent_load.

Where torch itself would stop (a count that is not an int, a short read, a negative
``ndim``), the walker stops too and says so (``info``); where it cannot follow torch (a
count or storage type computed at load time, a link member, a budget), it reports
``unanalysable``.
"""

from __future__ import annotations

import struct
import tarfile
from collections.abc import Callable

from ...core.dtypes import STORAGE_NAMES
from ...formats.pt.spec import LEGACY_TAR_MEMBERS, open_legacy_tar, tar_errors
from ...io.source import ByteSource
from ..analysis import StreamResult, Sym, describe
from .common import Carrier, walks
from .pickles import PickleCarrier

__all__ = ["TarCarrier"]

_LOADER = "torch.load(weights_only=False)"
_LEGACY_NAMES = LEGACY_TAR_MEMBERS
_STORAGES, _TENSORS, _PICKLE = LEGACY_TAR_MEMBERS


class TarCarrier(Carrier):
    """A carrier run by the scan engine (:class:`~torchless.scan.carriers.base.ScanEngine`): legacy torch tar files."""

    @walks(_LOADER)
    def scan_tar(self, src: ByteSource, member: str | None, base: int | None, depth: int) -> None:
        pre = f"{member} > " if member else ""
        try:
            tf = open_legacy_tar(src)
        except tar_errors() as e:
            self.engine.add(
                "unrecognized",
                "info",
                f"tarfile refuses the archive ({e}); torch.load goes on to read it as pickles",
                member,
                loader=_LOADER,
            )
            return
        members: list[tarfile.TarInfo] = []
        try:
            for m in tf:
                members.append(m)
                if not self.engine.spend("nodes", 1, member, "listing tar members", _LOADER):
                    break
        except tar_errors() as e:
            # torch's extract() reads the member list up to the name it wants: a broken
            # header after the legacy members may or may not be reached
            self.engine.add(
                "unanalysable",
                "high",
                f"tarfile stops listing members after {len(members)} ({e}): members after that point are not analysed",
                member,
                loader=_LOADER,
            )
        last = {m.name: m for m in members}  # tarfile.getmember(): the last of a name
        legacy = all(n in last for n in _LEGACY_NAMES)
        if member is None:
            self.engine.report.kind = "tar"
        for name in _LEGACY_NAMES:
            tm = last.get(name)
            if tm is None:
                continue
            data = self._tar_member_bytes(tf, tm, pre + name)
            if data is None:
                continue
            if name == _STORAGES:
                self._walk_tar_storages(data, pre + name, None, depth)
            elif name == _TENSORS:
                self._walk_tar_tensors(data, pre + name, None, depth)
            else:
                self.engine.carrier(PickleCarrier).scan_pickles(
                    _bs(data, pre + name), pre + name, None, depth, strict=True, torch_load=True
                )
        for i, m in enumerate(members):
            if ".." in m.name.split("/") or m.name.startswith("/"):
                self.engine.add(
                    "path-traversal", "medium", f"tar member name {m.name!r} escapes the extraction folder", pre + m.name
                )
            if m.name in _LEGACY_NAMES and last[m.name] is m or not m.isfile() or m.size <= 0:
                continue
            loc = pre + m.name + (f" (copy #{i}; torch reads the last)" if m.name in _LEGACY_NAMES else "")
            data = self._tar_member_bytes(tf, m, loc)
            if data is not None:  # not read by torch; scanned for what else could load it
                self.engine.scan_bytes(data, loc, None, depth + 1)
        if not legacy and member is None and not any(m.isfile() for m in members):
            self.engine.add(
                "unrecognized",
                "info",
                "a tar archive without the legacy members: torch.load raises on it",
                member,
                loader=_LOADER,
            )

    def _tar_member_bytes(self, tf: tarfile.TarFile, m: tarfile.TarInfo, loc: str) -> bytes | None:
        if m.issym() or m.islnk():
            escapes = m.linkname.startswith("/") or ".." in m.linkname.split("/")
            if escapes:
                self.engine.add(
                    "link-escape",
                    "high",
                    f"tar member {m.name!r} is a {'symbolic' if m.issym() else 'hard'} link to {m.linkname!r}: torch's "
                    "tar.extract() writes the link and then reads whatever it points to, outside the checkpoint",
                    loc,
                    loader=_LOADER,
                )
            self.engine.add(
                "unanalysable",
                "high",
                f"tar member {m.name!r} is a link to {m.linkname!r}: the bytes torch reads through it are not analysed",
                loc,
                loader=_LOADER,
            )
            return None
        if not m.isfile():
            if m.name in _LEGACY_NAMES:
                self.engine.add(
                    "unrecognized",
                    "info",
                    f"legacy member {m.name!r} is not a regular file (type {m.type!r}): torch's extract fails on it",
                    loc,
                    loader=_LOADER,
                )
            return None
        if m.size > self.engine.budget.inflate + (1 << 31) or (
            m.issparse() and not self.engine.spend("inflate", m.size, loc, "reassembling sparse tar members", _LOADER)
        ):
            self.engine.add("limit", "high", f"tar member of {m.size} bytes is over the scan's budget", loc, loader=_LOADER)
            return None
        try:
            fh = tf.extractfile(m)
            data = fh.read() if fh is not None else b""
        except (tarfile.TarError, EOFError, OSError, ValueError) as e:
            self.engine.add("unanalysable", "high", f"tarfile cannot read member {m.name!r} ({e})", loc, loader=_LOADER)
            return None
        if len(data) < m.size:
            self.engine.add(
                "unrecognized",
                "info",
                f"member {m.name!r} is truncated ({len(data)} of {m.size} bytes): torch's extract raises",
                loc,
                loader=_LOADER,
            )
        return data

    def _count(self, res: StreamResult, loc: str, what: str) -> int | None:
        """``range(value)`` as torch runs it: an int or a bool; None where torch stops."""
        if res.end is None:
            return None  # the pickle itself failed: torch stops there (malformed-pickle reported)
        v = res.value
        if type(v) in (int, bool):
            return int(v)
        if isinstance(v, Sym):
            self.engine.add(
                "unanalysable",
                "high",
                f"the {what} count is {describe(v)}, computed at load time: the walker cannot know how many records torch reads",
                loc,
                res.start,
                loader=_LOADER,
            )
        else:
            self.engine.add(
                "trailing-data",
                "info",
                f"the {what} count is {type(v).__name__}: torch's range() raises TypeError and stops here",
                loc,
                res.start,
                loader=_LOADER,
            )
        return None

    def _walk_tar_records(
        self,
        data: bytes,
        loc: str,
        base: int | None,
        depth: int,
        what: str,
        after: Callable[[int, int, StreamResult], int | None],
    ) -> int | None:
        """torch's loop over a legacy-tar member: a count pickle, then per record a pickle
        followed by raw bytes that ``after(i, n, result)`` skips (returning the offset
        after them, or None where torch stops). Returns the offset after the last record."""
        res = self.engine.carrier(PickleCarrier).analyse_stream(data, 0, loc, base, depth)
        n = self._count(res, loc, what)
        if n is None:
            return None
        pos = res.end
        if pos is None:
            return None
        for i in range(n):
            if pos >= len(data):
                self.engine.add(
                    "trailing-data",
                    "info",
                    f"{what} #{i} of {n} is missing: torch's pickle.load raises EOFError and stops",
                    loc,
                    pos,
                    loader=_LOADER,
                )
                return None
            r = self.engine.carrier(PickleCarrier).analyse_stream(data, pos, loc, base, depth)
            if r.end is None:
                return None
            pos = after(i, n, r)
            if pos is None:
                return None
        return pos

    def _walk_tar_storages(self, data: bytes, loc: str, base: int | None, depth: int) -> None:
        def skip_bytes(i: int, n: int, r: StreamResult) -> int | None:
            v = r.value
            st = v[2] if isinstance(v, (tuple, list)) and len(v) == 3 else None
            short = st.qualname.rsplit(".", 1)[-1] if isinstance(st, Sym) and st.kind == "global" else None
            if short not in STORAGE_NAMES:
                if isinstance(v, (tuple, list)) and len(v) == 3 and isinstance(st, Sym):
                    self.engine.add(
                        "unanalysable",
                        "high",
                        f"storage #{i} has type {describe(st)}, whose element size the walker does not know: "
                        "torch reads its bytes by that size, so the rest of this member is not analysed",
                        loc,
                        r.start,
                        loader=_LOADER,
                    )
                else:
                    self.engine.add(
                        "trailing-data",
                        "info",
                        f"storage #{i} record is {describe(v)}: torch cannot unpack it and stops",
                        loc,
                        r.start,
                        loader=_LOADER,
                    )
                return None
            itemsize = STORAGE_NAMES[short].itemsize
            pos = r.end
            if pos is None:  # _walk_tar_records stops before calling
                return None
            if pos + 8 > len(data):
                self.engine.add(
                    "trailing-data", "info", "storage size cut short: torch's read fails and stops", loc, pos, loader=_LOADER
                )
                return None
            count: int = struct.unpack_from("<q", data, pos)[0]
            if count < 0 or pos + 8 + count * itemsize > len(data):
                self.engine.add(
                    "trailing-data",
                    "info",
                    f"storage #{i} claims {count} elements, more than the member holds: torch's read fails and stops",
                    loc,
                    pos,
                    loader=_LOADER,
                )
                return None
            return pos + 8 + count * itemsize

        pos = self._walk_tar_records(data, loc, base, depth, "storage", skip_bytes)
        if pos is None:
            return
        if pos >= len(data):
            self.engine.add(
                "trailing-data",
                "info",
                "no storage_views pickle: torch's pickle.load raises EOFError and stops",
                loc,
                pos,
                loader=_LOADER,
            )
            return
        self.engine.carrier(PickleCarrier).analyse_stream(data, pos, loc, base, depth)

    def _walk_tar_tensors(self, data: bytes, loc: str, base: int | None, depth: int) -> None:
        def skip_header(i: int, n: int, r: StreamResult) -> int | None:
            pos = r.end
            if pos is None:  # _walk_tar_records stops before calling
                return None
            if pos + 8 > len(data):
                self.engine.add(
                    "trailing-data",
                    "info",
                    "tensor header cut short: torch's struct.unpack fails and stops",
                    loc,
                    pos,
                    loader=_LOADER,
                )
                return None
            ndim: int = struct.unpack_from("<i", data, pos)[0]
            need = 8 + 16 * ndim + 8
            if ndim < 0 or pos + need > len(data):
                self.engine.add(
                    "trailing-data",
                    "info",
                    f"tensor #{i} has ndim {ndim}: torch's struct.unpack fails and stops",
                    loc,
                    pos,
                    loader=_LOADER,
                )
                return None
            return pos + need

        self._walk_tar_records(data, loc, base, depth, "tensor", skip_header)


def _bs(data: bytes, name: str) -> ByteSource:
    from ...io.source import BytesSource

    return BytesSource(data, name)
