"""The legacy torch tar layout (``storages``/``tensors``/``pickle``), walked as torch walks it."""

from __future__ import annotations

import struct
import tarfile

from ...core.dtypes import STORAGE_NAMES
from ...core.source import BytesSource, ByteSource, SourceFile
from .common import sniff as _sniff

__all__ = ["TarCarrier"]


class TarCarrier:
    """Mixin of :class:`~torchless.scan.carriers.Scanner`: legacy torch tar files."""

    # -- tar ---------------------------------------------------------------------------
    def scan_tar(self, src: ByteSource, member: str | None, base: int | None, depth: int) -> None:
        pre = f"{member} > " if member else ""
        try:
            tf = tarfile.open(fileobj=SourceFile(src), mode="r:")
            members = tf.getmembers()[:10_000]
        except (tarfile.TarError, EOFError, OSError, ValueError) as e:
            self.add("malformed-pickle", "medium", f"unreadable tar archive: {e}", member)
            self.scan_pickles(src, member, base, depth, strict=False)
            return
        names = {m.name for m in members if m.isfile()}
        legacy = {"storages", "tensors", "pickle"} <= names
        if legacy and member is None:
            self.report.kind = "tar"
        for m in members:
            if not m.isfile():
                continue
            if ".." in m.name.split("/") or m.name.startswith("/"):
                self.add("path-traversal", "medium", f"tar member name {m.name!r} escapes the extraction folder", pre + m.name)
            if m.size <= 0 or m.offset_data + m.size > src.size:
                continue
            data = bytes(src.view(m.offset_data, m.size))
            mb = None if base is None else base + m.offset_data
            if legacy and m.name == "storages":
                self._walk_tar_storages(data, pre + m.name, mb, depth)
            elif legacy and m.name == "tensors":
                self._walk_tar_tensors(data, pre + m.name, mb, depth)
            else:
                self.scan_bytes(data, pre + m.name, mb, depth + 1) if _sniff(data[:512]) not in ("pickle", "other") else self.scan_pickles(BytesSource(data), pre + m.name, mb, depth, strict=(m.name == "pickle"))

    def _walk_tar_storages(self, data: bytes, loc: str, base: int | None, depth: int) -> None:
        res = self.analyse_stream(data, 0, loc, base, depth)
        if res.end is None or type(res.value) is not int:
            return
        pos = res.end
        for _ in range(min(res.value, 1_000_000)):
            r = self.analyse_stream(data, pos, loc, base, depth)
            if r.end is None:
                return
            itemsize = 1
            for g in r.globals:
                short = g.qualname.rsplit(".", 1)[-1]
                if short in STORAGE_NAMES:
                    itemsize = STORAGE_NAMES[short].itemsize
            pos = r.end
            if pos + 8 > len(data):
                return
            (count,) = struct.unpack_from("<q", data, pos)
            pos += 8 + max(0, count) * itemsize
        if pos < len(data):
            self.analyse_stream(data, pos, loc, base, depth)

    def _walk_tar_tensors(self, data: bytes, loc: str, base: int | None, depth: int) -> None:
        res = self.analyse_stream(data, 0, loc, base, depth)
        if res.end is None or type(res.value) is not int:
            return
        pos = res.end
        for _ in range(min(res.value, 1_000_000)):
            r = self.analyse_stream(data, pos, loc, base, depth)
            if r.end is None or r.end + 8 > len(data):
                return
            pos = r.end
            (ndim,) = struct.unpack_from("<i", data, pos)
            if ndim < 0 or ndim > 64:
                return
            pos += 8 + 16 * ndim + 8
