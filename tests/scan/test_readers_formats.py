"""The scanner recognises every format a reader opens, by the readers' own sniffers.

Issue 30 item 6 / issue 36 bug 3: every shard of a ``save_pretrained`` safetensors set was
"unrecognized" in ``torchless scan``, and a shard whose u64 header length starts with
``0x78`` (joblib's zlib prefix) was called "zlib-compressed". The fixtures are written by the
real tools (``safetensors``, ``numpy``, ``joblib``, ``torch``) or are the committed samples.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from torchless.cli.main import main
from torchless.formats.registry import formats_that
from torchless.scan import scan

safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="the safetensors package writes the shards")

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def _save_with_header_length(path: Path, tensors: dict[str, np.ndarray], want: int) -> None:
    """``safetensors.numpy.save_file`` with metadata padded so that the header length (the
    file's first u64) is ``want``; the package pads the header to 8 bytes itself."""
    pad = 0
    for _ in range(8):
        safetensors_numpy.save_file(tensors, str(path), metadata={"format": "pt", "pad": "x" * pad})
        got = struct.unpack("<Q", path.read_bytes()[:8])[0]
        if got == want:
            return
        pad += want - got
    raise AssertionError(f"could not make a header of {want} bytes")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """A transformers-style sharded set: two shards and ``model.safetensors.index.json``;
    the first shard's header length is 0x9c78 (its first bytes ``78 9c``: a zlib header)."""
    d = tmp_path_factory.mktemp("hfset")
    first = {"a.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "a.bias": np.ones(3, np.float32)}
    second = {"b.weight": np.full((2, 3), 0.5, np.float16)}
    _save_with_header_length(d / "model-00001-of-00002.safetensors", first, 0x9C78)
    safetensors_numpy.save_file(second, str(d / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    weight_map = {k: "model-00001-of-00002.safetensors" for k in first}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in second})
    total = sum(v.nbytes for v in (*first.values(), *second.values()))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return d


def _unrecognized(fr):  # type: ignore[no-untyped-def]
    """The file-level conclusion "no carrier recognised" (the pickle fallback's note); notes
    about what another loader's view does (joblib.load on a zlib look-alike) may stay."""
    return [f for f in fr.findings if f.rule == "unrecognized" and f.loader == "pickle.load"]


def test_zlib_looking_shard_is_safetensors(shards, capsys):
    head = (shards / "model-00001-of-00002.safetensors").read_bytes()[:2]
    assert head == b"\x78\x9c"  # the premise: joblib's zlib prefix, a valid zlib header
    for f in sorted(shards.glob("*.safetensors")):
        loaded = safetensors_numpy.load_file(str(f))  # the oracle: a safetensors file
        assert loaded
    report = scan(str(shards), jobs=1)
    kinds = {os.path.basename(fr.path): fr.kind for fr in report.files}
    assert kinds == {
        "model-00001-of-00002.safetensors": "safetensors",
        "model-00002-of-00002.safetensors": "safetensors",
        "model.safetensors.index.json": "hf",
    }
    for fr in report.files:
        assert fr.verdict == "clean", fr.to_dict()
        assert not _unrecognized(fr), fr.to_dict()
    # as a user types it
    assert main(["scan", str(shards), "-j", "1"]) == 0
    out = capsys.readouterr().out
    assert "model-00001-of-00002.safetensors: CLEAN (safetensors, no executable content)" in out
    assert "model-00002-of-00002.safetensors: CLEAN (safetensors, no executable content)" in out
    assert "unrecognized" not in out and "compressed" not in out


def _write_joblib(d: Path) -> list[Path]:
    joblib = pytest.importorskip("joblib", reason="joblib writes its own files")
    plain, packed = d / "m.joblib", d / "z.joblib"
    joblib.dump({"w": np.arange(6.0)}, plain)
    joblib.dump({"w": np.arange(6.0)}, packed, compress=("zlib", 3))
    return [plain, packed]


def _write_npz(d: Path) -> list[Path]:
    np.savez(d / "m.npz", w=np.arange(4))
    np.save(d / "m.npy", np.arange(4))
    return [d / "m.npz", d / "m.npy"]


def _write_package(d: Path) -> list[Path]:
    torch_package = pytest.importorskip("torch.package", reason="torch writes torch.package archives")
    p = d / "pkg.pt"
    with torch_package.PackageExporter(str(p)) as pe:
        pe.save_pickle("res", "obj.pkl", {"a": [1, 2, 3]})
        pe.save_text("res", "note.txt", "hello")
    return [p]


#: the files of a training-framework checkpoint that hold data its loader reads with
#: torch.load or safetensors; the rest (``latest``, ``trainer_state.json``, a tracker
#: ``.txt``) is plain text no loader unpickles
_DATA_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".pkl")


def _built(name: str, tmp: Path) -> list[Path]:
    """The data files of the conformance suite's sample of ``name`` (torchless.testing)."""
    from torchless.testing import _builtin
    from torchless.testing.handlers import ConformanceSkip

    build = {
        "trainer": _builtin._build_trainer,
        "lightning": _builtin._build_lightning,
        "megatron": _builtin._build_megatron,
        "deepspeed": _builtin._build_deepspeed,
        "fsdp": _builtin._build_fsdp,
    }[name]
    out = tmp / name
    out.mkdir()
    try:
        samples = build(out, SAMPLES)
    except ConformanceSkip as e:
        pytest.skip(str(e))
    files: list[Path] = []
    for smp in samples:
        root = Path(smp.path)
        found = [root] if root.is_file() else sorted(root.rglob("*"))
        files += [f for f in found if f.is_file() and f.suffix in _DATA_SUFFIXES]
    return files


def _files(name: str, tmp: Path, shards: Path) -> list[Path]:
    """Artifacts of format ``name`` (a folder format: every file in the folder)."""
    s = SAMPLES
    table = {
        "pt": lambda: [s / "checkpoint.pt", s / "state_dict.pt", s / "legacy_format.pt"],
        "safetensors": lambda: sorted(shards.glob("*.safetensors")),
        "hf": lambda: sorted(shards.iterdir()),
        "npz": lambda: _write_npz(tmp),
        "joblib": lambda: _write_joblib(tmp),
        "onnx": lambda: [s / "mlp.onnx"],
        "torchscript": lambda: [s / "scripted_module.pt", s / "scripted_module.ptl", s / "scripted_module.ff"],
        "package": lambda: _write_package(tmp),
        "executorch": lambda: sorted((s / "executorch").glob("*.pte")),
        "dcp": lambda: sorted((s / "dcp_ckpt").iterdir()),
        "aoti": lambda: [s / "mlp_aoti.pt2"],
        "pt2": lambda: [s / "mlp.pt2", *sorted((s / "old_pt2").glob("*/*.pt2"))],
        **{n: (lambda n=n: _built(n, tmp)) for n in ("trainer", "lightning", "megatron", "deepspeed", "fsdp")},
    }
    return table[name]()


READABLE = formats_that("read")


def test_every_readable_format_is_covered():
    # a new format the registry reads must be added to the table above
    assert set(READABLE) == {"pt", "safetensors", "hf", "npz", "joblib", "onnx", "torchscript", "package"} | {
        "executorch",
        "dcp",
        "aoti",
        "pt2",
        "trainer",
        "lightning",
        "megatron",
        "deepspeed",
        "fsdp",
    }


@pytest.mark.parametrize("name", READABLE)
def test_scan_never_calls_a_readable_format_unrecognized(name, shards, tmp_path):
    files = _files(name, tmp_path, shards)
    assert files
    report = scan([str(f) for f in files], jobs=1)
    assert {fr.path for fr in report.files} >= {str(f) for f in files}  # (an index json brings its shards)
    for fr in report.files:
        assert fr.kind not in ("unrecognized", "unknown", "zip"), (fr.path, fr.kind)
        # a joblib file is a pickle, maybe compressed: called by its carrier (zlib-compressed)
        assert name == "joblib" or not fr.kind.endswith("-compressed"), (fr.path, fr.kind)
        assert not _unrecognized(fr), (fr.path, [f.message for f in fr.findings])
