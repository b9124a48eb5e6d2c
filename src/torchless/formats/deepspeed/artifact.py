"""The ``deepspeed`` format's artifact: a ZeRO checkpoint root or tag folder, consolidated."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from ...core.findings import Problem
from ..base import Artifact, LoadPolicy, summarize_tensors
from ..ranks import member_problems, tensor_problems
from .layers import ModuleCheckpoint, has_module_files
from .read import ZeroCheckpoint, find_tag_folder

__all__ = ["DeepSpeedArtifact"]


class DeepSpeedArtifact(Artifact):
    """An opened DeepSpeed ZeRO checkpoint: its tensors are the consolidated fp32 state
    dict ``zero_to_fp32`` gives (lazy: each gathered from the rank files when read)."""

    format = "deepspeed"

    def __init__(self, path: Any, policy: LoadPolicy | None = None) -> None:
        super().__init__(path, policy)
        folder = find_tag_folder(self.path) if os.path.isdir(self.path) else self.path
        names = os.listdir(folder) if os.path.isdir(folder) else []
        self.checkpoint: ZeroCheckpoint | ModuleCheckpoint
        if has_module_files(names):
            self.checkpoint = ModuleCheckpoint(path, self.policy)
        else:
            self.checkpoint = ZeroCheckpoint(path, self.policy)

    def tensors(self) -> Iterator[tuple[str, Any]]:
        return self.checkpoint.tensors()

    def info(self) -> dict[str, Any]:
        ck = self.checkpoint
        sd = ck.state_dict()
        if isinstance(ck, ModuleCheckpoint):
            return self._module_info(ck, sd)
        out: dict[str, Any] = {
            "format": self.format,
            "path": self.path,
            "framework": "DeepSpeed",
            "ds_version": ck.ds_version,
            "zero_stage": ck.stage,
            "world_size": ck.world_size,
            "tag_folder": ck.folder,
            "master_dtypes": ck.dtypes,
            "files": len(ck.model_files) + len(ck.optim_files),
            "model_files": ck.model_files,
            "optim_files": ck.optim_files,
            "inside": {**ck.inside, "fp32_master_weights": True},
            "contents": ck.contents,
        }
        out.update(summarize_tensors(sd.items()))
        names: dict[int, list[str]] = {}
        for k, v in sd.items():
            names.setdefault(id(v), []).append(k)
        out["tied"] = sorted(k for group in names.values() if len(group) > 1 for k in group)
        # each parameter once (a tied name is the same tensor), frozen ones included
        out["parameters"] = sum(t.numel() for t in {id(t): t for t in sd.values() if t.is_parameter}.values())
        return out

    def _module_info(self, ck: ModuleCheckpoint, sd: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": self.format,
            "path": self.path,
            "framework": "DeepSpeed",
            "ds_version": ck.ds_version,
            "tag_folder": ck.folder,
            **ck.info(),
        }
        out.update(summarize_tensors(sd.items()))
        out["parameters"] = sum(t.numel() for t in sd.values() if t.is_parameter)
        return out

    def verify(self) -> list[Problem]:
        """Every consolidated tensor gathered once, and every rank file's records checked."""
        ck = self.checkpoint
        return member_problems(list(ck._arts.items())) + tensor_problems(ck.tensors())

    def convert_to(
        self,
        dst: Any,
        *,
        format: str,
        progress: Any = None,
        strict: bool = False,
        options: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Stream the consolidated tensors into ``dst`` (Hugging Face sharding with
        ``max_shard_size``; tied names by the rule of :mod:`..shared`)."""
        from ..hf.write import convert_tensors

        return convert_tensors(
            list(self.tensors()), dst, format=format, progress=progress, strict=strict, source=self.path, options=options
        )

    def close(self) -> None:
        self.checkpoint.close()
