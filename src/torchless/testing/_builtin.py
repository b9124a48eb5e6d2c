"""Conformance entries of torchless's own handlers: their samples and oracles.

Writable formats get samples written by torchless (so the oracle also checks the
writer) and, where cheap, by the reference library; the others use the producing
library here (joblib, torch.package) or the committed ``samples/`` files, which their
``samples/gen_*.py`` scripts regenerate. Oracles are the reference readers: ``torch.load``,
``torch.jit.load``, ``torch.export.load``, ``safetensors``, ``numpy.load``,
``joblib.load``, ``onnx``, torch's DCP reader and ``PackageImporter``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .handlers import Conformance, ConformanceSkip, Expected, Sample, flatten, register_conformance, torch_tensors


def _need(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConformanceSkip(f"{module} (the oracle) is not installed: {e}") from None


def _committed(samples_dir: Path | None, name: str) -> Path:
    if samples_dir is None or not (samples_dir / name).exists():
        raise ConformanceSkip(f"the committed sample {name} is not available")
    return samples_dir / name


def _copy_in(src: Path, out: Path) -> Path:
    dst = out / src.name
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)
    return dst


def _arrays() -> dict[str, np.ndarray]:
    """A small tensor set: several dtypes, a scalar, an empty tensor."""
    import ml_dtypes

    rng = np.random.default_rng(1)
    return {
        "embed.weight": rng.standard_normal((6, 4)).astype(ml_dtypes.bfloat16),
        "layers.0.weight": rng.standard_normal((4, 4)).astype(np.float32),
        "layers.0.bias": rng.standard_normal(4).astype(np.float16),
        "layers.0.mask": rng.integers(0, 2, (2, 3)).astype(bool),
        "ids": np.arange(7, dtype=np.int64),
        "scale": np.asarray(0.25, dtype=np.float64),
        "empty": np.zeros((0, 2), dtype=np.int32),
    }


def _numpy_oracle(arrays: dict[str, np.ndarray]) -> Callable[[], dict[str, Expected]]:
    return lambda: {k: Expected.from_numpy(v) for k, v in arrays.items()}


# ----------------------------------------------------------------------- corruptions
def flip_in_largest_zip_member(path: Path, member_of: Callable[[Path], Path] | None = None) -> None:
    """Flip one byte in the middle of the largest stored member's data (its CRC-32 then
    disagrees): a damage only a reader that checks CRCs finds."""
    f = member_of(path) if member_of else path
    with zipfile.ZipFile(f) as zf:
        info = max((i for i in zf.infolist() if i.compress_size), key=lambda i: i.compress_size)
    data = bytearray(f.read_bytes())
    n, x = (
        int.from_bytes(data[info.header_offset + 26 : info.header_offset + 28], "little"),
        int.from_bytes(data[info.header_offset + 28 : info.header_offset + 30], "little"),
    )
    at = info.header_offset + 30 + n + x + info.compress_size // 2
    data[at] ^= 0x5A
    f.write_bytes(bytes(data))


def truncate(rel: str | None = None, n: int = 1) -> Callable[[Path], None]:
    """Drop the last ``n`` bytes of the file (or of ``rel`` inside a folder)."""

    def corrupt(root: Path) -> None:
        f = root / rel if rel else root
        f.write_bytes(f.read_bytes()[:-n])

    return corrupt


# --------------------------------------------------------------------------------- pt
def _torch_load(path: Path) -> dict[str, Expected]:
    torch = _need("torch")
    return torch_tensors(torch.load(path, weights_only=True, map_location="cpu"))


def _torch_load_oracle(path: Path) -> Callable[[], dict[str, Expected]]:
    return lambda: _torch_load(path)


def _build_pt(out: Path, samples_dir: Path | None) -> list[Sample]:
    import torchless

    _need("torch")
    written = out / "written.pt"
    torchless.save({"model": _arrays(), "step": 3, "config": {"lr": 0.1, "tags": ["a", "b"]}}, written)
    samples = [Sample(written, _torch_load_oracle(written), corrupt=flip_in_largest_zip_member, label="torchless-written.pt")]
    for name in ("checkpoint.pt", "state_dict.pt", "legacy_format.pt"):
        try:
            p = _copy_in(_committed(samples_dir, name), out)
        except ConformanceSkip:
            continue
        corrupt = truncate() if name == "legacy_format.pt" else flip_in_largest_zip_member
        samples.append(Sample(p, _torch_load_oracle(p), corrupt=corrupt))
    return samples


register_conformance(Conformance("pt", _build_pt, oracle=_torch_load))


# ------------------------------------------------------------------------ safetensors
def _safetensors_load(path: Path) -> dict[str, Expected]:
    _need("torch")
    st = _need("safetensors.torch")
    return {k: Expected.from_torch(v) for k, v in st.load_file(str(path)).items()}


def _safetensors_oracle(path: Path) -> Callable[[], dict[str, Expected]]:
    return lambda: _safetensors_load(path)


def _build_safetensors(out: Path, samples_dir: Path | None) -> list[Sample]:
    import torchless

    _need("safetensors")
    written = out / "written.safetensors"
    torchless.write_tensors(_arrays().items(), written, metadata={"note": "conformance"})
    samples = [Sample(written, _safetensors_oracle(written), label="torchless-written.safetensors")]
    stn = _need("safetensors.numpy")
    ref = out / "reference.safetensors"
    arrays = {k: v for k, v in _arrays().items() if v.dtype.name != "bfloat16"}
    stn.save_file(arrays, str(ref))
    samples.append(Sample(ref, _numpy_oracle(arrays), label="safetensors-written.safetensors"))
    return samples


register_conformance(Conformance("safetensors", _build_safetensors, oracle=_safetensors_load))


# -------------------------------------------------------------------------------- npz
def _npz_load(path: Path) -> dict[str, Expected]:
    if path.suffix == ".npy":
        return {"array": Expected.from_numpy(np.load(path, allow_pickle=False))}
    with np.load(path, allow_pickle=False) as z:
        return {k: Expected.from_numpy(z[k]) for k in z.files}


def _npz_oracle(path: Path) -> Callable[[], dict[str, Expected]]:
    return lambda: _npz_load(path)


def _build_npz(out: Path, samples_dir: Path | None) -> list[Sample]:
    import torchless

    arrays = {k: v for k, v in _arrays().items() if v.dtype.name != "bfloat16"}
    written = out / "written.npz"
    torchless.write_tensors(arrays.items(), written)
    packed = out / "compressed.npz"
    torchless.write_tensors(arrays.items(), packed, compress=True)
    ref = out / "numpy.npz"
    np.savez(ref, **arrays)  # type: ignore[arg-type]  # numpy's stub also types **kwds against allow_pickle: bool
    single = out / "numpy.npy"
    np.save(single, arrays["layers.0.weight"])
    return [
        Sample(written, _npz_oracle(written), corrupt=flip_in_largest_zip_member, label="torchless-written.npz"),
        Sample(packed, _npz_oracle(packed), corrupt=flip_in_largest_zip_member, label="torchless-compressed.npz"),
        Sample(ref, _npz_oracle(ref), corrupt=flip_in_largest_zip_member, label="numpy-written.npz"),
        Sample(single, _npz_oracle(single), label="numpy-written.npy"),
    ]


register_conformance(Conformance("npz", _build_npz, oracle=_npz_load, oracle_lacks=("bfloat16",)))


# ----------------------------------------------------------------------------- joblib
def _joblib_oracle(path: Path) -> Callable[[], dict[str, Expected]]:
    def oracle() -> dict[str, Expected]:
        joblib = _need("joblib")
        obj = joblib.load(path)  # a file written just now by joblib.dump in this suite
        return {n: Expected.from_numpy(a) for n, a in flatten(obj, is_tensor=lambda x: isinstance(x, np.ndarray))}

    return oracle


def _build_joblib(out: Path, samples_dir: Path | None) -> list[Sample]:
    joblib = _need("joblib")
    arrays = {k: v for k, v in _arrays().items() if v.dtype.name != "bfloat16"}
    obj = {"weights": arrays, "classes": ["cat", "dog"], "n_iter": 12}
    plain = out / "model.joblib"
    joblib.dump(obj, plain)
    packed = out / "model_zlib.joblib"
    joblib.dump(obj, packed, compress=("zlib", 3))
    return [
        Sample(plain, _joblib_oracle(plain), label="joblib-written.joblib"),
        Sample(packed, _joblib_oracle(packed), label="joblib-zlib.joblib"),
    ]


register_conformance(Conformance("joblib", _build_joblib))


# ------------------------------------------------------------------------------- onnx
def _onnx_load(path: Path) -> dict[str, Expected]:
    onnx = _need("onnx")
    from onnx import numpy_helper

    model = onnx.load(str(path))  # external data too, from next to the file
    return {t.name: Expected.from_numpy(numpy_helper.to_array(t)) for t in model.graph.initializer}


def _onnx_oracle(path: Path) -> Callable[[], dict[str, Expected]]:
    return lambda: _onnx_load(path)


def _onnx_edit(src: Path, dst: Path, weights: dict[str, np.ndarray]) -> None:
    from ..formats.onnx.write import set_weights

    set_weights(src, weights, dst)


def _build_onnx(out: Path, samples_dir: Path | None) -> list[Sample]:
    onnx = _need("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(3).astype(np.float16), "b16"),
        numpy_helper.from_array(np.arange(5, dtype=np.int64), "ids"),
        numpy_helper.from_array(rng.standard_normal((64, 8)).astype(np.float32), "big"),
    ]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inline = out / "inline.onnx"
    onnx.save(model, str(inline))
    ext_dir = out / "external"
    ext_dir.mkdir()
    ext = ext_dir / "model.onnx"
    onnx.save(
        model, str(ext), save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin", size_threshold=64
    )
    samples = [
        Sample(inline, _onnx_oracle(inline), label="onnx-written.onnx"),
        Sample(
            ext,
            _onnx_oracle(ext),
            corrupt=lambda p: truncate(n=16)(p.parent / "weights.bin"),
            label="external-data.onnx",
            with_folder=True,
        ),
    ]
    try:
        p = _copy_in(_committed(samples_dir, "mlp.onnx"), out)
        samples.append(Sample(p, _onnx_oracle(p)))
    except ConformanceSkip:
        pass
    return samples


register_conformance(Conformance("onnx", _build_onnx, oracle=_onnx_load, edit=_onnx_edit))


# ------------------------------------------------------------------------ torchscript
def _jit_load(path: Path) -> dict[str, Expected]:
    torch = _need("torch")
    module = torch.jit.load(str(path), map_location="cpu")  # held: a flatbuffer module's tensors view its buffer
    out = {k: Expected.from_torch(v) for k, v in module.state_dict().items()}
    del module
    return out


def _break_flatbuffer_root(path: Path) -> None:
    """Point a flatbuffer's root offset past the end of the file."""
    data = bytearray(path.read_bytes())
    data[0:4] = (len(data) + 64).to_bytes(4, "little")
    path.write_bytes(bytes(data))


def _jit_oracle(path: Path) -> Callable[[], dict[str, Expected]]:
    return lambda: _jit_load(path)


def _jit_edit(src: Path, dst: Path, weights: dict[str, np.ndarray]) -> None:
    from ..formats.torchscript.write import save_edited

    save_edited(src, dst, tensors=weights)


def _build_torchscript(out: Path, samples_dir: Path | None) -> list[Sample]:
    _need("torch")
    samples = []
    for name in ("scripted_module.pt", "scripted_module.ptl"):
        p = _copy_in(_committed(samples_dir, name), out)
        samples.append(Sample(p, _jit_oracle(p), corrupt=flip_in_largest_zip_member))
    ff = out / "scripted_module.ff"  # the same module as a flatbuffer (PTMF), written by torch
    torch = _need("torch")
    torch.jit.save_jit_module_to_flatbuffer(torch.jit.load(str(samples[0].path), map_location="cpu"), str(ff))
    samples.append(Sample(ff, _jit_oracle(ff), corrupt=_break_flatbuffer_root, label="scripted_module.ff"))
    return samples


register_conformance(Conformance("torchscript", _build_torchscript, oracle=_jit_load, edit=_jit_edit))


# --------------------------------------------------------------------------------- hf
def _hf_load(index: Path) -> dict[str, Expected]:
    """The tensors of every shard an index json names, read by safetensors (``.safetensors``
    shards) or ``torch.load`` (``.bin`` shards)."""
    torch = _need("torch")
    if index.is_dir():
        index = next(index.glob("*.index.json"))
    weight_map = json.loads(index.read_text())["weight_map"]
    out: dict[str, Expected] = {}
    for shard in sorted(set(weight_map.values())):
        if shard.endswith(".safetensors"):
            sd = _need("safetensors.torch").load_file(str(index.parent / shard))
        else:
            sd = torch.load(index.parent / shard, weights_only=True, map_location="cpu")
        out.update((k, Expected.from_torch(v)) for k, v in sd.items())
    return out


def _hf_oracle(index: Path) -> Callable[[], dict[str, Expected]]:
    return lambda: _hf_load(index)


def _build_hf(out: Path, samples_dir: Path | None) -> list[Sample]:
    import torchless

    _need("safetensors")
    folder = out / "model"
    folder.mkdir()
    index = folder / "model.safetensors.index.json"
    files = torchless.write_tensors(_arrays().items(), index, format="hf", max_shard_size=100)
    shard = Path(files[0]).name
    assert len(files) > 2, files
    bins = out / "bin_model"
    bins.mkdir()
    bin_index = bins / "pytorch_model.bin.index.json"
    bin_files = torchless.write_tensors(_arrays().items(), bin_index, format="hf", max_shard_size=100)
    assert len(bin_files) > 2, bin_files
    bin_shard = Path(bin_files[0]).name
    return [
        Sample(folder, _hf_oracle(index), fuzz_file=index.name, corrupt=truncate(shard), label="hf-folder"),
        Sample(
            index, _hf_oracle(index), corrupt=lambda p: truncate(n=1)(p.parent / shard), label="hf-index.json", with_folder=True
        ),
        Sample(
            bins,
            _hf_oracle(bin_index),
            fuzz_file=bin_index.name,
            corrupt=lambda p: flip_in_largest_zip_member(p / bin_shard),
            label="hf-bin-folder",
        ),
    ]


register_conformance(
    Conformance("hf", _build_hf, write_suffix=".safetensors.index.json", write_options={"max_shard_size": 200}, oracle=_hf_load)
)


# ---------------------------------------------------------------------------- package
def _build_package(out: Path, samples_dir: Path | None) -> list[Sample]:
    torch = _need("torch")
    from torch.package import PackageExporter

    g = torch.Generator().manual_seed(0)
    obj = {
        "w": torch.randn(3, 4, generator=g),
        "b": torch.randn(4, generator=g).to(torch.bfloat16),
        "ids": torch.arange(5),
        "note": "conformance",
    }
    path = out / "tensors_package.pt"
    with PackageExporter(str(path)) as pe:
        pe.extern("torch.**")
        pe.save_pickle("res", "sd.pkl", obj)
        pe.save_text("res", "note.txt", "hello")

    def oracle() -> dict[str, Expected]:
        from torch.package import PackageImporter

        # a package written just now holding only torch objects: loading runs no packaged code;
        # torchless names a packaged pickle's tensors "<package>/<resource>:<key>"
        loaded = PackageImporter(str(path)).load_pickle("res", "sd.pkl")
        return {f"res/sd.pkl:{k}": Expected.from_torch(v) for k, v in loaded.items() if isinstance(v, torch.Tensor)}

    return [Sample(path, oracle, corrupt=flip_in_largest_zip_member, label="torch.package")]


register_conformance(Conformance("package", _build_package))


# -------------------------------------------------------------------------------- dcp
def _build_dcp(out: Path, samples_dir: Path | None) -> list[Sample]:
    p = _copy_in(_committed(samples_dir, "dcp_ckpt"), out)

    def oracle() -> dict[str, Expected]:
        torch = _need("torch")
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        dst = out / "dcp_as_torch_save.pt"
        if not dst.exists():
            dcp_to_torch_save(str(p), str(dst))
        return torch_tensors(torch.load(dst, weights_only=False))

    return [Sample(p, oracle, fuzz_file=".metadata", corrupt=truncate("__0_0.distcp"), label="dcp_ckpt")]


register_conformance(Conformance("dcp", _build_dcp))


# ------------------------------------------------------------------------------- aoti
def _build_aoti(out: Path, samples_dir: Path | None) -> list[Sample]:
    p = _copy_in(_committed(samples_dir, "mlp_aoti.pt2"), out)
    gen = _committed(samples_dir, "gen_aoti.py")

    def oracle() -> dict[str, Expected]:
        torch = _need("torch")
        spec = importlib.util.spec_from_file_location("_torchless_gen_aoti", gen)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        torch.manual_seed(0)  # as gen_aoti.main() does before building the model
        sd = mod.MLP().eval().state_dict()
        # Inductor folded l2.bias into a derived constant when compiling; the package keeps
        # (and torchless lists) the constants it stores under their state-dict names
        return {k: Expected.from_torch(v) for k, v in sd.items() if k != "l2.bias"}

    return [Sample(p, oracle, corrupt=flip_in_largest_zip_member, label="mlp_aoti.pt2")]


register_conformance(Conformance("aoti", _build_aoti))


# ------------------------------------------------------------------------- executorch
#: c10 ScalarType numbers of the dtypes the committed programs hold (the oracle's own table)
_ET_DTYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64", 11: "bool"}


def _executorch_expected(pte: Path) -> Callable[[], dict[str, Expected]]:
    """The constant tensors as executorch 1.5.1's deserializer read them from ``pte``
    (recorded by ``samples/gen_executorch.py`` in the ``.json`` beside it)."""

    def oracle() -> dict[str, Expected]:
        exp = json.loads(pte.with_suffix(".json").read_text())
        out: dict[str, Expected] = {}
        for plan in exp["plans"]:
            for c in plan["constants"]:
                dtype = _ET_DTYPES[c["scalar_type"]]
                numel = int(np.prod(c["sizes"], dtype=np.int64)) if c["sizes"] else 1
                raw = bytes.fromhex(c["hex"])[: numel * np.dtype(dtype).itemsize]
                out[c["name"] or f"{plan['name']}.values.{c['value']}"] = Expected(dtype, tuple(c["sizes"]), raw)
        return out

    return oracle


def _build_executorch(out: Path, samples_dir: Path | None) -> list[Sample]:
    samples = []
    for name in ("mlp", "dynamic", "xnnpack"):
        p = _copy_in(_committed(samples_dir, f"executorch/{name}.pte"), out)
        _copy_in(_committed(samples_dir, f"executorch/{name}.json"), out)
        samples.append(Sample(p, _executorch_expected(p), label=f"{name}.pte"))
    return samples


register_conformance(Conformance("executorch", _build_executorch))


# -------------------------------------------------------------------------------- pt2
def _build_pt2(out: Path, samples_dir: Path | None) -> list[Sample]:
    p = _copy_in(_committed(samples_dir, "mlp.pt2"), out)

    return [Sample(p, corrupt=flip_in_largest_zip_member, label="mlp.pt2")]


def _export_load(path: Path) -> dict[str, Expected]:
    torch = _need("torch")
    ep = torch.export.load(str(path))
    got = {k: Expected.from_torch(v) for k, v in ep.state_dict.items()}
    got.update({k: Expected.from_torch(v) for k, v in ep.constants.items() if isinstance(v, torch.Tensor)})
    return got


def _pt2_edit(src: Path, dst: Path, weights: dict[str, np.ndarray]) -> None:
    import torchless

    from ..core.tensor import Tensor
    from ..formats.pt2.write import save_pt2

    with torchless.open(src, format="pt2") as art:
        prog = art.load()
        for table in (prog.state_dict, prog.constants):
            for k in list(table):
                if k in weights:
                    table[k] = Tensor.from_numpy(weights[k])
        save_pt2(dst, prog)


register_conformance(Conformance("pt2", _build_pt2, oracle=_export_load, edit=_pt2_edit))


# ----------------------------------------------------------------- trainer, lightning
def _tiny_training(torch: Any) -> tuple[Any, Any, Any]:
    """A two-layer model after one AdamW step, its optimizer and scheduler (real state dicts)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def _build_trainer(out: Path, samples_dir: Path | None) -> list[Sample]:
    """A ``checkpoint-1/`` folder as ``transformers.Trainer`` lays it out, its files written
    by torch and safetensors (tests/formats/trainers runs the real Trainer)."""
    torch = _need("torch")
    st = _need("safetensors.torch")
    model, opt, sched = _tiny_training(torch)
    folder = out / "checkpoint-1"
    folder.mkdir()
    st.save_file(dict(model.state_dict()), str(folder / "model.safetensors"), metadata={"format": "pt"})
    torch.save(opt.state_dict(), folder / "optimizer.pt")
    torch.save(sched.state_dict(), folder / "scheduler.pt")
    torch.save({"python": (3, tuple(range(625)), None), "cpu": torch.random.get_rng_state()}, folder / "rng_state.pth")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 1, "epoch": 0.25, "log_history": []}))
    return [
        Sample(folder, _safetensors_oracle(folder / "model.safetensors"), fuzz_file="model.safetensors", label="checkpoint-1")
    ]


register_conformance(Conformance("trainer", _build_trainer))


def _build_lightning(out: Path, samples_dir: Path | None) -> list[Sample]:
    """A ``.ckpt`` holding the dict Lightning's ``dump_checkpoint`` builds, written by
    ``torch.save`` (tests/formats/trainers runs the real Lightning Trainer)."""
    torch = _need("torch")
    model, opt, sched = _tiny_training(torch)
    ckpt = {
        "epoch": 0,
        "global_step": 1,
        "pytorch-lightning_version": "2.6.6",
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "loops": {"fit_loop": {"state_dict": {}}},
        "callbacks": {},
        "optimizer_states": [opt.state_dict()],
        "lr_schedulers": [sched.state_dict()],
        "hparams_name": "kwargs",
        "hyper_parameters": {"width": 8},
    }
    p = out / "tiny.ckpt"
    torch.save(ckpt, p)

    def oracle() -> dict[str, Expected]:
        sd = torch.load(p, weights_only=True, map_location="cpu")["state_dict"]
        return {k: Expected.from_torch(v) for k, v in sd.items()}

    return [Sample(p, oracle, corrupt=flip_in_largest_zip_member, label="tiny.ckpt")]


register_conformance(Conformance("lightning", _build_lightning))


# --------------------------------------------------------------------------- megatron
def _build_megatron(out: Path, samples_dir: Path | None) -> list[Sample]:
    """A Megatron-LM legacy checkpoint, TP=2 x PP=2 with SwiGLU, written by torch the way
    Megatron lays it out (tests/formats/megatron covers more layouts); the oracle is the
    full model the ranks were sliced from."""
    import argparse

    torch = _need("torch")
    g = torch.Generator().manual_seed(0)
    full: dict[str, Any] = {"embedding.word_embeddings.weight": torch.randn(8, 4, generator=g).to(torch.bfloat16)}
    for i in range(2):
        p = f"decoder.layers.{i}."
        full[p + "self_attention.linear_qkv.weight"] = torch.randn(12, 4, generator=g)
        full[p + "self_attention.linear_proj.weight"] = torch.randn(4, 4, generator=g)
        full[p + "mlp.linear_fc1.weight"] = torch.randn(8, 4, generator=g)  # [gate (4); up (4)]
        full[p + "mlp.linear_fc2.weight"] = torch.randn(4, 4, generator=g)
        full[p + "mlp.linear_fc1.layer_norm_weight"] = torch.randn(4, generator=g)
    full["output_layer.weight"] = torch.randn(8, 4, generator=g)
    root = out / "megatron_run"
    args = argparse.Namespace(num_layers=2, tensor_model_parallel_size=2, pipeline_model_parallel_size=2, swiglu=True)
    for q in range(2):
        for t in range(2):
            model: dict[str, Any] = {}
            for name, v in full.items():
                if (name.startswith("embedding.") and q) or (name.startswith("output_layer.") and not q):
                    continue
                if name.startswith("decoder.layers."):
                    if int(name.split(".")[2]) != q:
                        continue
                    name = name.replace(f"layers.{q}.", "layers.0.")
                if name.endswith("linear_fc1.weight"):
                    gate, up = v.chunk(2)
                    v = torch.cat([gate.chunk(2)[t], up.chunk(2)[t]])
                elif name.endswith(("linear_qkv.weight", "word_embeddings.weight", "output_layer.weight")):
                    v = v.chunk(2)[t]
                elif name.endswith(("linear_proj.weight", "linear_fc2.weight")):
                    v = v.chunk(2, dim=1)[t]
                model[name] = v.clone()
            folder = root / "iter_0000001" / f"mp_rank_{t:02d}_{q:03d}"
            folder.mkdir(parents=True)
            torch.save({"args": args, "checkpoint_version": 3.0, "iteration": 1, "model": model}, folder / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text("1")
    rank0 = "iter_0000001/mp_rank_00_000/model_optim_rng.pt"

    def oracle() -> dict[str, Expected]:
        return {k: Expected.from_torch(v) for k, v in full.items()}

    return [
        Sample(
            root,
            oracle,
            fuzz_file=rank0,
            corrupt=lambda r: flip_in_largest_zip_member(r, member_of=lambda x: x / rank0),
            label="megatron tp2 pp2",
        )
    ]


register_conformance(Conformance("megatron", _build_megatron))


# -------------------------------------------------------------------------- deepspeed
def _zero_oracle(root: Path) -> dict[str, Expected]:
    """DeepSpeed's own ``zero_to_fp32`` consolidation of the checkpoint root."""
    z2f = _need("deepspeed.utils.zero_to_fp32")
    return {k: Expected.from_torch(v) for k, v in z2f.get_fp32_state_dict_from_zero_checkpoint(str(root)).items()}


def _build_deepspeed(out: Path, samples_dir: Path | None) -> list[Sample]:
    """A 2-rank ZeRO-3 checkpoint laid out as DeepSpeed 0.19.8 saves one (plain values in
    place of its pickled classes: zero_to_fp32 reads both): two parameter groups whose
    sizes do not divide by the world size, a frozen parameter, a float64 buffer, a tied name.
    (tests/formats/deepspeed writes real ones with DeepSpeed itself.)"""
    torch = _need("torch")
    _need("deepspeed.utils.zero_to_fp32")
    g = torch.Generator().manual_seed(3)
    groups: list[dict[str, tuple[int, ...]]] = [{"a.weight": (3, 5), "b.weight": (7,)}, {"b.bias": (3,)}]
    frozen: dict[str, tuple[int, ...]] = {"f.weight": (2, 3)}
    world = 2
    root = out / "zero3"
    tag = root / "global_step1"
    tag.mkdir(parents=True)
    (root / "latest").write_text("global_step1")
    full = {n: torch.randn(s, generator=g) for grp in groups for n, s in grp.items()}
    fz = {n: torch.randn(s, generator=g) for n, s in frozen.items()}

    def parts(t: Any) -> list[Any]:
        n = t.numel()
        per = -(-n // world)
        flat = torch.cat([t.reshape(-1), torch.zeros(per * world - n)])
        return [flat[r * per : (r + 1) * per] for r in range(world)]

    for r in range(world):
        flat_groups = [torch.cat([parts(full[n])[r] for n in grp]) for grp in groups]
        osd = {"zero_stage": 3, "partition_count": world, "fp32_flat_groups": flat_groups, "loss_scaler": None}
        torch.save({"optimizer_state_dict": osd, "ds_version": "0.19.8"}, tag / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
        model = {
            "module": {"scale": torch.tensor([0.5, 1.25], dtype=torch.float64), **{n: torch.empty(0) for n in full}},
            "buffer_names": ["scale"],
            "param_shapes": [{n: torch.Size(s) for n, s in grp.items()} for grp in groups],
            "frozen_param_shapes": {n: torch.Size(s) for n, s in frozen.items()},
            "frozen_param_fragments": {n: parts(t)[r].clone() for n, t in fz.items()},
            "shared_params": {"head.weight": "a.weight"},
            "ds_version": "0.19.8",
        }
        torch.save(model, tag / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
    optim = "global_step1/zero_pp_rank_1_mp_rank_00_optim_states.pt"
    return [Sample(root, lambda: _zero_oracle(root), fuzz_file=optim, corrupt=truncate(optim), label="zero3-root")]


register_conformance(Conformance("deepspeed", _build_deepspeed, oracle=_zero_oracle))


# ------------------------------------------------------------------------------ fsdp
#: one rank of an FSDP2 job on CPU: a ``fully_shard``-ed model (uneven shards: 5 rows over
#: 2 ranks; a bf16 layer; BatchNorm buffers) saves its DTensor state dict with
#: ``torch.save``; rank 0 also saves FSDP's full state dict (the oracle)
_FSDP_RANK = """
import os, sys, torch, torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(7)
model = nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5), nn.Linear(5, 2).to(torch.bfloat16))
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
torch.save(model.state_dict(), os.path.join(out, f"model_rank{rank}.pt"))
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if rank == 0:
    torch.save(full, os.path.join(os.path.dirname(out), "fsdp_full.pt"))
dist.barrier()
sys.stdout.flush()
os._exit(0)
"""


def _build_fsdp(out: Path, samples_dir: Path | None) -> list[Sample]:
    """A 2-rank FSDP2 checkpoint: each rank's ``torch.save`` of its DTensor state dict,
    written by torch itself (two gloo processes on CPU); the oracle is FSDP's full state
    dict (``get_model_state_dict(full_state_dict=True)``)."""
    import os
    import socket
    import subprocess
    import sys

    _need("torch.distributed.fsdp")
    root = out / "fsdp_ranks"
    root.mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
        env.update(LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-c", _FSDP_RANK, str(root)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=300)[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    if any(p.returncode for p in procs):
        raise RuntimeError("the FSDP ranks failed:\n" + "\n".join(log[-2000:] for log in logs))
    full = out / "fsdp_full.pt"
    rank1 = "model_rank1.pt"
    return [Sample(root, _torch_load_oracle(full), fuzz_file=rank1, corrupt=truncate(rank1), label="fsdp2 2 ranks")]


register_conformance(Conformance("fsdp", _build_fsdp))
