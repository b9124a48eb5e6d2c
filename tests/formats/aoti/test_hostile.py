"""Hostile and corrupt AOTInductor packages (synthetic, no compiler needed): only
TorchlessError subclasses, problems reported by verify(), nothing executed."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchless
from torchless.container.zip import TorchZipWriter, ZipReader
from torchless.core.errors import TorchlessError
from torchless.formats.aoti.elf import parse_elf
from torchless.formats.aoti.read import read_package

from .synth import STEM, make_elf, make_package, sample_consts

D = "data/aotinductor/model/"


def rewrite(src: Path, dst: Path, change: dict[str, bytes | None]) -> Path:
    """Copy a package, replacing (or with None dropping) records."""
    zr = ZipReader(src)
    w = TorchZipWriter(dst, prefix=zr.prefix)
    for rec in zr.records():
        if rec in change:
            if change[rec] is not None:
                w.write(rec, change[rec])
            continue
        w.write(rec, zr.read_bytes(rec))
    for rec, data in change.items():
        if rec not in zr.records() and data is not None:
            w.write(rec, data)
    w.close()
    return dst


@pytest.fixture
def blob_pkg(tmp_path: Path) -> Path:
    return make_package(tmp_path / "b.pt2", sample_consts())


@pytest.fixture
def pickle_pkg(tmp_path: Path) -> Path:
    return make_package(tmp_path / "p.pt2", sample_consts(), layout="pickle_weights")


def codes(path: Path) -> set[str]:
    with torchless.open(path) as art:
        return {p.code for p in art.verify() if p.severity == "error"}


def test_truncated_blob_is_reported(blob_pkg: Path, tmp_path: Path) -> None:
    zr = ZipReader(blob_pkg)
    rec = D + f"{STEM}.wrapper_weights.blob"
    bad = rewrite(blob_pkg, tmp_path / "t.pt2", {rec: zr.read_bytes(rec)[:100]})
    with torchless.open(bad) as art:
        assert dict(art.tensors()) == {}
        assert any("needs" in n for n in art.package.models["model"].notes)
    assert "weights-size" in codes(bad)


def test_missing_weight_file_is_reported(pickle_pkg: Path, tmp_path: Path) -> None:
    bad = rewrite(pickle_pkg, tmp_path / "m.pt2", {"data/weights/weight_1": None})
    with torchless.open(bad) as art:
        assert "l1.bias" not in dict(art.tensors()) and "l1.weight" in dict(art.tensors())
    assert "missing-weight" in codes(bad)


def test_weights_config_shape_mismatch(pickle_pkg: Path, tmp_path: Path) -> None:
    zr = ZipReader(pickle_pkg)
    cfg = json.loads(zr.read_bytes(D + "weights_config.json"))
    cfg["emb"][1] = [4, 3]
    bad = rewrite(pickle_pkg, tmp_path / "c.pt2", {D + "weights_config.json": json.dumps(cfg).encode()})
    assert "weight" in codes(bad)


def test_weights_config_escaping_name(pickle_pkg: Path, tmp_path: Path) -> None:
    zr = ZipReader(pickle_pkg)
    cfg = json.loads(zr.read_bytes(D + "weights_config.json"))
    cfg["emb"][0] = "../../etc/passwd"
    bad = rewrite(pickle_pkg, tmp_path / "e.pt2", {D + "weights_config.json": json.dumps(cfg).encode()})
    with torchless.open(bad) as art:
        assert "emb" not in dict(art.tensors())
        assert "not a plain name" in art.package.models["model"].weight_errors["emb"]


def test_malicious_weight_pickle_is_not_executed(pickle_pkg: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = b"\x80\x02cposix\nsystem\nq\x00X" + struct.pack("<I", len(f"touch {marker}")) + f"touch {marker}".encode() + b"\x85R."
    inner = tmp_path / "inner.pt"
    w = TorchZipWriter(inner, prefix="archive")
    w.write("data.pkl", evil)
    w.close()
    bad = rewrite(pickle_pkg, tmp_path / "x.pt2", {"data/weights/weight_0": inner.read_bytes()})
    with torchless.open(bad) as art:
        err = art.package.models["model"].weight_errors["l1.weight"]
        assert "system" in err
        assert "weight" in {p.code for p in art.verify()}
    assert not marker.exists()


def test_bad_metadata_and_table(blob_pkg: Path, tmp_path: Path) -> None:
    zr = ZipReader(blob_pkg)
    cpp = zr.read_bytes(D + f"{STEM}.wrapper.cpp").decode()
    cpp = cpp.replace("constants_info_[2].data_size = 128;", "constants_info_[2].data_size = 64;")
    bad = rewrite(
        blob_pkg, tmp_path / "m.pt2", {D + f"{STEM}.wrapper_metadata.json": b"{not json", D + f"{STEM}.wrapper.cpp": cpp.encode()}
    )
    assert {"metadata", "constants"} <= codes(bad)


def test_unparsable_table_value(blob_pkg: Path, tmp_path: Path) -> None:
    zr = ZipReader(blob_pkg)
    cpp = zr.read_bytes(D + f"{STEM}.wrapper.cpp").decode().replace("shape = {3, 4}", "shape = {3, x}")
    bad = rewrite(blob_pkg, tmp_path / "u.pt2", {D + f"{STEM}.wrapper.cpp": cpp.encode()})
    with pytest.raises(TorchlessError, match="integer list"):
        torchless.open(bad)


def test_not_a_package(tmp_path: Path) -> None:
    p = tmp_path / "n.pt2"
    w = TorchZipWriter(p, prefix="n")
    w.write("archive_format", b"pt2")
    w.close()
    with pytest.raises(TorchlessError, match="no AOTInductor output"):
        read_package(p)
    assert torchless.detect(p) != "aoti"


def test_corrupt_shared_object_is_reported(blob_pkg: Path, tmp_path: Path) -> None:
    # a header that claims sections beyond the end of the file
    hdr = bytearray(64)
    hdr[:4] = b"\x7fELF"
    hdr[4], hdr[5], hdr[6] = 2, 1, 1
    struct.pack_into("<HHIQQQIHHHHHH", hdr, 16, 3, 62, 1, 0, 0, 10_000, 0, 64, 56, 0, 64, 40, 1)
    bad = rewrite(blob_pkg, tmp_path / "s.pt2", {D + f"{STEM}.wrapper.so": bytes(hdr)})
    assert "elf" in codes(bad)
    with pytest.raises(TorchlessError):
        parse_elf(b"\x7fELF\x02\x01")
    with pytest.raises(TorchlessError):
        parse_elf(b"MZ" + b"\0" * 100)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutations_raise_only_torchless_errors(data: st.DataObject, tmp_path_factory: pytest.TempPathFactory) -> None:
    base = tmp_path_factory.getbasetemp() / "mut"
    base.mkdir(exist_ok=True)
    layout = data.draw(st.sampled_from(["binary_blob", "pickle_weights", "embedded", "object"]))
    src = base / f"{layout}.pt2"
    if not src.exists():
        make_package(src, sample_consts(), layout=layout)
    raw = bytearray(src.read_bytes())
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    for _ in range(data.draw(st.integers(1, 8))):
        if raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
    try:
        pkg = read_package(bytes(raw))
        for _name, t in pkg.tensors():
            t.numpy()
        from torchless.formats.aoti.handler import _verify_model

        for m in pkg.models.values():
            _verify_model(pkg, m, set())
    except TorchlessError:
        pass


def test_verify_via_cli_exit_code(blob_pkg: Path, tmp_path: Path) -> None:
    from torchless.cli.main import main

    zr = ZipReader(blob_pkg)
    rec = D + f"{STEM}.wrapper_weights.blob"
    bad = rewrite(blob_pkg, tmp_path / "t.pt2", {rec: zr.read_bytes(rec)[:64]})
    assert main(["verify", str(blob_pkg)]) == 0
    assert main(["verify", str(bad)]) == 1
    assert os.path.exists(bad)


def test_values_roundtrip(blob_pkg: Path) -> None:
    consts = sample_consts()
    with torchless.open(blob_pkg) as art:
        for k, t in art.tensors():
            np.testing.assert_array_equal(t.numpy(), consts[k])


@pytest.mark.parametrize("layout", ["embedded", "object"])
def test_synthetic_linked_blob(tmp_path: Path, layout: str) -> None:
    """Weights between _binary_constants_bin_start/_end of a .so / .o (no compiler needed)."""
    consts = sample_consts()
    p = make_package(tmp_path / "e.pt2", consts, layout=layout)
    with torchless.open(p) as art:
        assert art.package.models["model"].weights_layout == "embedded"
        assert art.verify() == []
        for k, t in art.tensors():
            np.testing.assert_array_equal(t.numpy(), consts[k])


def test_object_symbol_with_bad_section_index() -> None:
    """Regression (found by fuzzing): a blob symbol naming no section must not hang."""
    info = parse_elf(make_elf(b"x" * 64, relocatable=True, start_shndx=999))
    assert info.blob is None


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_elf_mutations(data: st.DataObject) -> None:
    raw = bytearray(make_elf(bytes(range(192)), relocatable=data.draw(st.booleans())))
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    raw = raw[: data.draw(st.integers(0, len(raw)))]
    try:
        info = parse_elf(bytes(raw))
        if info.blob is not None:
            off, n = info.blob
            assert off >= 0 and off + n <= len(raw)
    except TorchlessError:
        pass


def test_cmake_names_missing_file(blob_pkg: Path, tmp_path: Path) -> None:
    cmake = b"target_sources(aoti_model PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/" + STEM.encode() + b".wrapper.cpp)\n"
    cmake += b"target_sources(aoti_model PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/gone.weights.o)\n"
    bad = rewrite(blob_pkg, tmp_path / "k.pt2", {D + "CMakeLists.txt": cmake})
    with torchless.open(bad) as art:
        probs = [p for p in art.verify() if p.code == "missing-file"]
    assert len(probs) == 1 and "gone.weights.o" in probs[0].message
