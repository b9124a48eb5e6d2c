"""AOTInductor packages compiled on CPU in this session: listed, parsed and their weights
read bit-exactly, without loading the shared object (torch is the oracle)."""

from __future__ import annotations

import ctypes
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.container.zip import TorchZipWriter, ZipReader
from torchless.formats.aoti.read import parse_constant_table

pytestmark = [pytest.mark.slow, pytest.mark.differential]

LAYOUTS = {"embedded": "embedded", "object": "embedded", "blob": "binary_blob", "pickle": "pickle_weights", "mmap": "mmap"}
ALL = list(LAYOUTS)


def torch_uint8():  # type: ignore[no-untyped-def]
    import torch

    return torch.uint8


def assert_same(tl, tt) -> None:  # type: ignore[no-untyped-def]
    """dtype, shape, strides, offset and every byte of the values match torch's tensor."""
    assert tl.dtype.torch_name == str(tt.dtype)
    assert tl.shape == tuple(tt.shape)
    assert tl.stride() == tt.stride()
    assert tl.storage_offset() == tt.storage_offset()
    assert tl.tobytes() == tt.contiguous().view(-1).view(dtype=torch_uint8()).numpy().tobytes()
    assert bytes(tl.storage.bytes()) == bytes(tt.untyped_storage())


@pytest.mark.parametrize("package", ALL, indirect=True)
def test_weights_match_state_dict(package: Path, state_dict) -> None:  # type: ignore[no-untyped-def]
    assert torchless.detect(package) == "aoti"
    with torchless.open(package) as art:
        model = art.package.models["model"]
        assert model.weights_layout == LAYOUTS[package.stem]
        names = dict(art.tensors())
        # every constant Inductor kept is extracted, under its state-dict FQN
        assert set(names) == {c.fqn for c in model.constants if not c.from_folded}
        assert set(names) <= set(state_dict)
        assert {"l1.weight", "l1.bias", "l2.weight", "scale", "offset"} <= set(names)
        for fqn, t in names.items():
            assert_same(t, state_dict[fqn])
        assert art.verify() == []


@pytest.mark.parametrize("package", ["embedded"], indirect=True)
def test_shared_object_is_never_loaded(package: Path, state_dict, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    def refuse(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("torchless tried to load a shared object")

    monkeypatch.setattr(ctypes.CDLL, "__init__", refuse)
    monkeypatch.setattr(ctypes.cdll, "LoadLibrary", refuse)
    with torchless.open(package) as art:
        info = art.info()
        for fqn, t in art.tensors():
            assert_same(t, state_dict[fqn])
            if t.dtype.name != "bfloat16":
                np.testing.assert_array_equal(t.numpy(), state_dict[fqn].numpy())
    m = info["model model"]
    so = [k for k, v in m["files"].items() if k == "shared_object"]
    assert so, m["files"].keys()
    (elf,) = m["binaries"].values()
    assert elf["elf"].startswith("ELF64") and elf["aoti_exports"] >= 10
    with torchless.open(package) as art:
        table = art.package.models["model"].constants
    assert elf["constants_blob"]["size"] == sum(c.data_size for c in table)  # each already 64-aligned


@pytest.mark.parametrize("package", ["embedded"], indirect=True)
def test_info_lists_package(package: Path) -> None:
    with torchless.open(package) as art:
        info = art.info()
    json.dumps(info)  # JSON-ready
    m = info["model model"]
    assert m["metadata"]["AOTI_DEVICE_KEY"] == "cpu"
    assert m["metadata"]["AOTI_COMPUTE_CAPABILITY"] == ""
    assert {"wrapper_source", "kernel_source", "metadata", "shared_object"} <= set(m["files"])
    assert m["inputs"] and m["outputs"]
    assert json.loads(m["in_spec"])[0] == 1  # pytree spec JSON (pt2.md §3.4)
    # files listed == records in the zip (oracle: Python's zipfile)
    with zipfile.ZipFile(package) as z:
        sizes = {i.filename.split("/", 1)[1]: i.file_size for i in z.infolist()}
    listed = {name: size for fs in m["files"].values() for name, size in fs.items()}
    assert listed == {k: v for k, v in sizes.items() if k.startswith("data/aotinductor/model/")}
    assert info["records"]["archive_format"] == "pt2"


@pytest.mark.parametrize("package", ["blob"], indirect=True)
def test_constant_table_matches_torch(package: Path, state_dict) -> None:  # type: ignore[no-untyped-def]
    with torchless.open(package) as art:
        for c in art.package.models["model"].constants:
            t = state_dict[c.fqn]
            assert c.shape == tuple(t.shape) and c.stride == t.stride() and c.offset == t.storage_offset()
            # data_size is the storage size rounded up to 64 bytes on CPU (spec gives exact sizes)
            assert c.data_size == (t.untyped_storage().nbytes() + 63) // 64 * 64
            assert c.dtype == str(t.dtype)[6:]


def test_plain_export_is_not_aoti(aoti_packages: Path) -> None:
    assert torchless.detect(aoti_packages / "export.pt2") != "aoti"


@pytest.mark.parametrize("package", ["blob"], indirect=True)
def test_two_models_in_one_archive(package: Path, tmp_path: Path, state_dict) -> None:  # type: ignore[no-untyped-def]
    """``data/aotinductor/<a>/`` and ``<b>/`` in one archive: names become ``<model>/<fqn>``."""
    zr = ZipReader(package)
    out = tmp_path / "two.pt2"
    w = TorchZipWriter(out, prefix="two")
    for rec in zr.records():
        data = zr.read_bytes(rec)
        if rec.startswith("data/aotinductor/model/"):
            w.write(rec, data)
            w.write(rec.replace("/model/", "/second/"), data)
        elif rec not in (".data/serialization_id",):
            w.write(rec, data)
    w.close()
    with torchless.open(out) as art:
        assert set(art.package.models) == {"model", "second"}
        names = dict(art.tensors())
        assert "model/l1.weight" in names and "second/l1.weight" in names
        assert_same(names["second/offset"], state_dict["offset"])
        assert [p for p in art.verify() if p.severity == "error"] == []


@pytest.mark.parametrize("package", ["pickle"], indirect=True)
def test_cli_info_verify_extract(package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(package), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "aoti" and info["tensors"] == 5
    assert main(["verify", str(package)]) == 0
    capsys.readouterr()
    assert main(["ls", str(package)]) == 0
    assert "l1.weight" in capsys.readouterr().out
    out = tmp_path / "x"
    assert main(["extract", str(package), str(out)]) == 0
    with zipfile.ZipFile(package) as z:
        for i in z.infolist():
            assert (out / i.filename).read_bytes() == z.read(i)
    # a second extraction refuses to overwrite, --overwrite replaces
    assert main(["extract", str(package), str(out)]) == 2
    assert main(["extract", str(package), str(out), "--overwrite"]) == 0


def test_constant_table_parser() -> None:
    text = """
    : AOTInductorModelBase(2,
                           1,
                           2,
    inputs_info_[0].name = "arg0_1";
    constants_info_[0].name = "w";
    constants_info_[0].dtype = cached_torch_dtype_bfloat16;
    constants_info_[0].device_type = cached_torch_device_type_cpu;
    constants_info_[0].offset = 3;
    constants_info_[0].data_size = 64;
    constants_info_[0].from_folded = false;
    constants_info_[0].type = static_cast<int32_t>(torch::aot_inductor::ConstantType::Buffer);
    constants_info_[0].shape = {2, 3};
    constants_info_[0].stride = {1, 2};
    constants_info_[0].layout = static_cast<int32_t>(cached_torch_layout_strided);
    constants_info_[0].original_fqn = "a.\\"w\\"";
    constants_info_[1].name = "s";
    constants_info_[1].dtype = cached_torch_dtype_float32;
    constants_info_[1].shape = {};
    constants_info_[1].stride = {};
    constants_info_[1].from_folded = true;
    """
    rows = parse_constant_table(text)
    assert [r.name for r in rows] == ["w", "s"]
    w = rows[0]
    assert (w.dtype, w.offset, w.data_size, w.type, w.shape, w.stride, w.layout, w.original_fqn) == (
        "bfloat16",
        3,
        64,
        "Buffer",
        (2, 3),
        (1, 2),
        "strided",
        'a."w"',
    )
    assert rows[1].shape == () and rows[1].from_folded
