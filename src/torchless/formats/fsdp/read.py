"""Reading a folder of FSDP2 per-rank state dicts as the full state dict, lazily.

What comes out is what ``torch.distributed.checkpoint.state_dict.get_model_state_dict(
model, options=StateDictOptions(full_state_dict=True))`` gives: rank 0's names in its
order; each DTensor gathered from the ranks' shards (``Shard(d)``: concatenated along
``d`` in mesh order; ``Replicate``: one copy); plain tensors (buffers) as rank 0 holds
them. The rank of a file is its DTensors' mesh coordinate (read from the value, never
from the name). A tensor is gathered when read: memory is bounded by the largest one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from ...core.errors import FormatError, LimitError, NotFoundError, UnsupportedError, short_repr
from ...core.findings import Problem
from ...core.tensor import Tensor
from ...core.values import PickledObject
from ..base import Artifact, LoadPolicy, summarize_tensors
from ..dcp.read import BlockStorage
from ..ranks import load_rank_dict, member_problems, tensor_problems
from . import spec as S

__all__ = ["FsdpArtifact", "rank_file_names"]

MAX_RANKS = 65_536


def rank_file_names(folder: str, least: int = 2) -> list[str] | None:
    """The folder's per-rank files in rank-number order when its ``.pt`` files are
    ``<stem>0..<stem>N-1`` (N >= ``least``: detection asks for 2) and nothing else; None
    otherwise."""
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    found: dict[int, str] = {}
    stems = set()
    for n in names:
        if not n.endswith((".pt", ".pth", ".bin")):
            continue
        m = S.RANK_FILE.match(n)
        if m is None:
            return None
        stems.add((m.group(1), m.group(3)))
        found[int(m.group(2))] = n
    if len(stems) != 1 or len(found) < least or sorted(found) != list(range(len(found))):
        return None
    return [found[i] for i in range(len(found))]


def _attrs(v: Any) -> dict[str, Any]:
    return v.attrs if isinstance(v, PickledObject) else {}


def _ints(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, (tuple, list)) and all(type(x) is int for x in v):
        return tuple(v)
    return None


class _Shard:
    """One DTensor entry of one rank file."""

    def __init__(self, t: Tensor, where: str, key: str) -> None:
        a = t.attrs if isinstance(t.attrs, dict) else {}
        local, spec = a.get("_local_tensor"), _attrs(a.get("_spec"))
        mesh = _attrs(spec.get("mesh"))
        coord = _ints(mesh.get("_coordinate_on_dim"))
        rank_map = mesh.get("_rank_map")
        placements = spec.get("placements")
        if not isinstance(local, Tensor) or coord is None or not isinstance(placements, tuple):
            raise FormatError("a DTensor without its local shard or mesh", path=where, member=key, found=short_repr(a, 120))
        if len(coord) != 1 or len(placements) != 1:
            raise UnsupportedError(
                "DTensors over a multi-dimensional device mesh (HSDP, FSDP with tensor parallelism) are not consolidated",
                path=where,
                member=key,
                found=f"mesh coordinate {coord}",
            )
        self.local = local
        self.rank = coord[0]
        self.world = rank_map.numel() if isinstance(rank_map, Tensor) else None
        p = placements[0]
        name = p.class_name if isinstance(p, PickledObject) else ""
        if name == S.SHARD and type(_attrs(p).get("dim")) is int:
            self.dim: int | None = _attrs(p)["dim"]
        elif name == S.REPLICATE:
            self.dim = None
        else:
            raise UnsupportedError(
                "a DTensor placement other than Shard or Replicate", path=where, member=key, found=short_repr(p, 80)
            )


def _gather(locals_: list[Tensor], dim: int) -> np.ndarray:
    parts = [np.ascontiguousarray(t.numpy()) for t in locals_]
    return np.ascontiguousarray(np.concatenate(parts, axis=dim)).reshape(-1).view(np.uint8)


def _contiguous(t: Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.numpy()).reshape(-1).view(np.uint8)


class FsdpCheckpoint:
    """A folder of per-rank FSDP2 ``torch.save`` state dicts, consolidated."""

    def __init__(self, path: Any, policy: LoadPolicy | None = None) -> None:
        self.folder = os.fspath(path)
        if not os.path.isdir(self.folder):
            raise NotFoundError("no such folder", path=self.folder)
        pol = policy or LoadPolicy()
        self.policy = replace(pol, allowed_globals=pol.allowed_globals | S.FSDP_GLOBALS)
        files = rank_file_names(self.folder, least=1)
        if files is None:
            raise FormatError(
                "not a folder of FSDP per-rank state dicts",
                path=self.folder,
                expected="<stem>0.pt ... <stem>N-1.pt and no other .pt files",
            )
        if len(files) > MAX_RANKS:
            raise LimitError("too many rank files", path=self.folder, expected=f"<= {MAX_RANKS}")
        self.files = files
        self._arts: dict[str, Any] = {}
        try:
            self._tensors = self._consolidate()
        except BaseException:
            self.close()
            raise

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def _load(self, name: str) -> dict[str, Any]:
        return load_rank_dict(self.folder, name, self.policy, self._arts)

    def _consolidate(self) -> dict[str, Tensor]:
        sds = [self._load(n) for n in self.files]
        shards: list[dict[str, _Shard]] = []
        ranks: dict[int, str] = {}
        for name, sd in zip(self.files, sds, strict=True):
            where = self._path(name)
            mine = {
                str(k): _Shard(v, where, str(k))
                for k, v in sd.items()
                if isinstance(v, Tensor) and getattr(v, "subclass", None) == S.DTENSOR
            }
            if not mine:
                raise FormatError("a rank file holds no DTensor (not an FSDP2 state dict)", path=where)
            rs = {s.rank for s in mine.values()}
            ws = {s.world for s in mine.values() if s.world is not None}
            if len(rs) != 1 or len(ws) > 1:
                raise FormatError(
                    "a rank file's DTensors disagree on its mesh (rank or size)",
                    path=where,
                    found=f"ranks {sorted(rs)}, sizes {sorted(ws)}",
                )
            r = rs.pop()
            w = ws.pop() if ws else len(self.files)
            if w != len(self.files):
                raise FormatError(
                    f"the file was written by a mesh of {w} ranks but {len(self.files)} rank files are there "
                    "(a rank missing, or files of another run)",
                    path=where,
                    expected=len(self.files),
                    found=w,
                )
            if r in ranks:
                raise FormatError(f"two files of mesh rank {r}", path=where, found=ranks[r])
            ranks[r] = name
            shards.append(mine)
        world = len(self.files)
        order = [ranks[r] for r in sorted(ranks)]  # mesh order (0..world-1, checked above by count)
        if sorted(ranks) != list(range(world)):
            raise FormatError("the mesh ranks of the files are not 0..N-1", path=self.folder, found=sorted(ranks))
        by_name = dict(zip(self.files, shards, strict=True))
        self.world_size = world
        out: dict[str, Tensor] = {}
        sd0 = sds[self.files.index(order[0])]
        for k, v in sd0.items():
            key = str(k)
            if not isinstance(v, Tensor):
                continue
            if getattr(v, "subclass", None) != S.DTENSOR:
                st = BlockStorage(
                    key, v.nbytes, v.dtype, "cpu", loader=partial(_contiguous, v), origin=f"{self._path(order[0])}:{key}"
                )
                out[key] = Tensor(st, v.dtype, v.shape)
                continue
            pieces = []
            for name in order:
                s = by_name[name].get(key)
                if s is None:
                    raise FormatError("a rank file lacks a tensor rank 0 holds", path=self._path(name), member=key)
                pieces.append((name, s))
            shape = tuple(v.shape)
            dim = pieces[0][1].dim
            for r, (name, s) in enumerate(pieces):
                if s.dim != dim:
                    raise FormatError("rank files place a tensor differently", path=self._path(name), member=key)
                want = list(shape)
                if dim is not None:
                    if not 0 <= dim < len(shape):
                        raise FormatError("a Shard dimension outside the tensor", path=self._path(name), member=key, found=dim)
                    a, b = S.chunk_range(shape[dim], world, r)
                    want[dim] = b - a
                if tuple(s.local.shape) != tuple(want) or s.local.dtype != v.dtype:
                    raise FormatError(
                        f"a rank's shard does not have the shape its place in {shape} gives",
                        path=self._path(name),
                        member=key,
                        expected=f"{tuple(want)} {v.dtype.name}",
                        found=f"{tuple(s.local.shape)} {s.local.dtype.name}",
                    )
            n = math.prod(shape)
            if dim is None:
                src = pieces[0][1].local
                st = BlockStorage(
                    key, n * v.dtype.itemsize, v.dtype, "cpu", loader=partial(_contiguous, src), origin=f"{self.folder}:{key}"
                )
            else:
                locs = [s.local for _, s in pieces]
                st = BlockStorage(
                    key, n * v.dtype.itemsize, v.dtype, "cpu", loader=partial(_gather, locs, dim), origin=f"{self.folder}:{key}"
                )
            out[key] = Tensor(st, v.dtype, shape, is_parameter=True)
        return out

    def tensors(self) -> Iterator[tuple[str, Tensor]]:
        return iter(self._tensors.items())

    def close(self) -> None:
        for art in self._arts.values():
            art.close()
        self._arts.clear()


class FsdpArtifact(Artifact):
    """An opened folder of FSDP2 per-rank state dicts: its tensors are the full state dict."""

    format = "fsdp"

    def __init__(self, path: Any, policy: LoadPolicy | None = None) -> None:
        super().__init__(path, policy)
        self.checkpoint = FsdpCheckpoint(path, self.policy)

    def tensors(self) -> Iterator[tuple[str, Any]]:
        return self.checkpoint.tensors()

    def info(self) -> dict[str, Any]:
        ck = self.checkpoint
        sd = dict(ck.tensors())
        out: dict[str, Any] = {
            "format": self.format,
            "path": self.path,
            "framework": "FSDP2 (fully_shard)",
            "layout": "per-rank torch.save of DTensor state dicts",
            "world_size": ck.world_size,
            "rank_files": ck.files,
        }
        out.update(summarize_tensors(sd.items()))
        out["parameters"] = sum(t.numel() for t in sd.values() if t.is_parameter)
        return out

    def verify(self) -> list[Problem]:
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
        from ..hf.write import convert_tensors

        return convert_tensors(
            list(self.tensors()), dst, format=format, progress=progress, strict=strict, source=self.path, options=options
        )

    def close(self) -> None:
        self.checkpoint.close()
