"""Reading a Megatron-LM legacy checkpoint as one merged model (rules in :mod:`.spec`).

Every rank file is read by the safe pickle machine with placeholders (``args`` is an
``argparse.Namespace``; nothing is imported). The merge reads every slice and builds the
merged tensors in memory, once, on the first :meth:`MegatronArtifact.tensors`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ...core.errors import FormatError, NotFoundError, TorchlessError, UsageError
from ...core.findings import Problem
from ...core.tensor import Tensor
from ...core.tree import describe, iter_tensors
from ...core.values import Namespace
from ...io.paths import confine, confined_file
from ...io.store import Store
from ..base import Artifact, LoadPolicy, summarize_tensors
from ..ranks import member_problems
from . import spec

__all__ = ["MegatronArtifact", "find_iteration", "is_megatron_folder", "MAX_TRACKER_BYTES"]

MAX_TRACKER_BYTES = 64


def _ranks(folder: str) -> dict[tuple[int, int], str]:
    out: dict[tuple[int, int], str] = {}
    for n in os.listdir(folder):
        m = spec.RANK_RE.match(n)
        if m and os.path.isdir(os.path.join(folder, n)):
            out[(int(m[1]), int(m[2]) if m[2] is not None else 0)] = n
    return out


def is_megatron_folder(path: Any, store: Store) -> bool:
    """A save folder with the tracker file, or an ``iter_NNNNNNN``/``release`` folder of
    ``mp_rank_*`` folders (``store``: the store holding ``path``)."""
    p = os.fspath(path)
    if store.remote:
        return False
    try:
        if os.path.isfile(os.path.join(p, spec.TRACKER)):
            return True
        name = os.path.basename(os.path.normpath(p))
        return bool(spec.ITER_RE.match(name) or name == spec.RELEASE) and bool(_ranks(p))
    except OSError:
        return False


def find_iteration(root: str) -> tuple[str, str]:
    """``(iteration folder, its name)`` for ``root``: the tracker's iteration, or ``root``
    itself when it is an iteration folder.

    Raises:
        FormatError: the tracker is not an integer or ``release``; NotFoundError: its
            folder is missing.
    """
    tracker = os.path.join(root, spec.TRACKER)
    if not os.path.isfile(tracker):
        return root, os.path.basename(os.path.normpath(root))
    real = confined_file(root, spec.TRACKER, what="tracker file", path=tracker)
    with open(real, "rb") as f:
        raw = f.read(MAX_TRACKER_BYTES + 1)
    text = raw.decode("ascii", "replace").strip()
    if len(raw) > MAX_TRACKER_BYTES or not (text.isdigit() or text == spec.RELEASE):
        raise FormatError("the tracker file must hold an iteration number or 'release'", path=tracker, found=repr(raw[:40]))
    name = spec.iter_folder(text if text == spec.RELEASE else int(text))
    where = confine(root, name, what="iteration folder", path=tracker)
    if not os.path.isdir(where):
        raise NotFoundError(f"the tracker names iteration folder {name}, which does not exist", path=os.path.join(root, name))
    return where, name


def _attr(args: Any, key: str) -> Any:
    """``args.<key>`` of the rank file's ``argparse.Namespace`` (or a placeholder's
    attributes, or a dict), None when absent."""
    if isinstance(args, Namespace):
        return vars(args).get(key)
    attrs = getattr(args, "attrs", None)
    if isinstance(attrs, dict):
        return attrs.get(key)
    return args.get(key) if isinstance(args, Mapping) else None


class MegatronArtifact(Artifact):
    """A Megatron-LM legacy checkpoint merged over its tensor- and pipeline-parallel ranks.

    Attributes:
        folder: the iteration folder read.
        iteration: its name (``iter_0000100`` or ``release``).
        tp, pp: the tensor- and pipeline-parallel sizes found (and checked against ``args``).
        files: ``{(tp rank, pp rank): rank file path}``.
    """

    format = "megatron"

    def __init__(self, path: Any, policy: LoadPolicy | None = None, *, store: Any = None) -> None:
        super().__init__(path, policy, store=store)
        p = self.path
        at_url = self.store.remote  # (read from a local folder only)
        if at_url or not os.path.isdir(p):
            if not at_url and not os.path.exists(p):
                raise NotFoundError("no such file or directory", path=p)
            raise UsageError("a Megatron-LM checkpoint is read from a local folder", path=p)
        self.folder, self.iteration = find_iteration(p)
        ranks = _ranks(self.folder)
        if not ranks:
            raise FormatError("no mp_rank_* folders", path=self.folder, expected="mp_rank_TT or mp_rank_TT_PPP folders")
        # (every name in ranks matched RANK_RE when _ranks listed it)
        piped = {spec.RANK_RE.match(n)[2] is not None for n in ranks.values()}  # type: ignore[index]
        if len(piped) != 1:
            raise FormatError("rank folders of both namings (mp_rank_TT and mp_rank_TT_PPP)", path=self.folder)
        self.tp = max(t for t, _ in ranks) + 1
        self.pp = max(q for _, q in ranks) + 1
        for t in range(self.tp):
            for q in range(self.pp):
                if (t, q) not in ranks:
                    name = spec.rank_folder(t, q if piped == {True} else None)
                    raise FormatError(
                        f"rank folder {name} is missing",
                        path=os.path.join(self.folder, name, spec.RANK_FILE),
                        expected=f"{self.tp} x {self.pp} ranks (tensor x pipeline)",
                        found=f"{len(ranks)} rank folders",
                    )
        self.files = {k: os.path.join(self.folder, n, spec.RANK_FILE) for k, n in sorted(ranks.items())}
        self._objs: dict[tuple[int, int], Any] = {}
        self._arts: list[Artifact] = []
        self._merged: dict[str, Tensor] | None = None
        #: names held by several pipeline stages (tied embeddings): the first stage's kept
        self.repeated: list[str] = []
        self.args = self._obj(0, 0).get("args") if isinstance(self._obj(0, 0), Mapping) else None
        self._check_sizes()

    # -- rank files ----------------------------------------------------------------
    def _obj(self, t: int, q: int) -> Any:
        if (t, q) not in self._objs:
            from ..pt.handler import PtArtifact
            from ..trainers.common import placeholder_policy

            f = self.files[(t, q)]
            real = confined_file(os.path.dirname(f), spec.RANK_FILE, what="rank file", path=f)
            art = PtArtifact(real, placeholder_policy(self.policy))
            self._arts.append(art)
            obj = art.load()
            if not isinstance(obj, Mapping) or not isinstance(obj.get("model"), Mapping):
                raise FormatError(
                    "not a Megatron-LM rank file",
                    path=f,
                    expected="a dict with a 'model' state dict",
                    found=describe(obj, max_items=4, max_depth=1),
                )
            self._objs[(t, q)] = obj
        return self._objs[(t, q)]

    def _check_sizes(self) -> None:
        for (t, q), f in self.files.items():
            args = self._obj(t, q).get("args")
            for key, found in (("tensor_model_parallel_size", self.tp), ("pipeline_model_parallel_size", self.pp)):
                want = _attr(args, key)
                if want is not None and want != found:
                    raise FormatError(
                        f"mixed world sizes: this rank's args.{key} is {want}, the folder holds {found}",
                        path=f,
                        expected=found,
                        found=want,
                    )

    # -- merge ---------------------------------------------------------------------
    def _stage(self, q: int) -> list[list[tuple[str, Any]]]:
        return [list(iter_tensors(self._obj(t, q)["model"])) for t in range(self.tp)]

    def _merge(self) -> dict[str, Tensor]:
        if self._merged is not None:
            return self._merged
        swiglu = bool(_attr(self.args, "swiglu"))
        out: dict[str, Tensor] = {}
        offset = 0
        for q in range(self.pp):
            per = self._stage(q)
            names = [n for n, _ in per[0]]
            for t in range(1, self.tp):
                if [n for n, _ in per[t]] != names:
                    raise FormatError(
                        "tensor-parallel ranks hold different tensors",
                        path=self.files[(t, q)],
                        expected=f"the names of {self.files[(0, q)]}",
                        found=sorted(set(n for n, _ in per[t]) ^ set(names))[:4],
                    )
            layers = {int(m[1]) for n in names for m in [spec.LAYER_RE.search(n)] if m}
            for i, name in enumerate(names):
                parts = [per[t][i][1] for t in range(self.tp)]
                merged_name = self._renumber(name, offset)
                if merged_name in out:  # a tied embedding's copy on the last stage: the first kept
                    self.repeated.append(merged_name)
                    continue
                out[merged_name] = self._join(name, parts, swiglu, self.files[(0, q)])
            offset += max(layers) + 1 if layers else 0
        self._merged = out
        return out

    @staticmethod
    def _renumber(name: str, offset: int) -> str:
        if not offset:
            return name
        return spec.LAYER_RE.sub(lambda m: m[0].replace(f"layers.{m[1]}.", f"layers.{int(m[1]) + offset}."), name, count=1)

    def _join(self, name: str, parts: list[Any], swiglu: bool, where: str) -> Tensor:
        dim = spec.split_dim(name)
        arrays = [p.numpy() for p in parts]
        if dim is None or self.tp == 1:
            return Tensor.from_numpy(np.array(arrays[0], copy=True, order="C"), parts[0].dtype)  # off the map
        if any(a.ndim <= dim for a in arrays) or len({a.shape[:dim] + a.shape[dim + 1 :] for a in arrays}) != 1:
            raise FormatError(
                f"tensor-parallel slices of {name} do not fit together on dim {dim}",
                path=where,
                member=name,
                found=[list(a.shape) for a in arrays],
            )
        if len({p.dtype.name for p in parts}) != 1:
            raise FormatError(
                f"tensor-parallel slices of {name} have different dtypes",
                path=where,
                member=name,
                found=[p.dtype.name for p in parts],
            )
        if swiglu and name.endswith(spec.SWIGLU_NAMES):
            if any(a.shape[0] % 2 for a in arrays):
                raise FormatError(
                    f"a SwiGLU slice of {name} has an odd first dim (gate and up halves expected)",
                    path=where,
                    member=name,
                    found=[list(a.shape) for a in arrays],
                )
            halves = [np.split(a, 2, axis=0) for a in arrays]
            merged = np.concatenate([h[0] for h in halves] + [h[1] for h in halves], axis=0)
        else:
            merged = np.concatenate(arrays, axis=dim)
        return Tensor.from_numpy(merged, parts[0].dtype)

    # -- Artifact ------------------------------------------------------------------
    def tensors(self) -> Iterator[tuple[str, Any]]:
        return iter(self._merge().items())

    def info(self) -> dict[str, Any]:
        merged = self._merge()
        o = self._obj(0, 0)
        shown = {
            k: _attr(self.args, k)
            for k in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "swiglu", "padded_vocab_size")
        }
        return {
            "format": self.format,
            "path": self.path,
            "framework": "megatron-lm (legacy checkpoint)",
            "iteration": self.iteration,
            "checkpoint_version": o.get("checkpoint_version"),
            "tensor_parallel": self.tp,
            "pipeline_parallel": self.pp,
            "rank_files": len(self.files),
            "args": {k: v for k, v in shown.items() if isinstance(v, (int, float, bool, str))},
            "keys": [str(k) for k in o],
            "repeated_in_stages": self.repeated,
            **summarize_tensors(merged.items()),
            "parameter_count": sum(t.numel() for t in merged.values()),
        }

    def verify(self) -> list[Problem]:
        problems: list[Problem] = []
        try:
            self._merge()
        except TorchlessError as e:
            return [Problem("merge", str(e))]
        problems += member_problems((art.path, art) for art in self._arts)
        return problems

    def close(self) -> None:
        for art in self._arts:
            art.close()
        self._arts.clear()
        self._objs.clear()
