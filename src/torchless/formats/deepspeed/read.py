"""Reading a DeepSpeed ZeRO checkpoint as one consolidated state dict, lazily.

What comes out is what DeepSpeed's ``zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint``
returns, in its order: the buffers of rank 0's model states (floating-point ones as
float32), the frozen parameters (stages 2 and 3), the trainable parameters rebuilt from
the fp32 master partitions in the optimizer states, then the tied names of
``shared_params`` as the same tensor as the one they name.

Nothing is concatenated whole: each parameter is a tensor whose bytes are gathered, when
read, from slices of the rank files' memory-mapped flat partitions into one buffer of the
parameter's size, so memory is bounded by the largest parameter. The rank files are read
by torchless's lazy ``.pt`` reader; the DeepSpeed classes they pickle
(:data:`~.spec.DS_GLOBALS`) become inert placeholders, never imported.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from ...core.dtypes import by_name
from ...core.errors import FormatError, LimitError, NotFoundError, TorchlessError, UnsupportedError, short_repr
from ...core.tensor import Tensor
from ...core.values import PickledObject
from ...io.paths import confined_file
from ..base import LoadPolicy
from ..dcp.read import BlockStorage
from ..ranks import load_rank_dict
from . import spec as S

__all__ = ["ZeroCheckpoint", "find_tag_folder", "is_zero_folder"]

#: the largest ``latest`` file read (it holds a tag name)
MAX_LATEST_BYTES = 4096
MAX_RANKS = 65_536


def _is_tag_folder(folder: str) -> bool:
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    if not any(n.endswith(S.MODEL_SUFFIX) for n in names):
        return False
    return any(n.endswith(S.OPTIM_SUFFIX) or S.LAYER_FILE.match(n) or S.EXPERT_FILE.match(n) for n in names)


def _read_tag(root: str) -> str:
    where = os.path.join(root, S.LATEST)
    real = confined_file(root, S.LATEST, what="latest file", path=where)
    if os.path.getsize(real) > MAX_LATEST_BYTES:
        raise LimitError("the latest file is too large", path=where, expected=f"<= {MAX_LATEST_BYTES} bytes")
    with open(real, "rb") as f:
        raw = f.read()
    try:
        tag = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise FormatError("the latest file is not UTF-8 text", path=where, found=short_repr(raw, 40)) from None
    if not tag:
        raise FormatError("the latest file is empty", path=where, expected="a tag folder's name")
    return tag


def find_tag_folder(path: str) -> str:
    """The tag folder of ``path``: ``path`` itself when it holds rank files, else the
    folder its ``latest`` file names (confined to ``path``)."""
    if _is_tag_folder(path):
        return path
    if not os.path.isfile(os.path.join(path, S.LATEST)):
        raise FormatError(
            "not a DeepSpeed checkpoint folder",
            path=path,
            expected=f"a '{S.LATEST}' file naming a tag folder, or *{S.MODEL_SUFFIX} and *{S.OPTIM_SUFFIX} files",
        )
    tag = _read_tag(path)
    folder = os.path.join(path, tag)
    inside = os.path.realpath(folder).startswith(os.path.realpath(path) + os.sep)
    if "/" in tag or tag in (".", "..") or "\x00" in tag or not inside or not os.path.isdir(folder):
        raise NotFoundError(
            "the tag folder the latest file names is not there", path=os.path.join(path, S.LATEST), found=short_repr(tag, 80)
        )
    return folder


def is_zero_folder(path: str) -> bool:
    """True for a checkpoint root whose ``latest`` names a tag folder of rank files, or a
    tag folder itself (what detection asks: no pickle is read)."""
    if _is_tag_folder(path):
        return True
    latest = os.path.join(path, S.LATEST)
    if not os.path.isfile(latest):
        return False
    try:
        tag = _read_tag(path)
    except (TorchlessError, OSError):
        return False
    return "/" not in tag and tag not in (".", "..") and _is_tag_folder(os.path.join(path, tag))


def _stage_of(v: Any, path: str) -> int:
    # ZeroStageEnum(n) pickles as a call of the class on its value: an inert placeholder
    if isinstance(v, PickledObject) and v.class_name.endswith("ZeroStageEnum") and len(v.args) == 1:
        v = v.args[0]
    if type(v) is not int or v not in (1, 2, 3):
        raise FormatError("unknown ZeRO stage", path=path, member=S.ZERO_STAGE, expected="1, 2 or 3", found=short_repr(v, 60))
    return v


def _numel(shape: Any, path: str, name: str) -> int:
    if not isinstance(shape, (tuple, list)) or not all(type(d) is int and d >= 0 for d in shape):
        raise FormatError("a parameter shape is not a list of sizes", path=path, member=name, found=short_repr(shape, 60))
    return math.prod(shape)


def _flat(t: Any, path: str, member: str) -> Tensor:
    if not isinstance(t, Tensor) or t.ndim != 1:
        raise FormatError("a flat partition is not a 1-D tensor", path=path, member=member, found=short_repr(t, 60))
    return t


class _Segments:
    """One rank's flat partitions (a list of 1-D tensors) read as one flat range."""

    def __init__(self, parts: list[Tensor]) -> None:
        self.parts = parts
        self.starts = [0]
        for p in parts:
            self.starts.append(self.starts[-1] + p.numel())

    @property
    def numel(self) -> int:
        return self.starts[-1]

    def copy_into(self, out: np.ndarray, start: int, count: int) -> None:
        """Elements ``[start, start + count)`` into ``out`` (views of the mapped file)."""
        done = 0
        for i, p in enumerate(self.parts):
            lo, hi = self.starts[i], self.starts[i + 1]
            a, b = max(start, lo), min(start + count, hi)
            if a < b:
                out[done : done + b - a] = p.numpy()[a - lo : b - lo]
                done += b - a
        if done != count:  # callers checked the ranges
            raise FormatError("a parameter runs past the flat partitions", expected=count, found=done)


def _gather(pieces: list[tuple[_Segments, int, int]], numel: int, dtype: Any) -> np.ndarray:
    """The first ``numel`` elements of the pieces ``(segments, start, count)`` laid end to end."""
    out = np.empty(numel, dtype=dtype.numpy)
    pos = 0
    for seg, start, count in pieces:
        take = min(count, numel - pos)
        if take <= 0:
            break
        seg.copy_into(out[pos : pos + take], start, take)
        pos += take
    return out.view(np.uint8)


def _cast_float32(t: Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.numpy()).astype(np.float32).reshape(-1).view(np.uint8)


def _contiguous(t: Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.numpy()).reshape(-1).view(np.uint8)


class ZeroCheckpoint:
    """A ZeRO checkpoint's tag folder, its rank files opened lazily, consolidated.

    Attributes:
        root: the path given (checkpoint root or tag folder).
        folder: the tag folder.
        stage: the ZeRO stage (1, 2 or 3).
        world_size: the data-parallel world size.
        model_files, optim_files: the rank files' names, in zero_to_fp32's order.
        ds_version: the DeepSpeed version that wrote the checkpoint, or None.
    """

    def __init__(self, path: Any, policy: LoadPolicy | None = None) -> None:
        self.root = os.fspath(path)
        if not os.path.isdir(self.root):
            raise NotFoundError("no such checkpoint folder", path=self.root)
        pol = policy or LoadPolicy()
        self.policy = replace(pol, allowed_globals=pol.allowed_globals | S.DS_GLOBALS)
        self.folder = find_tag_folder(self.root)
        self.model_files = S.rank_files(self.folder, S.MODEL_SUFFIX)
        self.optim_files = S.rank_files(self.folder, S.OPTIM_SUFFIX)
        if not self.model_files or not self.optim_files:
            raise FormatError(
                "a ZeRO tag folder needs model and optimizer state files",
                path=self.folder,
                expected=f"*{S.MODEL_SUFFIX} and *{S.OPTIM_SUFFIX}",
                found=f"{len(self.model_files)} and {len(self.optim_files)}",
            )
        if len(self.optim_files) > MAX_RANKS or len(self.model_files) > MAX_RANKS:
            raise LimitError("too many rank files", path=self.folder, expected=f"<= {MAX_RANKS}")
        self._arts: dict[str, Any] = {}
        self._objs: dict[str, Any] = {}
        self._tensors: dict[str, Any] | None = None
        self.contents: dict[str, list[str]] = {}
        try:
            self._read_optim()
            self._read_models()
        except BaseException:
            self.close()
            raise

    # -- rank files ------------------------------------------------------------------
    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def _load(self, name: str) -> dict[str, Any]:
        return load_rank_dict(self.folder, name, self.policy, self._arts, self._objs)

    def _read_optim(self) -> None:
        stages: list[int] = []
        sizes: list[int] = []
        self.flat_groups: list[_Segments] = []
        self.rank_groups: list[list[Tensor]] = []
        for name in self.optim_files:
            where = self._path(name)
            osd = self._load(name).get(S.OPTIMIZER_STATE_DICT)
            if not isinstance(osd, dict) or S.ZERO_STAGE not in osd:
                raise FormatError(
                    "not a ZeRO optimizer state file", path=where, member=S.OPTIMIZER_STATE_DICT, expected=S.ZERO_STAGE
                )
            stage = _stage_of(osd[S.ZERO_STAGE], where)
            ws = osd.get(S.PARTITION_COUNT)
            if isinstance(ws, list) and ws and all(type(w) is int for w in ws):
                ws = max(ws)  # per group (expert groups may differ): zero_to_fp32 takes the largest
            if type(ws) is not int or ws < 1:
                raise FormatError("bad partition_count", path=where, member=S.PARTITION_COUNT, found=short_repr(ws, 60))
            stages.append(stage)
            sizes.append(ws)
            key = S.SINGLE_PARTITION_OF_FP32_GROUPS if stage <= 2 else S.FP32_FLAT_GROUPS
            groups = osd.get(key)
            if not isinstance(groups, list) or not groups:
                raise FormatError("no fp32 master partitions", path=where, member=f"{S.OPTIMIZER_STATE_DICT}.{key}")
            parts = [_flat(g, where, f"{key}[{i}]") for i, g in enumerate(groups)]
            self.rank_groups.append(parts)
            self.flat_groups.append(_Segments(parts))
            if name == self.optim_files[0]:
                self.alignment_paddings = osd.get(S.PARAM_ALIGNMENT_PADDINGS)
                self.contents[name] = sorted(str(k) for k in osd)
        first = self._path(self.optim_files[0])
        for name, st, ws in zip(self.optim_files, stages, sizes, strict=True):
            if st != stages[0]:
                raise FormatError("rank files of different ZeRO stages", path=self._path(name), expected=stages[0], found=st)
            if ws != sizes[0]:
                raise FormatError("rank files of different world sizes", path=self._path(name), expected=sizes[0], found=ws)
        self.stage, self.world_size = stages[0], sizes[0]
        if self.world_size != len(self.optim_files):
            raise FormatError(
                f"the checkpoint was written by {self.world_size} ranks but {len(self.optim_files)} "
                f"*{S.OPTIM_SUFFIX} files are there (a rank missing, or files of another run)",
                path=self.folder,
                expected=self.world_size,
                found=len(self.optim_files),
            )
        ngroups = {len(p) for p in self.rank_groups}
        if len(ngroups) != 1:
            raise FormatError("rank files with different numbers of parameter groups", path=first, found=sorted(ngroups))
        self.dtypes = sorted({p.dtype.name for parts in self.rank_groups for p in parts})

    def _read_models(self) -> None:
        self.models: list[dict[str, Any]] = []
        for name in self.model_files:
            where = self._path(name)
            sd = self._load(name)
            for k in S.AUTOEP_LAYERS_KEYS:
                layers = sd.get(k)
                if isinstance(layers, list) and any(
                    isinstance(e, dict) and e.get(S.AUTOEP_FORMAT_KEY) == S.AUTOEP_PARTITIONED for e in layers
                ):
                    raise UnsupportedError(
                        "AutoEP ZeRO-3 partition-native experts cannot be consolidated over the data-parallel group",
                        path=where,
                        hint="DeepSpeed's ds_to_universal.py converts them",
                    )
            if S.BUFFER_NAMES not in sd or S.PARAM_SHAPES not in sd:
                raise FormatError("not a ZeRO model state file", path=where, expected=f"{S.BUFFER_NAMES}, {S.PARAM_SHAPES}")
            self.models.append(sd)
        m0 = self.models[0]
        self.contents[self.model_files[0]] = sorted(str(k) for k, v in m0.items() if v is not None)
        self.inside = _inside(m0, self._objs[self.optim_files[0]].get(S.OPTIMIZER_STATE_DICT))
        self.ds_version = m0.get(S.DS_VERSION)
        if self.stage == 3 and len(self.model_files) != self.world_size:
            raise FormatError(
                f"a ZeRO-3 checkpoint of {self.world_size} ranks needs one model state file per rank",
                path=self.folder,
                expected=self.world_size,
                found=len(self.model_files),
            )

    # -- consolidation ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Tensor]:
        """The consolidated state dict: ``{name: lazy Tensor}`` in zero_to_fp32's order."""
        if self._tensors is None:
            out: dict[str, Tensor] = {}
            self._buffers(out)
            if self.stage <= 2:
                self._zero2_frozen(out)
                self._zero2_trainable(out)
            else:
                self._zero3_frozen(out)
                self._zero3_trainable(out)
            shared = self.models[0].get(S.SHARED_PARAMS) or {}
            if not isinstance(shared, dict):
                raise FormatError("shared_params is not a dict", path=self._path(self.model_files[0]), member=S.SHARED_PARAMS)
            for alias, target in shared.items():
                if target in out:
                    out[alias] = out[target]
            self._tensors = out
        return self._tensors

    def _buffers(self, out: dict[str, Tensor]) -> None:
        sd = self.models[0]
        where = self._path(self.model_files[0])
        names = set(sd[S.BUFFER_NAMES] or ())
        module = sd.get("module")
        if not isinstance(module, dict):
            raise FormatError("no module state dict", path=where, member="module")
        f32 = by_name("float32")
        for k, v in module.items():
            if k not in names:
                continue
            if not isinstance(v, Tensor):
                raise FormatError("a buffer is not a tensor", path=where, member=f"module.{k}", found=short_repr(v, 60))
            if v.dtype.is_floating_point:
                st = BlockStorage(k, v.numel() * 4, f32, "cpu", loader=partial(_cast_float32, v), origin=f"{where}:module.{k}")
                out[k] = Tensor(st, f32, v.shape)
            else:
                st = BlockStorage(k, v.nbytes, v.dtype, "cpu", loader=partial(_contiguous, v), origin=f"{where}:module.{k}")
                out[k] = Tensor(st, v.dtype, v.shape)

    def _frozen_shapes(self) -> dict[str, Any]:
        shapes = self.models[0].get(S.FROZEN_PARAM_SHAPES)
        return shapes if isinstance(shapes, dict) else {}

    def _fragment(self, rank: int, name: str) -> Tensor:
        where = self._path(self.model_files[rank])
        frags = self.models[rank].get(S.FROZEN_PARAM_FRAGMENTS)
        t = frags.get(name) if isinstance(frags, dict) else None
        if not isinstance(t, Tensor):
            raise FormatError("a frozen parameter's fragment is missing", path=where, member=f"{S.FROZEN_PARAM_FRAGMENTS}.{name}")
        return t

    def _zero2_frozen(self, out: dict[str, Tensor]) -> None:
        for name in self._frozen_shapes():
            t = self._fragment(0, name)
            st = BlockStorage(
                name, t.nbytes, t.dtype, "cpu", loader=partial(_contiguous, t), origin=t.storage.origin if t.storage else ""
            )
            out[name] = Tensor(st, t.dtype, t.shape, is_parameter=True)

    def _zero3_frozen(self, out: dict[str, Tensor]) -> None:
        for name, shape in self._frozen_shapes().items():
            where = self._path(self.model_files[0])
            n = _numel(shape, where, name)
            frags = [self._fragment(r, name) for r in range(self.world_size)]
            dt = frags[0].dtype
            if any(f.dtype != dt for f in frags) or sum(f.numel() for f in frags) < n:
                raise FormatError(
                    "a frozen parameter's fragments do not hold it",
                    path=where,
                    member=name,
                    expected=n,
                    found=sum(f.numel() for f in frags),
                )
            segs = [(_Segments([_flat_of(f, self._path(self.model_files[r]), name)]), 0, f.numel()) for r, f in enumerate(frags)]
            st = BlockStorage(
                name, n * dt.itemsize, dt, "cpu", loader=partial(_gather, segs, n, dt), origin=f"{self.folder}:{name}"
            )
            out[name] = Tensor(st, dt, tuple(shape), is_parameter=True)

    def _zero2_trainable(self, out: dict[str, Tensor]) -> None:
        where = self._path(self.model_files[0])
        shapes = self.models[0][S.PARAM_SHAPES]
        if not isinstance(shapes, list) or len(shapes) != len(self.rank_groups[0]):
            raise FormatError(
                "param_shapes does not list one dict per parameter group",
                path=where,
                member=S.PARAM_SHAPES,
                expected=len(self.rank_groups[0]),
                found=short_repr(shapes, 60),
            )
        pads = self.alignment_paddings
        for gi, group in enumerate(shapes):
            if not isinstance(group, dict):
                raise FormatError("a param_shapes group is not a dict", path=where, member=f"{S.PARAM_SHAPES}[{gi}]")
            parts = [_Segments([self.rank_groups[r][gi]]) for r in range(self.world_size)]
            dt = parts[0].parts[0].dtype
            avail = sum(p.numel for p in parts)
            gpads = None
            if pads is not None:
                gpads = pads[gi] if isinstance(pads, list) and gi < len(pads) else None
                if not isinstance(gpads, list) or len(gpads) != len(group) or not all(type(x) is int and x >= 0 for x in gpads):
                    raise FormatError(
                        f"param_alignment_paddings of group {gi} does not match its {len(group)} parameters",
                        path=self._path(self.optim_files[0]),
                        member=S.PARAM_ALIGNMENT_PADDINGS,
                        found=short_repr(gpads, 60),
                    )
            offset = 0
            for pi, (name, shape) in enumerate(group.items()):
                n = _numel(shape, where, name)
                if offset + n > avail:
                    raise FormatError(
                        f"param_shapes of group {gi} needs more elements than the partitions hold",
                        path=where,
                        member=name,
                        expected=f">= {offset + n}",
                        found=avail,
                    )
                pieces = _ranges(parts, offset, n)
                st = BlockStorage(
                    name, n * dt.itemsize, dt, "cpu", loader=partial(_gather, pieces, n, dt), origin=f"{self.folder}:{name}"
                )
                out[name] = Tensor(st, dt, tuple(shape), is_parameter=True)
                offset += n + (gpads[pi] if gpads is not None else 0)
            if S.zero2_align(offset, self.world_size) != S.zero2_align(avail, self.world_size):
                raise FormatError(
                    f"param_shapes of group {gi} does not account for the flat partitions "
                    f"(consumed {offset} of {avail} elements)",
                    path=where,
                    member=S.PARAM_SHAPES,
                    expected=avail,
                    found=offset,
                )

    def _zero3_trainable(self, out: dict[str, Tensor]) -> None:
        where = self._path(self.model_files[0])
        shapes = self.models[0][S.PARAM_SHAPES]
        if not isinstance(shapes, list) or not all(isinstance(g, dict) for g in shapes):
            raise FormatError(
                "param_shapes is not a list of dicts", path=where, member=S.PARAM_SHAPES, found=short_repr(shapes, 60)
            )
        merged = {k: v for g in shapes for k, v in g.items()}
        per_rank = self.flat_groups[0].numel
        for r, seg in enumerate(self.flat_groups):
            if seg.starts != self.flat_groups[0].starts:
                raise FormatError(
                    "rank files whose flat groups differ in size",
                    path=self._path(self.optim_files[r]),
                    expected=self.flat_groups[0].starts[1:],
                    found=seg.starts[1:],
                )
        dt = self.rank_groups[0][0].dtype
        offset = 0
        for name, shape in merged.items():
            n = _numel(shape, where, name)
            pn = S.zero3_partitioned_numel(n, self.world_size)
            if offset + pn > per_rank:
                raise FormatError(
                    "param_shapes needs more elements than the flat partitions hold",
                    path=where,
                    member=name,
                    expected=f">= {offset + pn}",
                    found=per_rank,
                )
            pieces = [(seg, offset, pn) for seg in self.flat_groups]
            st = BlockStorage(
                name, n * dt.itemsize, dt, "cpu", loader=partial(_gather, pieces, n, dt), origin=f"{self.folder}:{name}"
            )
            out[name] = Tensor(st, dt, tuple(shape), is_parameter=True)
            offset += pn
        if offset != per_rank:
            raise FormatError(
                f"param_shapes does not account for the flat partitions (consumed {offset * self.world_size} "
                f"of {per_rank * self.world_size} elements)",
                path=where,
                member=S.PARAM_SHAPES,
                expected=per_rank,
                found=offset,
            )

    def tensors(self) -> Iterator[tuple[str, Tensor]]:
        return iter(self.state_dict().items())

    def close(self) -> None:
        for art in self._arts.values():
            art.close()
        self._arts.clear()
        self._objs.clear()


def _flat_of(t: Tensor, path: str, member: str) -> Tensor:
    """``t`` seen as 1-D (a fragment is a flat slice; a contiguous view reshapes)."""
    if t.ndim == 1:
        return t
    if not t.is_contiguous():
        raise FormatError(
            "a frozen parameter's fragment is not contiguous", path=path, member=member, found=f"stride {t.stride()}"
        )
    return Tensor(t.storage, t.dtype, (t.numel(),), None, t.storage_offset())


def _inside(model: dict[str, Any], osd: Any) -> dict[str, Any]:
    """What the checkpoint holds besides the weights, for ``info``: which parts are
    present (model, optimizer, scheduler...) and the optimizer's per-parameter states."""
    out: dict[str, Any] = {}
    for key, what in S.PARTS.items():
        v = model.get(key)
        if v is not None and v != {} and v != []:
            out[what] = True
    base = None
    if isinstance(osd, dict):  # the wrapped torch optimizer's state dict: stages 1, 2 / stage 3
        base = osd.get("base_optimizer_state", osd.get(S.OPTIMIZER_STATE_DICT))
    state = base.get("state") if isinstance(base, dict) else None
    if isinstance(state, dict) and state:
        first = next(iter(state.values()))
        if isinstance(first, dict):
            out["optimizer_states"] = sorted(str(k) for k in first)
    groups = base.get("param_groups") if isinstance(base, dict) else None
    if isinstance(groups, list):
        out["param_groups"] = len(groups)
    return out


def _ranges(parts: list[_Segments], start: int, count: int) -> list[tuple[_Segments, int, int]]:
    """Elements ``[start, start + count)`` of the ranks' partitions laid end to end, as
    ``(segments, start, count)`` pieces."""
    pieces = []
    base = 0
    for seg in parts:
        a, b = max(start, base), min(start + count, base + seg.numel)
        if a < b:
            pieces.append((seg, a - base, b - a))
        base += seg.numel
    return pieces
