"""The ``onnx`` format handler: detection, the lazy artifact, summary and verification."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ...core.errors import TorchlessError
from ...core.findings import Problem
from ...core.lazy import LazyModule
from ..base import Artifact, Capabilities, FormatHandler, LoadPolicy, Probe
from ..registry import register
from .spec import ONNX_SUFFIX, looks_like_model

if TYPE_CHECKING:  # the real modules, imported on first use at run time
    from . import read as _read
    from . import summary as _summary
else:
    _read = LazyModule("torchless.formats.onnx.read")
    _summary = LazyModule("torchless.formats.onnx.summary")

__all__ = ["OnnxArtifact", "OnnxHandler", "looks_like_model"]


class OnnxArtifact(Artifact):
    """An opened ``.onnx`` model.

    Tensors are the initializers of every graph (the main graph's by their names,
    subgraphs' as ``If_0/then_branch/<name>``) and the values of Constant nodes (by the
    node's output name). ``model`` is the ``onnx.ModelProto``.

    Args:
        path: the model file (or bytes; then external data is refused).
        base_dir: directory for external data (default: the model's).
        include_constants: list Constant-node tensors too (default True).
    """

    format = "onnx"

    def __init__(
        self,
        path: Any,
        policy: LoadPolicy | None = None,
        *,
        base_dir: str | None = None,
        include_constants: bool = True,
        store: Any = None,
    ) -> None:
        self.om = _read.OnnxModel(path, base_dir=base_dir, include_constants=include_constants, store=store)
        super().__init__(self.om.path, policy, store=self.om.store)
        self.model = self.om.model

    @property
    def records(self) -> list[Any]:
        return self.om.records

    def tensors(self) -> Iterator[tuple[str, Any]]:
        return self.om.tensors()

    def __getitem__(self, name: str) -> Any:
        if name in self.om.unsupported:
            raise self.om.unsupported[name]
        return super().__getitem__(name)

    def info(self) -> dict[str, Any]:
        return _summary.summarize_model(self.om)

    def graph(self) -> Any:
        """The main graph as a :class:`torchless.graph.ir.Graph` (see
        :mod:`torchless.formats.onnx.graph`)."""
        from .graph import to_graph

        return to_graph(self.om)

    def verify(self) -> list[Problem]:
        """Run the onnx checker, then read every tensor: sizes, external bounds, checksums."""
        problems: list[Problem] = []
        onnx = _read.import_onnx()
        try:
            if self.om.external.url:
                _check_remote(onnx, self.om)
            elif self.path != "<bytes>":
                onnx.checker.check_model(self.path)
            else:
                onnx.checker.check_model(self.model)
        except Exception as e:  # onnx.checker.ValidationError and the C++ loader's errors
            msg = " ".join(str(e).split())[:500] or type(e).__name__
            problems.append(Problem("onnx-checker", msg))
        for name, err in self.om.unsupported.items():
            problems.append(Problem("unsupported-tensor", err.message, name, severity="warning"))
        spans: dict[str, list[tuple[int, int, str]]] = {}
        for r in self.om.records:
            try:
                t = r.tensor
                t._check_bounds()
                if t.storage is None:
                    problems.append(Problem("tensor", "tensor has no data", r.name))
                    continue
                data = t.storage.bytes()
            except TorchlessError as e:
                problems.append(Problem("tensor", str(e), r.name))
                continue
            ext = r.external
            if ext is not None:
                spans.setdefault(ext.file, []).append((ext.offset, ext.offset + ext.length, r.name))
                if ext.unknown_keys:
                    problems.append(
                        Problem(
                            "external-data-key",
                            f"unknown external_data keys ignored: {', '.join(ext.unknown_keys)}",
                            r.name,
                            severity="warning",
                        )
                    )
                if ext.checksum is not None:
                    import hashlib  # verify only

                    got = hashlib.sha1(data).hexdigest()
                    if got != ext.checksum.lower():
                        problems.append(
                            Problem(
                                "checksum",
                                f"SHA-1 of the external data is {got}, the model records {ext.checksum}",
                                r.name,
                                ext.offset,
                            )
                        )
            elif r.proto is not None and len(r.proto.external_data) and r.proto.data_location != _read.EXTERNAL:
                problems.append(
                    Problem(
                        "external-data",
                        "external_data entries on a tensor whose data_location is not EXTERNAL (ignored)",
                        r.name,
                        severity="warning",
                    )
                )
        for sp in spans.values():
            sp.sort()
            for (_b0, e0, n0), (b1, _e1, n1) in zip(sp, sp[1:], strict=False):
                if b1 < e0:
                    problems.append(
                        Problem("external-overlap", f"external data of {n0!r} and {n1!r} overlap", n1, b1, severity="warning")
                    )
        return problems

    def close(self) -> None:
        self.om.close()


def _check_remote(onnx: Any, om: Any) -> None:
    """The onnx checker on a remote model: it reads local paths only, so the model's bytes
    (fetched already) go to a temporary folder beside an empty stand-in for each external
    data file. The checker only tests that those files exist (relative, no ``..``, a
    regular file); their ranges were checked when the model was opened, remotely."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="torchless-onnx-") as tmp:
        name = os.path.join(tmp, "model.onnx")
        with open(name, "wb") as f:
            f.write(om.source.view(0, om.source.size))
        for r in om.records:
            if r.external is not None:  # a location checked by ExternalData.resolve (relative, no '..')
                stand_in = os.path.join(
                    tmp, *[p for p in r.external.location.replace("\\", "/").split("/") if p not in ("", ".")]
                )
                os.makedirs(os.path.dirname(stand_in), exist_ok=True)
                open(stand_in, "ab").close()
        onnx.checker.check_model(name)


@register
class OnnxHandler(FormatHandler):
    name = "onnx"
    extensions = (ONNX_SUFFIX,)
    priority = 40
    description = "ONNX model (protobuf; initializers, Constant nodes, external data)"
    capabilities = Capabilities(edit=True, open_options=("base_dir", "include_constants"))

    def sniff(self, probe: Probe) -> bool:
        # onnx.load looks at no suffix: a model is recognised by its first fields too
        if probe.is_dir:
            return False
        return looks_like_model(probe.head) if probe.suffix == ONNX_SUFFIX else looks_like_model(probe.head, strict=True)

    def _open(
        self, path: Any, policy: LoadPolicy, probe: Probe | None, *, base_dir: str | None = None, include_constants: bool = True
    ) -> OnnxArtifact:
        if probe is not None:
            probe.close()
        store = probe.store_of(path) if probe is not None else None
        return OnnxArtifact(path, policy, base_dir=base_dir, include_constants=include_constants, store=store)
