"""Each carrier is an analysis object of its own, run by the scan engine: one can be made on
an engine and run alone on a byte source, and what it finds lands in that engine's report
(issue 35: the scanner's carriers were mixins of one class sharing ``self``)."""

from __future__ import annotations

import io
import lzma
import pickle
import tarfile
import zipfile

import pytest

from torchless.io.source import BytesSource
from torchless.scan.carriers import (
    Carrier,
    CompressedCarrier,
    DcpCarrier,
    NestedCarrier,
    NumpyCarrier,
    OnnxCarrier,
    PickleCarrier,
    ScanEngine,
    Scanner,
    TarCarrier,
    ZipCarrier,
    scan_file,
)
from torchless.scan.carriers.recognize import compressor_of

_EVIL = b"cos\nsystem\n(S'echo hi'\ntR."  # protocol 0: os.system("echo hi")


def _engine(tmp_path, data: bytes, name: str = "f.bin") -> tuple[ScanEngine, BytesSource]:
    p = tmp_path / name
    p.write_bytes(data)
    return ScanEngine(str(p)), BytesSource(data, name)


def _rules(engine: ScanEngine) -> set[str]:
    return {f.rule for f in engine.report.findings}


def test_the_engine_makes_one_object_per_carrier(tmp_path):
    e = ScanEngine(str(tmp_path / "x"))
    carriers = {
        "pickles": PickleCarrier,
        "nested": NestedCarrier,
        "zips": ZipCarrier,
        "tar": TarCarrier,
        "dcp": DcpCarrier,
        "numpy": NumpyCarrier,
        "onnx": OnnxCarrier,
        "compressed": CompressedCarrier,
    }
    for attr, cls in carriers.items():
        c = getattr(e, attr)
        assert type(c) is cls and isinstance(c, Carrier) and c.engine.report is e.report
        assert not isinstance(c, ScanEngine)  # a carrier is not the scanner (no mixin)
        assert e.carrier(cls) is c  # what another carrier asks the engine for
    assert Scanner is ScanEngine


def test_zip_carrier_alone_reports_a_duplicate_member(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z, pytest.warns(UserWarning, match="Duplicate name"):
        z.writestr("a/data.pkl", pickle.dumps({"x": 1}))
        z.writestr("a/data.pkl", pickle.dumps({"x": 2}))
    e, src = _engine(tmp_path, buf.getvalue(), "dup.zip")
    ZipCarrier(e).scan_zip(src, None, 0, 0)
    assert "zip-duplicate" in _rules(e)
    assert all(f.loader for f in e.report.findings)  # the walker names the loader it models


def test_tar_carrier_alone_reports_an_escaping_name_and_the_payload(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("../evil.pkl")
        info.size = len(_EVIL)
        t.addfile(info, io.BytesIO(_EVIL))
    e, src = _engine(tmp_path, buf.getvalue(), "evil.tar")
    TarCarrier(e).scan_tar(src, None, 0, 0)
    rules = _rules(e)
    assert "path-traversal" in rules
    # the member's bytes went back to the engine's dispatch, which found the pickle
    assert any(f.global_name == "os.system" for f in e.report.findings), sorted(rules)


def test_compressed_carrier_alone_hands_the_stream_back_to_the_engine(tmp_path):
    data = lzma.compress(_EVIL)
    e, src = _engine(tmp_path, data, "evil.xz")
    kind, who = compressor_of(data)
    assert CompressedCarrier(e).scan_compressed(src, kind, None, 0, who=who)
    assert any(f.global_name == "os.system" and f.severity in ("critical", "high") for f in e.report.findings)


def test_a_carrier_alone_finds_what_the_whole_scan_finds(tmp_path):
    e, src = _engine(tmp_path, _EVIL, "evil.pkl")
    PickleCarrier(e).scan_pickles(src, None, 0, 0, strict=True)
    alone = {(f.rule, f.severity, f.global_name) for f in e.report.findings}
    whole = {(f.rule, f.severity, f.global_name) for f in scan_file(str(tmp_path / "evil.pkl")).findings}
    assert ("dangerous-global", "critical", "os.system") in alone
    assert {g for _r, _s, g in alone if g} == {g for _r, _s, g in whole if g} == {"os.system"}
