"""The ``aoti`` format handler: AOTInductor packages (``aoti_compile_and_package``).

An AOTInductor package is a PT2 archive, so this handler sniffs before the ``pt2`` one
(priority 15 < 20) and claims only archives with ``data/aotinductor/<model>/`` records.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ...container.zip import is_zip
from ...core.dtypes import DTYPES
from ...core.errors import TorchlessError
from ...core.findings import Problem
from ...core.lazy import LazyModule
from ..base import ZIP_CRC, Artifact, Capabilities, FormatHandler, LoadPolicy, Probe, summarize_tensors
from ..registry import register
from .spec import (
    ALIGN_BYTES,
    AOTINDUCTOR_DIR,
    ARCHIVE_FORMAT_PATH,
    ARCHIVE_FORMAT_VALUE,
    METADATA_KEYS,
    WEIGHTS_DIR,
    is_aoti_records,
)

if TYPE_CHECKING:  # the real modules, imported on first use at run time
    from . import elf as _elf
    from . import read as _read
else:
    _read = LazyModule("torchless.formats.aoti.read")
    _elf = LazyModule("torchless.formats.aoti.elf")

__all__ = ["AotiArtifact", "AotiHandler"]

#: files a package_cpp_only CMakeLists.txt compiles or links (``${CMAKE_CURRENT_SOURCE_DIR}/x``)
_CMAKE_REF = re.compile(r"\$\{CMAKE_CURRENT_SOURCE_DIR\}/([^\s)\"]+)")


class AotiArtifact(Artifact):
    """An opened AOTInductor package.

    Attributes:
        package: the parsed :class:`~torchless.formats.aoti.read.AotiPackage`.
    """

    format = "aoti"

    def __init__(self, path: Any, policy: LoadPolicy | None = None, *, probe: Probe | None = None) -> None:
        super().__init__(path if not isinstance(path, (bytes, bytearray, memoryview)) else "<bytes>", policy)
        # the policy's weights_only is held for API symmetry: weight pickles are always read
        # with the allowlist (torch.load in the AOTI loader uses weights_only=True too)
        try:
            zr = probe.take_zip(require_prefix=False) if probe is not None else None
        finally:
            if probe is not None:
                probe.close()
        try:
            self.package: _read.AotiPackage = _read.read_package(zr if zr is not None else path, limits=self.policy.limits)
        except BaseException:
            if zr is not None:
                zr.close()
            raise

    def tensors(self) -> Iterator[tuple[str, Any]]:
        return iter(self.package.tensors())

    def info(self) -> dict[str, Any]:
        pkg = self.package
        out: dict[str, Any] = {
            "format": "aoti",
            "path": self.path,
            "records": pkg.records,
            "models": [m.name for m in pkg.models.values()],
            **summarize_tensors(self.tensors()),
        }
        if pkg.zip.prefix:
            out["archive_prefix"] = pkg.zip.prefix
        for m in pkg.models.values():
            out[f"model {m.name}"] = m.to_dict(compact=True)
        other = {f.name: f"{f.kind}, {f.size} B" for f in pkg.other_files if f.name not in pkg.records}
        if other:
            out["other_files"] = other
        out["note"] = "the compute graph is compiled C++ (wrapper.so); torchless lists it but never loads or runs it"
        return out

    def load(self, *, weights_only: bool | None = None) -> Any:
        """What the archive models, never a bare tensor dict.

        A ``.pt2`` that holds ExportedPrograms (``models/<name>.json``) next to its
        AOTInductor folders is what ``torch.export.load`` returns the program of (after
        also loading, i.e. compiling or ``dlopen``-ing, the AOTInductor content, which
        torchless never does): the :class:`~torchless.formats.pt2.read.Program`, or a
        dict name -> Program for several models, as the ``pt2`` handler returns. A
        package without one (``torch.export.load`` loads its native code, then raises)
        is returned as the :class:`~torchless.formats.aoti.read.AotiPackage` (what
        ``aoti_load_package`` compiles into a callable: models, metadata, constant
        tables and lazy weights).
        """
        from ..pt2.spec import is_pt2

        self.load_policy(weights_only)
        if is_pt2(self.package.zip.records()):
            from ..pt2.read import Pt2Archive

            progs = Pt2Archive(self.package.zip.source, path=self.path).programs
            return next(iter(progs.values())) if len(progs) == 1 else dict(progs)
        return self.package

    def verify(self) -> list[Problem]:
        pkg = self.package
        problems: list[Problem] = list(pkg.zip.verify(crc=True))
        fmt = pkg.records.get(ARCHIVE_FORMAT_PATH)
        if fmt != ARCHIVE_FORMAT_VALUE:
            problems.append(
                Problem(
                    "archive-format",
                    f"archive_format is {fmt!r}, expected 'pt2' (torch's is_pt2_package would not accept it)",
                    ARCHIVE_FORMAT_PATH,
                    None,
                    "warning",
                )
            )
        if not pkg.zip.prefix:
            problems.append(Problem("prefix", "records are not inside an archive folder (torch's reader requires one)", None))
        used_weights: set[str] = set()
        for m in pkg.models.values():
            problems += _verify_model(pkg, m, used_weights)
        for f in pkg.other_files:
            if f.kind == "weight" and used_weights and f.name[len(WEIGHTS_DIR) :] not in used_weights:
                problems.append(
                    Problem("unused-weight", f"{f.name} is not named by any weights_config.json", f.name, None, "warning")
                )
        problems += super().verify()
        return problems

    def close(self) -> None:
        self.package.zip.close()


def _verify_model(pkg: _read.AotiPackage, m: _read.AotiModel, used_weights: set[str]) -> list[Problem]:
    out: list[Problem] = []
    where = f"{AOTINDUCTOR_DIR}{m.name}/"

    def err(code: str, msg: str, member: str | None = None, severity: str = "error") -> None:
        out.append(Problem(code, msg, member or where, None, severity))

    if not m.metadata_files:
        err("metadata", "model folder has no *_metadata.json", severity="warning")
    for name, meta in m.metadata_files.items():
        if not isinstance(meta, dict) or "<error>" in meta:
            err(
                "metadata",
                f"metadata is not a JSON object: {meta.get('<error>') if isinstance(meta, dict) else type(meta).__name__}",
                name,
            )
            continue
        if not all(isinstance(v, str) for v in meta.values()):
            err("metadata", "metadata values must all be strings (aoti_compile_and_package refuses others)", name)
        missing = [k for k in METADATA_KEYS[:1] if k not in meta]
        if missing:
            err("metadata", f"metadata lacks {', '.join(missing)}", name, "warning")
    metas = [v for v in m.metadata_files.values() if isinstance(v, dict) and "<error>" not in v]
    if len(metas) > 1 and any(v != metas[0] for v in metas[1:]):
        err("metadata", "the kernel metadata differs from the wrapper metadata (torch writes copies)", severity="warning")
    if m.wrapper is None and not m.file("shared_object"):
        err("missing-wrapper", "model folder has neither a wrapper .cpp nor a shared object")
    elif not m.file("shared_object") and not m.file("cmake"):
        err("missing-so", "model folder has no shared object and no CMakeLists.txt to build one", severity="warning")
    have = {f.name.rsplit("/", 1)[-1] for f in m.files}
    for cm in m.file("cmake"):
        text = pkg.zip.read_bytes(cm.name, max_size=16 << 20).decode("utf-8", "replace")
        for ref in sorted(set(_CMAKE_REF.findall(text))):
            if ref not in have:
                err("missing-file", f"CMakeLists.txt builds from {ref}, which is not in the package", cm.name)
    for name, info in m.elf.items():
        if isinstance(info, str):
            err("elf", info, name)
            continue
        for p in info.problems:
            err("elf", p, name)
        if info.type == "shared object" and not info.exports:
            err("elf", "shared object exports no AOTInductor* entry points", name, "warning")
    if m.num_constants is not None and m.constants and m.num_constants != len(m.constants):
        err(
            "constants",
            f"wrapper constructor declares {m.num_constants} constants, the table has {len(m.constants)} rows",
            m.wrapper,
        )
    for c in m.constants:
        dt = DTYPES.get(c.dtype)
        if dt is None:
            err("constants", f"constant {c.fqn!r} has an unknown dtype {c.dtype!r}", m.wrapper, "warning")
            continue
        if c.layout == "strided" and len(c.shape) != len(c.stride):
            err("constants", f"constant {c.fqn!r}: shape {list(c.shape)} and stride {list(c.stride)} differ in length", m.wrapper)
        elif c.layout == "strided" and _read.view_nbytes(c, dt.itemsize) > c.data_size:
            err(
                "constants",
                f"constant {c.fqn!r}: shape/stride/offset need {_read.view_nbytes(c, dt.itemsize)} bytes, data_size is "
                f"{c.data_size}",
                m.wrapper,
            )
    need = _read.blob_size(m.constants)
    if m.weights_layout in ("binary_blob", "embedded", "mmap") and m.blob is not None:
        rec, _off, size = m.blob
        if size < need:
            err("weights-size", f"constants blob has {size} bytes, the constant table needs {need}", rec)
        elif size > need and m.constants and size - need >= 64:
            err(
                "weights-size",
                f"constants blob has {size} bytes, {size - need} more than the constant table uses",
                rec,
                "warning",
            )
    if m.weights_layout == "binary_blob" and m.blob is not None:
        so = _wrapper_so(m)
        if so is not None and so[1].blob is not None and so[1].blob[1] == 8:
            so_src = pkg.record_source(pkg.zip.get(so[0]))
            (declared,) = struct.unpack("<q", so_src.read_at(so[1].blob[0], 8, what="external weights record"))
            if declared != m.blob[2]:
                err("weights-size", f"{so[0]} expects a {declared}-byte weights blob, {m.blob[0]} has {m.blob[2]}", m.blob[0])
    if m.weights_config is not None:
        by_fqn = {c.fqn: c for c in m.constants}
        cfg_name = m.file("weights_config")[0].name
        for fqn, spec in m.weights_config.items():
            fname = spec[0]
            used_weights.add(fname)
            rec = WEIGHTS_DIR + fname
            if pkg.zip.lookup(rec) is None:
                err("missing-weight", f"weights_config entry {fqn!r} names {rec}, which is not in the package", cfg_name)
                continue
            t = m.tensors.get(fqn)
            if t is None:
                why = m.weight_errors.get(fqn, "it holds no plain tensor")
                err("weight", f"weight {fqn!r} could not be read from {rec}: {why}", rec)
                continue
            const = by_fqn.get(fqn)
            if const is not None:
                if tuple(spec[1]) != const.shape or tuple(spec[2]) != const.stride or spec[3] != const.offset:
                    err(
                        "weight",
                        f"weights_config for {fqn!r} (shape {spec[1]}, stride {spec[2]}, "
                        f"offset {spec[3]}) differs from the wrapper's constant table (shape "
                        f"{list(const.shape)}, stride {list(const.stride)}, offset {const.offset})",
                        cfg_name,
                    )
                if DTYPES.get(const.dtype) is not None and t.dtype is not DTYPES[const.dtype]:
                    err("weight", f"{rec} holds {t.dtype.name}, the constant table says {const.dtype} for {fqn!r}", rec)
                if t.storage is not None:
                    # data_size is the storage size rounded up to 64 bytes on CPU
                    n = t.storage.nbytes
                    padded = n if const.device_type == "cuda" else (n + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES
                    if padded != const.data_size:
                        err(
                            "weight",
                            f"{rec} stores {n} bytes, the constant table says {const.data_size} (64-byte aligned) for {fqn!r}",
                            rec,
                        )
        missing = [c.fqn for c in m.constants if not c.from_folded and c.fqn not in m.weights_config]
        if missing:
            err("missing-weight", f"constants without a weights_config entry: {', '.join(missing[:5])}", cfg_name)
    elif m.constants and not m.tensors and m.weights_layout not in ("external", "cpp_only"):
        err("weights", f"constants could not be located ({'; '.join(m.notes) or m.weights_layout})", severity="warning")
    for note in m.notes:
        if "not extracted" in note or "does not match" in note:
            err("weights", note, severity="warning")
    return out


def _wrapper_so(m: _read.AotiModel) -> tuple[str, _elf.ElfInfo] | None:
    for name, info in m.elf.items():
        if isinstance(info, _elf.ElfInfo) and info.type == "shared object":
            return name, info
    return None


@register
class AotiHandler(FormatHandler):
    """AOTInductor packages: PT2 zips with ``data/aotinductor/<model>/`` compiler output."""

    name = "aoti"
    # ".pt2" belongs to the pt2 handler (writers are chosen by extension); this one is
    # found by sniffing the records
    extensions = ()
    priority = 15
    description = "AOTInductor package (aoti_compile_and_package): sources, .so, metadata, weights"
    capabilities = Capabilities(checksum=ZIP_CRC)

    def sniff(self, probe: Probe) -> bool:
        if probe.is_dir or not is_zip(probe.head):
            return False
        return is_aoti_records(probe.zip_records())

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> AotiArtifact:
        return AotiArtifact(path, policy, probe=probe)


def is_aoti_package(path: Any) -> bool:
    """True when ``path`` is a zip holding AOTInductor output (never raises on bad input)."""
    try:
        return AotiHandler().sniff(Probe.of(path))
    except (TorchlessError, OSError):
        return False


__all__ += ["is_aoti_package"]
