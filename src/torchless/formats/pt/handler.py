"""The ``pt`` format handler: eager checkpoints (``.pt``, ``.pth``, ``.bin``, ``.ckpt``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ...container.zip import is_zip
from ...core.findings import Problem
from ...core.tree import describe, iter_tensors
from ...io.source import open_source
from ..base import ZIP_CRC, Artifact, Capabilities, FormatHandler, LoadPolicy, Probe, summarize_tensors
from ..registry import register
from ..torchscript.spec import is_checkpoint_zip
from . import spec
from .read import _MAGIC_WINDOW, Checkpoint, make_resolver, read_checkpoint, starts_with_legacy_magic

__all__ = ["PtArtifact", "PtHandler"]


def writer_generation(cp: Checkpoint) -> str:
    """Which torch versions write a file like this (from the records present)."""
    if cp.layout == "tar":
        return "torch <= 0.1.9 (legacy tar)"
    if cp.layout == "legacy":
        return "torch 0.1.10-1.5, or _use_new_zipfile_serialization=False"
    r = cp.records
    if spec.SERIALIZATION_ID in r and spec.STORAGE_ALIGNMENT in r:
        return "torch >= 2.6 zip"
    if spec.SERIALIZATION_ID in r:
        return "torch 2.2-2.5 zip"
    if spec.BYTEORDER in r:
        return "torch 2.1 zip"
    return "torch 1.6-2.0 zip"


class PtArtifact(Artifact):
    """An opened eager checkpoint.

    Attributes:
        checkpoint: the parsed :class:`~torchless.formats.pt.read.Checkpoint` (its
            ``obj`` is the object tree, tensors lazy).
    """

    format = "pt"

    def __init__(self, path: Any, policy: LoadPolicy | None = None, *, probe: Probe | None = None) -> None:
        super().__init__(path if not isinstance(path, (bytes, bytearray, memoryview)) else "<bytes>", policy)
        pol = self.policy
        zr = probe.take_zip(require_prefix=False) if probe is not None else None
        if probe is not None:
            probe.close()
        self.source = zr.source if zr is not None else open_source(path)
        try:
            self.checkpoint = read_checkpoint(
                self.source,
                weights_only=pol.weights_only,
                resolver=make_resolver(pol.weights_only, extra=pol.extra_globals()) if pol.allowed_globals else None,
                limits=pol.limits,
                encoding=pol.encoding,
                mmap=pol.mmap,
                zip_reader=zr,
            )
        except BaseException:
            self.source.close()
            raise

    @property
    def obj(self) -> Any:
        return self.checkpoint.obj

    def load(self, *, weights_only: bool | None = None) -> Any:
        """The object tree, read under the ``weights_only`` policy given at open (asking
        for the other one raises :class:`~torchless.core.errors.UsageError`)."""
        self.load_policy(weights_only)
        return self.checkpoint.obj

    def tensors(self) -> Iterator[tuple[str, Any]]:
        return iter_tensors(self.checkpoint.obj)

    def info(self) -> dict[str, Any]:
        cp = self.checkpoint
        refused = sorted({g for g, ok in cp.globals_seen if not ok})
        from ...pickle.torch_globals import TORCH_ALLOWLIST

        torch_refuses = sorted({g for g, _ok in cp.globals_seen if g not in TORCH_ALLOWLIST})
        out: dict[str, Any] = {
            "format": "pt",
            "path": self.path,
            "layout": cp.layout,
            "writer": writer_generation(cp),
            "pickle_protocol": cp.protocol,
            "byteorder": cp.byteorder,
            "records": cp.records,
            "storages": len(cp.storages),
            **summarize_tensors(self.tensors()),
            "globals_not_allowlisted": refused,
            "torch_weights_only_would_refuse": torch_refuses
            if cp.protocol <= 3
            else ["<pickle protocol >= 4 (FRAME)>"] + torch_refuses,
            "tree": describe(cp.obj),
        }
        if cp.prefix:
            out["archive_prefix"] = cp.prefix
        return out

    def verify(self) -> list[Problem]:
        problems: list[Problem] = []
        cp = self.checkpoint
        if cp.zip is not None:
            problems += cp.zip.verify(crc=True)
            used = {f"data/{k}" for k in cp.storages}
            for rec in cp.zip.records():
                if rec.startswith("data/") and rec not in used:
                    problems.append(
                        Problem("unused-record", f"storage record {rec!r} is not referenced by data.pkl", rec, None, "warning")
                    )
        problems += super().verify()
        return problems

    def close(self) -> None:
        self.source.close()


@register
class PtHandler(FormatHandler):
    """Eager torch checkpoints: zip, legacy stream and legacy tar."""

    name = "pt"
    extensions = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".pkl")
    priority = 100  # after the specific zip flavours (TorchScript, .pt2, AOTI)
    description = "torch.save checkpoint (zip, legacy stream, legacy tar)"
    capabilities = Capabilities(
        write_tensors=True,
        write_objects=True,
        write_options=("alignment", "compute_crc", "prefix"),
        checksum=ZIP_CRC + " (the legacy pre-1.6 format: none)",
    )

    def sniff(self, probe: Probe) -> bool:
        if probe.is_dir:
            return False
        head = probe.head
        if is_zip(head):
            return is_checkpoint_zip(probe.zip_records())
        if spec.is_legacy_stream(head) or starts_with_legacy_magic(head[:_MAGIC_WINDOW]):
            return True
        if probe.suffix not in (".tar", ".pt", ".pth"):
            return False
        return spec.is_tar_header(head)  # tarfile's own test: ustar, GNU and v7 headers

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> PtArtifact:
        return PtArtifact(path, policy, probe=probe)

    def save(
        self,
        obj: Any,
        path: Any,
        *,
        progress: Callable[[int], None] | None = None,
        alignment: int = 64,
        compute_crc: bool = True,
        prefix: str | None = None,
    ) -> None:
        from .write import save_checkpoint  # writers import the pickler on use

        save_checkpoint(obj, path, alignment=alignment, compute_crc=compute_crc, prefix=prefix, progress=progress)

    def write_tensors(
        self,
        items: Iterable[tuple[str, Any]],
        path: Any,
        *,
        progress: Callable[[int], None] | None = None,
        alignment: int = 64,
        compute_crc: bool = True,
        prefix: str | None = None,
    ) -> None:
        """Write named tensors as a state dict (an OrderedDict, like ``state_dict()``)."""
        from ...core.tensor import unique_names
        from ...core.values import StateDict

        sd = StateDict()
        for name, t in unique_names(items, path):
            sd[name] = t
        self.save(sd, path, progress=progress, alignment=alignment, compute_crc=compute_crc, prefix=prefix)


__all__ += ["writer_generation"]
