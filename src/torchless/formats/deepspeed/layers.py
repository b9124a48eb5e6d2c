"""DeepSpeed checkpoints whose model is saved as module weights in several files:
pipeline-parallel layers (``layer_XX-model_states.pt``) and MoE experts
(``layer_L_expert_E_mp_rank_00_model_states.pt``).

``zero_to_fp32`` refuses both (DeepSpeed 0.19.8: a pipeline checkpoint's model states
hold ``module: None``; an expert file is "not a model state checkpoint"). What comes out
is what DeepSpeed's own ``load_checkpoint`` puts into the model, gathered over ranks:

- pipeline: each layer file's state dict under the ``PipelineModule``'s names
  (``<global layer index>.<name>``), layers in index order;
- MoE: rank 0's ``module`` state dict with every expert file's tensors (global expert
  ids, as saved) placed after its MoE layer's other entries, experts in id order.

Tensors are the files' own, in the dtype the module was trained in (the fp32 master
partitions of the optimizer files are not used: for fp32 training they are the same
values). Each is read lazily from its file's memory map.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from typing import Any

from ...core.errors import FormatError, LimitError, NotFoundError, UnsupportedError, short_repr
from ...core.tensor import Tensor
from ..base import LoadPolicy
from ..dcp.read import BlockStorage
from ..ranks import load_rank_dict
from . import spec as S
from .read import MAX_RANKS, _contiguous, _stage_of, find_tag_folder

__all__ = ["ModuleCheckpoint", "has_module_files"]


def has_module_files(names: list[str]) -> bool:
    """True when a tag folder's names include pipeline layer or MoE expert files."""
    return any(S.LAYER_FILE.match(n) or S.EXPERT_FILE.match(n) for n in names)


def _shape(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, (tuple, list)) and all(type(d) is int and d >= 0 for d in v):
        return tuple(v)
    return None


class ModuleCheckpoint:
    """A pipeline-parallel or MoE DeepSpeed tag folder, consolidated from module weights.

    Attributes:
        layout: ``"pipeline"`` or ``"moe"``.
        folder: the tag folder.
        stage: the ZeRO stage of the optimizer files (0 when there are none).
        world_size: pipeline stages (pipeline) or data-parallel ranks (MoE).
    """

    def __init__(self, path: Any, policy: LoadPolicy | None = None) -> None:
        self.root = os.fspath(path)
        if not os.path.isdir(self.root):
            raise NotFoundError("no such checkpoint folder", path=self.root)
        pol = policy or LoadPolicy()
        self.policy = replace(pol, allowed_globals=pol.allowed_globals | S.DS_GLOBALS)
        self.folder = find_tag_folder(self.root)
        names = S.rank_files(self.folder, "model_states.pt")  # layer files end "-model_states.pt"
        if len(names) > MAX_RANKS:
            raise LimitError("too many model state files", path=self.folder, expected=f"<= {MAX_RANKS}")
        self.layer_files = [n for n in names if S.LAYER_FILE.match(n)]
        self.expert_files = [n for n in names if S.EXPERT_FILE.match(n)]
        self.model_files = [n for n in names if S.MP_MODEL_FILE.match(n)]
        self.optim_files = S.rank_files(self.folder, S.OPTIM_SUFFIX)
        self.layout = "pipeline" if self.layer_files else "moe"
        self._arts: dict[str, Any] = {}
        self._objs: dict[str, Any] = {}
        self._tensors: dict[str, Tensor] = {}
        self._buffer_names: set[str] = set()
        try:
            if not self.model_files:
                raise FormatError(
                    "a DeepSpeed tag folder without mp_rank_XX_model_states.pt",
                    path=self.folder,
                    expected="mp_rank_00_model_states.pt",
                )
            self.models = [self._load(n) for n in self.model_files]
            m0 = self.models[0]
            self.ds_version = m0.get(S.DS_VERSION)
            self.stage = 0
            for m in self.models:
                self._buffer_names.update(str(b) for b in m.get(S.BUFFER_NAMES) or ())
            if self.optim_files:
                osd = self._load(self.optim_files[0]).get(S.OPTIMIZER_STATE_DICT)
                if isinstance(osd, dict) and S.ZERO_STAGE in osd:
                    self.stage = _stage_of(osd[S.ZERO_STAGE], self._path(self.optim_files[0]))
            if self.layout == "pipeline":
                self._pipeline()
            else:
                self._moe()
        except BaseException:
            self.close()
            raise

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def _load(self, name: str) -> dict[str, Any]:
        return load_rank_dict(self.folder, name, self.policy, self._arts, self._objs)

    def _put(self, out: dict[str, Tensor], key: str, t: Any, name: str, member: str) -> None:
        where = self._path(name)
        if not isinstance(t, Tensor):
            raise FormatError("a module entry is not a tensor", path=where, member=member, found=short_repr(t, 60))
        if key in out:
            raise FormatError("a tensor name given by two files", path=where, member=key)
        st = BlockStorage(key, t.nbytes, t.dtype, "cpu", loader=partial(_contiguous, t), origin=f"{where}:{member}")
        out[key] = Tensor(st, t.dtype, t.shape, is_parameter=key not in self._buffer_names)

    def _world(self, key: str) -> int:
        sizes: list[int] = []
        for name, m in zip(self.model_files, self.models, strict=True):
            ws = m.get(key)
            if type(ws) is not int or ws < 1:
                raise FormatError(f"bad {key}", path=self._path(name), member=key, found=short_repr(ws, 40))
            if sizes and ws != sizes[0]:
                raise FormatError(
                    "model state files of different world sizes", path=self._path(name), member=key, expected=sizes[0], found=ws
                )
            sizes.append(ws)
        return sizes[0]

    # -- pipeline parallel -----------------------------------------------------------
    def _pipeline(self) -> None:
        self.world_size = self._world(S.MP_WORLD_SIZE)
        # model_files holds exactly the names MP_MODEL_FILE matched (the folder listing's filter)
        ranks = [int(S.MP_MODEL_FILE.match(n).group(1)) for n in self.model_files]  # type: ignore[union-attr]
        if ranks != list(range(self.world_size)):
            missing = sorted(set(range(self.world_size)) - set(ranks))
            raise FormatError(
                f"a pipeline checkpoint of {self.world_size} stages needs mp_rank_00..{self.world_size - 1:02d}_model_states.pt",
                path=self._path(f"mp_rank_{missing[0]:02d}_model_states.pt") if missing else self.folder,
                expected=self.world_size,
                found=len(ranks),
            )
        by_index: dict[int, str] = {}
        for n in self.layer_files:
            m = S.LAYER_FILE.match(n)
            assert m is not None
            if m.group(2):
                raise UnsupportedError(
                    "tensor-parallel pipeline layer files (a rank suffix in the name) are not merged",
                    path=self._path(n),
                    hint="DeepSpeed records no merge rule for them; load them with the model's own code",
                )
            idx = int(m.group(1))
            if idx in by_index:
                raise FormatError("two files for one pipeline layer", path=self._path(n), found=by_index[idx])
            by_index[idx] = n
        out: dict[str, Tensor] = {}
        for idx in sorted(by_index):
            name = by_index[idx]
            for k, v in self._load(name).items():
                self._put(out, f"{idx}.{k}", v, name, str(k))
        # every parameter and buffer the stages' model states name is in a layer file, with its shape
        for mname, md in zip(self.model_files, self.models, strict=True):
            where = self._path(mname)
            shapes = md.get(S.PARAM_SHAPES)
            if not isinstance(shapes, list) or not all(isinstance(g, dict) for g in shapes):
                raise FormatError("param_shapes is not a list of dicts", path=where, member=S.PARAM_SHAPES)
            frozen = md.get(S.FROZEN_PARAM_SHAPES)
            groups = [*shapes, frozen] if isinstance(frozen, dict) else shapes
            for g in groups:
                for pname, shape in g.items():
                    self._check_entry(out, str(pname), _shape(shape), where, by_index)
            for b in md.get(S.BUFFER_NAMES) or ():
                self._check_entry(out, str(b), None, where, by_index)
        self._tensors = out

    def _check_entry(
        self, out: dict[str, Tensor], key: str, shape: tuple[int, ...] | None, where: str, by_index: dict[int, str]
    ) -> None:
        idx = key.split(".", 1)[0]
        if key not in out:
            layer = f"layer_{int(idx):02d}-model_states.pt" if idx.isdigit() else "a layer file"
            raise FormatError(
                f"the model states name {key!r} but no layer file holds it (missing: {layer})",
                path=self._path(by_index.get(int(idx), layer)) if idx.isdigit() else where,
                member=key,
            )
        if shape is not None and tuple(out[key].shape) != shape:
            raise FormatError(
                "a layer file's tensor does not have the shape the model states give",
                path=self._path(by_index[int(idx)]),
                member=key,
                expected=shape,
                found=tuple(out[key].shape),
            )

    # -- MoE experts -----------------------------------------------------------------
    def _moe(self) -> None:
        if len(self.model_files) != 1 or any(n.startswith("zero_pp_rank_") for n in S.rank_files(self.folder, S.MODEL_SUFFIX)):
            raise UnsupportedError(
                "MoE checkpoints with tensor parallelism or ZeRO-3 partitioned weights are not consolidated",
                path=self.folder,
            )
        mname = self.model_files[0]
        m0 = self.models[0]
        self.world_size = self._world(S.DP_WORLD_SIZE)
        if self.optim_files and len(self.optim_files) != self.world_size:
            raise FormatError(
                f"the checkpoint was written by {self.world_size} ranks but {len(self.optim_files)} "
                f"*{S.OPTIM_SUFFIX} files are there (a rank missing, or files of another run)",
                path=self.folder,
                expected=self.world_size,
                found=len(self.optim_files),
            )
        module = m0.get("module")
        if not isinstance(module, dict):
            raise FormatError("no module state dict", path=self._path(mname), member="module")
        # the experts of each MoE layer (by its key prefix), by global id
        layers: dict[str, dict[int, str]] = {}
        for n in self.expert_files:
            m = S.EXPERT_FILE.match(n)
            assert m is not None
            if int(m.group(3)) != 0:
                raise UnsupportedError("tensor-parallel MoE expert files are not merged", path=self._path(n))
            eid = int(m.group(2))
            sd = self._load(n)
            prefixes = {str(k).split(S.EXPERT_KEY, 1)[0] for k in sd}
            ids = {str(k).split(S.EXPERT_KEY, 1)[1].split(".", 1)[0] if S.EXPERT_KEY in str(k) else "" for k in sd}
            if len(prefixes) != 1 or ids != {str(eid)}:
                raise FormatError(
                    "an expert file does not hold exactly the expert its name gives",
                    path=self._path(n),
                    expected=f"keys '<layer>{S.EXPERT_KEY}{eid}.*'",
                    found=short_repr(sorted(map(str, sd))[:4], 120),
                )
            experts = layers.setdefault(prefixes.pop(), {})
            if eid in experts:
                raise FormatError("two files for one expert", path=self._path(n), found=experts[eid])
            experts[eid] = n
        self.experts: dict[str, int] = {}
        tail: dict[str, list[tuple[str, Tensor, str]]] = {}
        for prefix, experts in layers.items():
            gate = module.get(prefix + S.GATE_KEY)
            num = gate.shape[0] if isinstance(gate, Tensor) and gate.ndim == 2 else None
            expected = list(range(num if num is not None else max(experts) + 1))
            if sorted(experts) != expected:
                gone = sorted(set(expected) - set(experts))
                pattern = S.EXPERT_FILE.match(experts[min(experts)])
                assert pattern is not None
                lead = f"layer_{pattern.group(1)}_" if pattern.group(1) is not None else ""
                raise FormatError(
                    f"MoE layer {prefix!r} has {len(expected)} experts (its gate's rows) but {len(experts)} expert files",
                    path=self._path(f"{lead}expert_{gone[0]}_mp_rank_00_model_states.pt")
                    if gone
                    else self._path(experts[max(experts)]),
                    expected=len(expected),
                    found=len(experts),
                )
            self.experts[prefix] = len(expected)
            ref: dict[str, tuple[int, ...] | None] | None = None
            for eid in expected:
                n = experts[eid]
                sd = self._load(n)
                local = {str(k).split(S.EXPERT_KEY + str(eid), 1)[1]: v for k, v in sd.items()}
                shapes = {k: tuple(v.shape) if isinstance(v, Tensor) else None for k, v in local.items()}
                if ref is None:
                    ref = shapes
                elif shapes != ref:
                    raise FormatError(
                        f"the experts of MoE layer {prefix!r} differ in names or shapes",
                        path=self._path(n),
                        expected=short_repr(ref, 120),
                        found=short_repr(shapes, 120),
                    )
                tail.setdefault(prefix, []).extend((str(k), v, n) for k, v in sd.items())
        # the shapes the model states give for the local experts must be the files'
        for g in m0.get(S.PARAM_SHAPES) or ():
            if not isinstance(g, dict):
                raise FormatError("param_shapes is not a list of dicts", path=self._path(mname), member=S.PARAM_SHAPES)
            for pname, shape in g.items():
                pname = str(pname)
                if S.EXPERT_KEY not in pname:
                    continue
                prefix, rest = pname.split(S.EXPERT_KEY, 1)
                files = layers.get(prefix)
                if files is None:
                    raise FormatError(f"no expert files for MoE layer {prefix!r}", path=self.folder, member=pname)
                eid_s = rest.split(".", 1)[0]
                if eid_s.isdigit() and int(eid_s) in files:
                    t = self._load(files[int(eid_s)]).get(pname)
                    if not isinstance(t, Tensor) or tuple(t.shape) != _shape(shape):
                        raise FormatError(
                            "an expert file's tensor does not have the shape the model states give",
                            path=self._path(files[int(eid_s)]),
                            member=pname,
                            expected=_shape(shape),
                            found=tuple(t.shape) if isinstance(t, Tensor) else short_repr(t, 40),
                        )
        # module order, each layer's experts after the last entry of that layer
        last: dict[str, str] = {}
        for k in module:
            for prefix in tail:
                if str(k).startswith(prefix + ".deepspeed_moe."):
                    last[prefix] = str(k)
        after: dict[str, list[str]] = {}
        for prefix in tail:
            after.setdefault(last.get(prefix, ""), []).append(prefix)
        out: dict[str, Tensor] = {}
        for k, v in module.items():
            self._put(out, str(k), v, mname, f"module.{k}")
            for prefix in after.get(str(k), ()):
                for key, t, n in tail[prefix]:
                    self._put(out, key, t, n, key)
        for prefix in after.get("", ()):
            for key, t, n in tail[prefix]:
                self._put(out, key, t, n, key)
        self._tensors = out

    # -- API --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Tensor]:
        return self._tensors

    def tensors(self) -> Iterator[tuple[str, Tensor]]:
        return iter(self._tensors.items())

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"layout": self.layout, "zero_stage": self.stage, "world_size": self.world_size}
        if self.layout == "pipeline":
            out["pipeline_stages"] = self.world_size
            out["layer_files"] = self.layer_files
        else:
            out["moe_layers"] = self.experts
            out["expert_files"] = self.expert_files
        out["model_files"] = self.model_files
        out["optim_files"] = self.optim_files
        out["files"] = len(self._arts)
        return out

    def close(self) -> None:
        for art in self._arts.values():
            art.close()
        self._arts.clear()
        self._objs.clear()
