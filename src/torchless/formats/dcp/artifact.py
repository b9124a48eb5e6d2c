"""The ``dcp`` format's artifact: an opened checkpoint directory (``torchless.open``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ...core.errors import NotFoundError, TorchlessError
from ...core.findings import Problem
from ..base import Artifact, LoadPolicy, summarize_tensors
from .consolidate import consolidate
from .read import unflatten
from .readers import open_reader
from .spec import Metadata, TensorStorageMetadata, numel

__all__ = ["DCPArtifact"]


class DCPArtifact(Artifact):
    """An opened DCP checkpoint directory (lazy: tensors are assembled on ``numpy()``)."""

    format = "dcp"

    def __init__(self, path: Any, policy: LoadPolicy | None = None, *, store: Any = None) -> None:
        super().__init__(path, policy, store=store)
        self.reader = open_reader(path, store)
        self.store = self.reader.store

    @property
    def metadata(self) -> Metadata:
        return self.reader.metadata

    def tensors(self) -> Iterator[tuple[str, Any]]:
        for fqn in self.reader.tensor_names():
            yield fqn, self.reader.tensor(fqn)

    def values(self, *, weights_only: bool | None = None) -> dict[str, Any]:
        """The non-tensor items, unpickled."""
        wo = self.load_policy(weights_only)
        return {k: self.reader.value(k, weights_only=wo) for k in self.reader.bytes_names()}

    def load(self, *, weights_only: bool | None = None, keys: Any = None) -> Any:
        """The nested state dict (tensors lazy, non-tensor values unpickled under the
        policy given at open)."""
        weights_only = self.load_policy(weights_only)
        flat: dict[str, Any] = {}
        want = None if keys is None else set(keys)
        missing = sorted(want - set(self.reader.entries)) if want is not None else []
        if missing:
            raise NotFoundError(
                f"no such keys: {', '.join(missing[:5])}",
                path=self.path,
                hint="keys are the flattened names `torchless ls` shows",
            )
        for fqn, it in self.reader.entries.items():
            if want is not None and fqn not in want:
                continue
            flat[fqn] = (
                self.reader.tensor(fqn)
                if isinstance(it, TensorStorageMetadata)
                else self.reader.value(fqn, weights_only=weights_only)
            )
        return unflatten(flat, self.reader.metadata.planner_data)

    def layout(self) -> dict[str, Any]:
        return self.reader.layout()

    def info(self) -> dict[str, Any]:
        r = self.reader
        out: dict[str, Any] = {"format": self.format, "path": self.path, "version": r.metadata.version}
        out.update(summarize_tensors(self.tensors()))
        out["storage_bytes"] = out["tensor_bytes"]
        out["bytes_items"] = r.bytes_names()
        out["files"] = len(r.files())
        out["ranks"] = len({f.split("_")[2] for f in r.files() if f.startswith("__") and f.count("_") >= 3}) or None
        out["chunks"] = sum(len(r.chunks(f)) for f in r.tensor_names())
        return out

    def verify(self) -> list[Problem]:
        """Every chunk located and checked against the metadata, every bytes item read, and
        every item's embedded archive checked as a zip file is (the CRC-32 of each record)."""
        problems: list[Problem] = []
        r = self.reader
        seen: set[tuple[str, int, int]] = set()

        def archive(info: Any, fqn: str, chunk: Any = None) -> None:
            key = (info.relative_path, info.offset, info.length)
            if key not in seen:
                seen.add(key)
                problems.extend(r.item_problems(info, fqn, chunk))

        for fqn in r.tensor_names():
            tmd = r.entries[fqn]
            total = 0
            try:
                for ref in r.chunks(fqn):
                    r.locate(ref)
                    total += numel(ref.chunk.sizes)
                    archive(ref.info, fqn, ref.chunk.offsets)
            except TorchlessError as e:
                problems.append(Problem("chunk", str(e), fqn, e.offset))
                continue
            if total != numel(tmd.size):
                problems.append(Problem("coverage", f"chunks hold {total} elements, the tensor has {numel(tmd.size)}", fqn))
        for fqn in r.bytes_names():
            try:
                r.value(fqn, weights_only=False)
                archive(r.bytes_info(fqn), fqn)
            except TorchlessError as e:
                problems.append(Problem("bytes", str(e), fqn, e.offset))
        return problems

    def convert_to(
        self,
        dst: Any,
        *,
        format: str,
        progress: Any = None,
        strict: bool = False,
        options: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Consolidate into one file (``torchless convert`` on a DCP directory)."""
        return consolidate(self.reader, dst, format=format, progress=progress, strict=strict, options=options)

    def close(self) -> None:
        self.reader.close()
