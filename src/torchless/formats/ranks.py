"""What the readers of multi-file checkpoints share: a rank file loaded once, and the
problems of its member artifacts and consolidated tensors for ``verify``.

DeepSpeed, FSDP, Megatron, Trainer folders and Hugging Face sets are folders of
``torch.save`` (or safetensors) files; each reader keeps the artifacts it opened and
reports their problems under the file's name.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ..core.errors import FormatError, TorchlessError
from ..core.findings import Problem
from ..io.paths import confined_file

__all__ = ["load_rank_dict", "member_problems", "tensor_problems"]


def load_rank_dict(
    folder: str, name: str, policy: Any, arts: dict[str, Any], objs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The dict the rank file ``name`` of ``folder`` holds (the name confined to the
    folder), its artifact kept in ``arts`` for verify and close; with ``objs``, loaded once
    (the dict kept there)."""
    obj = None if objs is None else objs.get(name)
    if obj is None:
        from .pt.handler import PtArtifact

        path = os.path.join(folder, name)
        real = confined_file(folder, name, what="rank file", path=path)
        art = PtArtifact(real, policy)
        arts[name] = art
        obj = art.load()
        if not isinstance(obj, dict):
            raise FormatError("a rank file does not hold a dict", path=path, found=type(obj).__name__)
        if objs is not None:
            objs[name] = obj
    return obj


def member_problems(named: Iterable[tuple[str, Any]]) -> list[Problem]:
    """Every problem of each member artifact (``verify()``), its message prefixed with the
    member's name; a member not opened (None) has none to report."""
    out: list[Problem] = []
    for name, art in named:
        if art is not None:
            out += [Problem(p.code, f"{name}: {p.message}", p.member, p.offset, p.severity) for p in art.verify()]
    return out


def tensor_problems(named: Iterable[tuple[str, Any]]) -> list[Problem]:
    """Each consolidated tensor gathered once: one ``tensor`` problem per tensor whose
    bytes cannot be read."""
    out: list[Problem] = []
    for name, t in named:
        try:
            t.numpy()
        except TorchlessError as e:
            out.append(Problem("tensor", str(e), name))
    return out
