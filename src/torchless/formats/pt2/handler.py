"""The ``pt2`` format handler: ExportedProgram archives written by ``torch.export.save``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ...core.findings import Problem
from ...core.lazy import LazyModule
from ..base import ZIP_CRC, Artifact, Capabilities, FormatHandler, LoadPolicy, Probe, summarize_tensors
from ..registry import register
from .spec import ARCHIVE_VERSION_PATH, is_legacy_pt2, is_pt2

if TYPE_CHECKING:  # the real modules, imported on first use at run time
    from ...graph import verifier as _verifier
    from . import read as _read
else:
    _verifier = LazyModule("torchless.graph.verifier")
    _read = LazyModule("torchless.formats.pt2.read")

__all__ = ["Pt2Artifact", "Pt2Handler", "program_info"]


def program_info(prog: _read.Program) -> dict[str, Any]:
    """JSON-ready summary of one program: signature, ops, weights, dynamic dims."""
    tensors = [(k, v) for k, v in {**prog.state_dict, **prog.constants}.items() if not isinstance(v, _read.OpaqueObject)]
    nodes = sum(len(g.nodes) for _p, g in prog.graph.walk())
    return {
        "dialect": prog.dialect,
        "schema_version": ".".join(map(str, prog.schema_version)),
        "torch_version": prog.torch_version,
        "signature": prog.signature.to_dict(),
        "nodes": nodes,
        "subgraphs": [p for p, _g in prog.graph.walk() if p],
        "ops": prog.op_histogram(),
        "non_core_ops": _verifier.non_core_ops(prog.graph),
        "weights": summarize_tensors(tensors),
        "state_dict": len(prog.state_dict),
        "constants": len(prog.constants),
        "opaque_constants": sorted(k for k, v in prog.constants.items() if isinstance(v, _read.OpaqueObject)),
        "dynamic_dims": prog.dynamic_dims(),
        "range_constraints": {k: list(v) for k, v in prog.range_constraints.items()},
        "guards": prog.guards_code,
    }


class Pt2Artifact(Artifact):
    """An opened ``.pt2`` archive.

    Attributes:
        archive: the :class:`~.read.Pt2Archive` (``archive.programs``, ``extra_files``).
    """

    format = "pt2"

    def __init__(self, path: Any, policy: LoadPolicy | None = None, *, probe: Probe | None = None) -> None:
        super().__init__(path if not isinstance(path, (bytes, bytearray, memoryview)) else "<bytes>", policy)
        try:
            zr = probe.take_zip(require_prefix=False) if probe is not None else None
        finally:
            if probe is not None:
                probe.close()
        try:
            self.archive = _read.Pt2Archive(zr if zr is not None else path)
        except BaseException:
            if zr is not None:
                zr.close()
            raise

    @property
    def programs(self) -> dict[str, _read.Program]:
        return self.archive.programs

    def tensors(self) -> Iterator[tuple[str, Any]]:
        """State dict then constants; with several models, names are ``<model>/<fqn>``."""
        multi = len(self.archive.programs) > 1
        for name, prog in self.archive.programs.items():
            for k, v in {**prog.state_dict, **prog.constants}.items():
                if isinstance(v, _read.OpaqueObject):
                    continue
                yield (f"{name}/{k}" if multi else k), v

    def info(self) -> dict[str, Any]:
        progs = {name: program_info(p) for name, p in self.archive.programs.items()}
        return {
            "format": "pt2",
            "path": self.path,
            ARCHIVE_VERSION_PATH: self.archive.archive_version,
            "layout": "pre-2.8 (torch 2.5-2.7: serialized_exported_program.json)" if self.archive.legacy else "pt2 archive",
            "models": list(progs),
            **summarize_tensors(self.tensors()),
            "programs": progs,
            "extra_files": sorted(self.archive.extra_files),
        }

    def load(self, *, weights_only: bool | None = None) -> Any:
        """The :class:`~.read.Program` (one model) or a dict name -> Program."""
        self.load_policy(weights_only)
        progs = self.archive.programs
        return next(iter(progs.values())) if len(progs) == 1 else dict(progs)

    def verify(self, *, strict_core: bool = False) -> list[Problem]:
        """Zip CRCs and payload bounds, then the ATen-IR verifier on every program
        (``strict_core``: non-core ops in ATEN-dialect programs are errors, not warnings)."""
        problems: list[Problem] = list(self.archive.zip.verify(crc=True))
        problems += super().verify()
        multi = len(self.archive.programs) > 1
        for name, prog in self.archive.programs.items():
            problems += _verifier.verify_program(prog, where=name if multi else "", strict_core=strict_core)
        return problems

    def close(self) -> None:
        self.archive.close()


@register
class Pt2Handler(FormatHandler):
    """ExportedProgram archives (``torch.export.save``)."""

    name = "pt2"
    extensions = (".pt2",)
    priority = 20  # before plain checkpoints (pt, 100): the archive also holds .pt records
    description = "torch.export ExportedProgram archive (graph + weights)"
    # edit: load() gives the Program, its state_dict/constants take new tensors, save_pt2 writes them
    capabilities = Capabilities(write_objects=True, edit=True, checksum=ZIP_CRC, write_options=("extra_files", "sample_inputs"))

    def sniff(self, probe: Probe) -> bool:
        if probe.is_dir:
            return False
        records = probe.zip_records()
        return is_pt2(records) or is_legacy_pt2(records)

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> Pt2Artifact:
        return Pt2Artifact(path, policy, probe=probe)

    def save(
        self,
        obj: Any,
        path: Any,
        *,
        progress: Any = None,
        extra_files: dict[str, str | bytes] | None = None,
        sample_inputs: dict[str, Any] | None = None,
    ) -> None:
        from .write import save_pt2

        save_pt2(path, obj, extra_files=extra_files, sample_inputs=sample_inputs)
