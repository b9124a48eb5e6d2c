"""ONNX models: no pickle and no code a loader runs, but external data paths.

``onnx.load`` (and onnxruntime) read every tensor whose ``data_location`` is EXTERNAL
from the file its ``location`` names, relative to the model's folder. A location that
is absolute, climbs out with ``..``, or resolves through a symlink to somewhere else
reads a file outside the model (``/etc/passwd``, a key file) into a tensor: older
``onnx`` releases followed such paths, and the scanner reports each one
(``link-escape``, high). The real loaders are the oracle of the tests: every location the
scanner flags is one that current ``onnx.load`` and onnxruntime refuse by their own path
checks, and every model they load is clean. The walk is the format's own (:mod:`formats.onnx.spec`): the
``onnx`` package is not needed. A model whose bytes cannot be walked is reported
``unanalysable``: it is never called clean on a guess.
"""

from __future__ import annotations

import os

from ...formats.onnx.spec import external_locations, fields, is_onnx_file, parses_as_model
from ...io.source import ByteSource
from .common import Carrier

__all__ = ["OnnxCarrier"]

_LOADER = "onnx.load"


def _escapes(root: str, location: str) -> str | None:
    """Why ``location`` leaves ``root`` (the model's folder), or None."""
    if not location or "\x00" in location:
        return "an empty or NUL-containing path"
    if os.path.isabs(location) or location.startswith(("/", "\\")) or (len(location) > 1 and location[1] == ":"):
        return "an absolute path"
    parts = location.replace("\\", "/").split("/")
    if ".." in parts:
        return "a path that climbs out with '..'"
    real = os.path.realpath(os.path.join(root, location))
    home = os.path.realpath(root)
    try:
        inside = os.path.commonpath([real, home]) == home
    except ValueError:
        inside = False
    if not inside:
        return f"a link that resolves to {real}"
    return None


class _LazyBytes:
    """A remote file's bytes, fetched a block at a time where the walk looks: deciding
    whether a file parses as a message reads its top-level tags and lengths only, so a
    file that is no model costs a block, not the whole file."""

    BLOCK = 1 << 16

    def __init__(self, src: ByteSource) -> None:
        self.src = src
        self.lo = 0
        self.block = b""

    def __len__(self) -> int:
        return self.src.size

    def __getitem__(self, i: int) -> int:
        j = i - self.lo
        if 0 <= j < len(self.block):
            return self.block[j]
        if not 0 <= i < self.src.size:
            raise IndexError(i)
        self.lo = i - i % self.BLOCK
        self.block = self.src.read_at(self.lo, min(self.BLOCK, self.src.size - self.lo))
        return self.block[i - self.lo]


def _bytes_where_looked(src: ByteSource) -> object:
    from ...io.source import RemoteSource

    return _LazyBytes(src) if isinstance(src, RemoteSource) else src.view(0, src.size)


class OnnxCarrier(Carrier):
    """A carrier run by the scan engine (:class:`~torchless.scan.carriers.base.ScanEngine`): the ONNX view of a file."""

    def onnx_view(self, src: ByteSource, head: bytes) -> bool:
        """Whether ``onnx.load`` would take this file for a model: named ``.onnx`` and
        starting like one (a file that then does not parse is unanalysable), or, whatever
        its name, parsing whole as a protobuf message with a graph or a function (the
        loader ignores the suffix, unknown fields and fields of the wrong wire type). Bytes
        too many fields long to decide are reported unanalysable, never passed over."""
        if is_onnx_file(head, self.engine.path):
            return True
        try:
            return parses_as_model(_bytes_where_looked(src))
        except ValueError as e:
            self.engine.add(
                "unanalysable",
                "high",
                f"the bytes may be an ONNX model (onnx.load ignores the file name) but were not walked to the end ({e})",
                None,
                loader=_LOADER,
            )
            return False

    def scan_onnx(self, src: ByteSource, member: str | None) -> None:
        buf = src.view(0, src.size)
        try:
            for _ in fields(buf, 0, src.size):  # the whole file must tile as one message
                pass
            locations = external_locations(buf)
        except ValueError as e:
            self.engine.add(
                "unanalysable",
                "high",
                f"taken for an ONNX model (named .onnx and starting like one, or parsing at the top level as "
                f"one), but its bytes do not parse as a ModelProto ({e}); "
                "where its tensors come from is unknown",
                member,
                loader=_LOADER,
            )
            return
        root = os.path.dirname(os.path.abspath(self.engine.path))
        for loc in locations:
            why = _escapes(root, loc.location)
            if why is not None:
                self.engine.add(
                    "link-escape",
                    "high",
                    f"external data of tensor {loc.tensor!r} is read from {loc.location!r}, {why}: a loader that "
                    "follows it reads a file outside the model's folder into the tensor (current onnx and "
                    "onnxruntime refuse the model; older releases read the file)",
                    member,
                    file_offset=loc.offset,
                    loader=_LOADER,
                )
