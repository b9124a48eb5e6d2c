"""Open-world differential cases for the tensor writers (issue 31).

One case = one random dict of torch tensors (every dtype torch, safetensors and NumPy
share, the float8 FNUZ types, complex and bool; 0-d, empty and rank-5 shapes; values from
random bits, NaN payloads included; exact aliases, disjoint and overlapping views of
earlier tensors; names from a pool holding unicode, dots, slashes, NUL, lone surrogates,
the empty string and safetensors' reserved ``__metadata__``). It is written two ways:

* ``torchless.save`` / ``write_tensors`` of the torch tensors themselves;
* ``torch.save`` to a ``.pt`` file, then ``torchless.convert`` from that file;
* ``torch.distributed.checkpoint.save`` to a DCP folder, then ``torchless.convert`` from it;

to ``.safetensors``, a sharded Hugging Face safetensors set (small ``max_shard_size``),
``.npz`` and ``.pt``, and read back by the real tools (``safetensors.torch.load_file``,
``numpy.load``, ``torch.load(weights_only=True)``, and transformers' index rules: every
name the index lists is in the shard it names, every shard tensor is listed,
``total_size`` is the bytes written). The expected outcome is computed here from torch's
own view of the tensors (data pointers, offsets, strides), by the rules the real tools
follow: safetensors stores an exact alias once (``save_model`` / ``save_pretrained``) and
refuses overlapping views and names it cannot parse, ``np.savez`` writes a copy per name
and cannot hold NUL or surrogates in names, torch keeps everything shared. Where the
real tool can write the same content, its file is compared with ours after loading.

A case fails on wrong data, a write where a refusal was expected (or the reverse), a
refusal that left a file behind, or any exception that is not a TorchlessError. Replay
one case: ``PYTHONPATH=src python tests/writers_fuzz.py SEED``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DTYPES = [
    "bool",
    "uint8",
    "int8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
]
#: dtypes the safetensors package stores (its torch _TYPES); complex128 is not one
ST_DTYPES = set(DTYPES) - {"complex128"}
NAMES = [
    "w",
    "layer.0.weight",
    "a.b.c",
    "é/ü",
    "",
    ".",
    "x.npy",
    "a/b",
    "__metadata__",
    "nul\x00name",
    "sur\ud800rogate",
    "\u2028",
    "名前",
    "../up",
    " sp ",
]
DESTS = ("t.safetensors", "hf/model.safetensors.index.json", "t.npz", "t.pt")


@dataclass
class Stats:
    cases: int = 0
    writes: int = 0
    refusals: int = 0
    compared_with_real_writer: int = 0
    by_dest: dict[str, int] = field(default_factory=dict)
    refusals_by_reason: dict[str, int] = field(default_factory=dict)


def _bad_name(name: str, dest: str) -> str | None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "surrogate name" if not dest.endswith(".pt") else None
    if "safetensors" in dest and name == "__metadata__":
        return "reserved name"
    if dest.endswith(".npz") and "\x00" in name:
        return "NUL in name"
    return None


def make_case(seed: int) -> dict[str, Any]:
    import torch

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 7))
    names = list(dict.fromkeys(str(rng.choice(NAMES)) + ("" if rng.random() < 0.6 else str(i)) for i in range(n)))
    sd: dict[str, Any] = {}
    for name in names:
        earlier = [v for v in sd.values() if v.numel() > 0]
        r = rng.random()
        if earlier and r < 0.15:  # the same tensor under another name (tied weights)
            sd[name] = earlier[int(rng.integers(len(earlier)))]
            continue
        if r > 0.9:  # disjoint views of one buffer no other name holds (a fused weight)
            buf = torch.from_numpy(rng.standard_normal(6).astype(np.float32))
            sd[name], sd[name + "~2"] = buf[:2], buf[2:].reshape(2, 2)
            continue
        if earlier and r < 0.3:  # a view of an earlier tensor
            base = earlier[int(rng.integers(len(earlier)))]
            flat = base.reshape(-1) if base.is_contiguous() else base
            k = int(rng.integers(4))
            if k == 0 and base.dim() >= 2:
                sd[name] = base.transpose(0, 1)
            elif k == 1 and flat.dim() == 1 and flat.numel() >= 2:
                sd[name] = flat[int(rng.integers(1, flat.numel())) :]
            elif k == 2 and flat.dim() == 1 and flat.numel() >= 2:
                sd[name] = flat[: int(rng.integers(1, flat.numel()))]
            else:
                sd[name] = base[..., :1] if base.dim() else base
            continue
        dt = str(rng.choice(DTYPES))
        rank = int(rng.integers(0, 6))
        shape = tuple(int(rng.integers(0, 4)) if rng.random() < 0.15 else int(rng.integers(1, 4)) for _ in range(rank))
        tdt = getattr(torch, dt)
        numel = int(np.prod(shape)) if shape else 1
        if numel == 0:
            t = torch.empty(shape, dtype=tdt)
        elif dt == "bool":
            t = torch.from_numpy(rng.integers(0, 2, numel).astype(np.bool_)).reshape(shape)
        else:
            size = torch.empty(0, dtype=tdt).element_size()
            raw = torch.from_numpy(rng.integers(0, 256, numel * size, dtype=np.uint8))
            t = raw.view(tdt).reshape(shape)
        sd[name] = t
    return sd


def _key(t: Any) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _span(t: Any) -> tuple[int, int]:
    if t.numel() == 0:
        return (0, 0)
    last = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=False))
    return t.storage_offset() * t.element_size(), (last + 1) * t.element_size()


def safetensors_plan(sd: dict[str, Any]) -> tuple[dict[str, str], str | None]:
    """``({alias: kept}, refusal)`` by the rule of save_pretrained / save_model."""
    aliases: dict[str, str] = {}
    first: dict[tuple, str] = {}
    kept_spans: list[tuple[int, int, int, str]] = []
    for name, t in sd.items():
        if t.untyped_storage().nbytes() == 0:  # data pointer 0: never shared (torch's own rule)
            continue
        k = _key(t)
        if k in first:
            aliases[name] = first[k]
            continue
        lo, hi = _span(t)
        ptr = k[0]
        for p2, a, b, _other in kept_spans:
            if p2 == ptr and hi > lo and lo < b and a < hi:
                return aliases, "overlapping views"
        if hi > lo:
            kept_spans.append((ptr, lo, hi, name))
        first[k] = name
    return aliases, None


def expected_refusal(sd: dict[str, Any], dest: str) -> str | None:
    for name, t in sd.items():
        bad = _bad_name(name, dest)
        if bad:
            return bad
        if "safetensors" in dest and str(t.dtype).removeprefix("torch.") not in ST_DTYPES:
            return "dtype safetensors lacks"
    if "safetensors" in dest:
        return safetensors_plan(sd)[1]
    return None


def _bits(t: Any) -> bytes:
    """The values' bytes in C order. Copied into a new tensor: ``contiguous()`` keeps a
    view whose size-1 dimensions have other strides (shape (1, 1), strides (1, 2)), and
    its flattening then cannot be viewed as bytes."""
    import torch

    c = torch.empty(tuple(t.shape), dtype=t.dtype)
    c.copy_(t.detach())
    return c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b""


def _same(got: Any, want: Any, what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert _bits(got) == _bits(want), f"{what}: values differ"


def _load_st_set(path: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    if not os.path.exists(path):  # one shard: the unsharded name, no index
        return load_file(path[: -len(".index.json")])
    idx = json.load(open(path))
    folder = os.path.dirname(path)
    out: dict[str, Any] = {}
    for shard in sorted(set(idx["weight_map"].values())):
        part = load_file(os.path.join(folder, shard))
        listed = {k for k, s in idx["weight_map"].items() if s == shard}
        assert listed == set(part), f"index lists {sorted(listed)!r}, shard {shard} holds {sorted(part)!r}"
        out.update(part)
    assert set(idx["weight_map"]) == set(out)
    assert idx["metadata"]["total_size"] == sum(v.nbytes for v in out.values()), "total_size"
    return out


def check_written(sd: dict[str, Any], dest: str, path: str, stats: Stats, res: dict[str, Any] | None) -> None:
    import torch

    if "safetensors" in dest:
        aliases, _ = safetensors_plan(sd)
        want = {k: v for k, v in sd.items() if k not in aliases}
        got = _load_st_set(path) if dest.endswith(".index.json") else __import__("safetensors.torch").torch.load_file(path)
        assert set(got) == set(want), f"names {sorted(got)!r} != {sorted(want)!r}"
        for k, v in want.items():
            _same(got[k], v, k)
        if res is not None:
            assert sorted(d["key"] for d in res["dropped"]) == sorted(aliases), f"dropped {res['dropped']!r}"
            assert res["tensors"] == len(want), f"tensors {res['tensors']} != {len(want)}"
        if not dest.endswith(".index.json") and not any("\x00" in k for k in want):
            from safetensors.torch import load_file, save_file

            ref = path + ".ref.safetensors"
            save_file({k: v.contiguous().clone() for k, v in want.items()}, ref)
            theirs = load_file(ref)
            assert set(theirs) == set(got)
            for k in theirs:
                _same(got[k], theirs[k], f"{k} (vs safetensors.save_file)")
            stats.compared_with_real_writer += 1
    elif dest.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            assert sorted(z.files) == sorted(sd), f"npz names {sorted(z.files)!r} != {sorted(sd)!r}"
            for k, v in sd.items():
                a = z[k]
                assert a.shape == tuple(v.shape), f"{k}: shape {a.shape} != {tuple(v.shape)}"
                assert np.ascontiguousarray(a).tobytes() == _bits(v), f"{k}: values differ"
        if all(
            str(v.dtype).removeprefix("torch.")
            in (
                "bool",
                "int8",
                "uint8",
                "int16",
                "int32",
                "int64",
                "float16",
                "float32",
                "float64",
                "complex64",
                "complex128",
                "uint16",
                "uint32",
                "uint64",
            )
            for v in sd.values()
        ):
            ref = path + ".ref.npz"
            np.savez(ref, **{k: v.numpy() for k, v in sd.items()})
            with np.load(ref) as theirs, np.load(path) as ours:
                assert sorted(theirs.files) == sorted(ours.files)
                for k in theirs.files:
                    assert theirs[k].dtype == ours[k].dtype and theirs[k].tobytes() == ours[k].tobytes(), f"{k} vs np.savez"
            stats.compared_with_real_writer += 1
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = torch.load(path, weights_only=True)
        assert list(got) == list(sd), f"pt names {list(got)!r}"
        for k, v in sd.items():
            _same(got[k], v, k)
        for a, b in ((a, b) for a in sd for b in sd if a < b):
            if _key(sd[a]) == _key(sd[b]) and sd[a].untyped_storage().nbytes():
                assert got[a].untyped_storage().data_ptr() == got[b].untyped_storage().data_ptr(), f"{a}/{b} not shared"


def run_case(seed: int, stats: Stats, root: str | None = None, *, with_dcp: bool = True) -> None:
    import torch

    import torchless
    from torchless.core.errors import TorchlessError

    sd = make_case(seed)
    own = root is None
    root = root or tempfile.mkdtemp(prefix="tlwf")
    try:
        src = os.path.join(root, "src.pt")
        can_torch_save = True
        try:
            torch.save(sd, src)
        except Exception:  # noqa: BLE001 - a name torch.save cannot write: that leg is skipped
            can_torch_save = False
        dcp_dir = os.path.join(root, "dcp")
        can_dcp = with_dcp
        if with_dcp:
            try:
                import torch.distributed.checkpoint as dcp

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    dcp.save({k: v.clone() for k, v in sd.items()}, checkpoint_id=dcp_dir)
            except Exception:  # noqa: BLE001 - a state dict DCP itself cannot save: that leg is skipped
                can_dcp = False
        for how in ("save", "convert", "dcp"):
            if (how == "convert" and not can_torch_save) or (how == "dcp" and not can_dcp):
                continue
            # a DCP checkpoint stores every name as its own item: no sharing survives it
            case = {k: v.clone() for k, v in sd.items()} if how == "dcp" else sd
            for dest in DESTS:
                d = os.path.join(root, f"{how}_{dest.replace('/', '_')}")
                os.makedirs(d)
                path = os.path.join(d, os.path.basename(dest))
                want_refusal = expected_refusal(case, dest)
                kw: dict[str, Any] = {"max_shard_size": 64} if dest.endswith(".index.json") else {}
                res = None
                try:
                    if how == "save":
                        torchless.write_tensors(sd, path, **kw)
                    else:
                        res = torchless.convert(src if how == "convert" else dcp_dir, path, **kw)
                except TorchlessError as e:
                    assert want_refusal is not None, f"{how} -> {dest}: refused ({e}) where the real tool writes"
                    left = os.listdir(d)
                    assert left == [], f"{how} -> {dest}: refusal left {left!r}"
                    stats.refusals += 1
                    stats.refusals_by_reason[want_refusal] = stats.refusals_by_reason.get(want_refusal, 0) + 1
                    continue
                assert want_refusal is None, f"{how} -> {dest}: written, expected a refusal ({want_refusal})"
                try:
                    check_written(case, dest, path, stats, res)
                except AssertionError as e:
                    raise AssertionError(f"{how} -> {dest}: {e}") from None
                stats.writes += 1
                stats.by_dest[dest] = stats.by_dest.get(dest, 0) + 1
        stats.cases += 1
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    s = Stats()
    run_case(int(sys.argv[1]), s)
    print(s)
