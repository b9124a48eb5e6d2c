"""``extract``: hostile archive names and symlinks are refused before anything is written."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from torchless.cli.main import main
from torchless.core.errors import FormatError, TorchlessError, UsageError
from torchless.formats.aoti.extract import extract_archive, safe_parts

from .synth import make_package, sample_consts


def zip_with(path: Path, entries: list[tuple[str, bytes]], *, symlink: str | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries:
            z.writestr(name, data)
        if symlink is not None:
            info = zipfile.ZipInfo(symlink)
            info.create_system = 3
            info.external_attr = 0o120777 << 16
            z.writestr(info, "/etc/passwd")
    return path


@pytest.mark.parametrize(
    "name",
    ["../evil", "pkg/../../evil", "/abs/evil", "C:/evil", "pkg\\..\\evil", "pkg//x", "pkg/./x"],
)
def test_traversal_names_refused(tmp_path: Path, name: str) -> None:
    z = zip_with(tmp_path / "z.zip", [("pkg/ok", b"1"), (name, b"2")])
    out = tmp_path / "out"
    with pytest.raises(FormatError):
        extract_archive(z, out)
    assert not out.exists() or list(out.rglob("*")) == []
    assert not (tmp_path / "evil").exists()


def test_symlink_entry_refused(tmp_path: Path) -> None:
    z = zip_with(tmp_path / "z.zip", [("pkg/ok", b"1")], symlink="pkg/link")
    with pytest.raises(FormatError, match="symbolic link"):
        extract_archive(z, tmp_path / "out")
    assert not (tmp_path / "out" / "pkg").exists()


@pytest.mark.parametrize("names", [["pkg/A.txt", "pkg/a.txt"], ["pkg/a", "pkg/a/b"]])
def test_colliding_names_refused(tmp_path: Path, names: list[str]) -> None:
    z = zip_with(tmp_path / "z.zip", [(n, b"x") for n in names])
    with pytest.raises(FormatError):
        extract_archive(z, tmp_path / "out")


def test_existing_symlink_in_outdir_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(outside, out / "pkg")
    z = zip_with(tmp_path / "z.zip", [("pkg/file", b"x")])
    with pytest.raises(UsageError):
        extract_archive(z, out, overwrite=True)
    assert list(outside.iterdir()) == []


def test_existing_file_kept_without_overwrite(tmp_path: Path) -> None:
    z = zip_with(tmp_path / "z.zip", [("pkg/file", b"new")])
    out = tmp_path / "out"
    (out / "pkg").mkdir(parents=True)
    (out / "pkg" / "file").write_bytes(b"old")
    with pytest.raises(UsageError):
        extract_archive(z, out)
    assert (out / "pkg" / "file").read_bytes() == b"old"
    extract_archive(z, out, overwrite=True)
    assert (out / "pkg" / "file").read_bytes() == b"new"


def test_crc_mismatch(tmp_path: Path) -> None:
    z = zip_with(tmp_path / "z.zip", [("pkg/file", b"hello world")])
    raw = bytearray(z.read_bytes())
    i = raw.find(b"hello world")
    raw[i] ^= 1
    z.write_bytes(bytes(raw))
    with pytest.raises(TorchlessError):
        extract_archive(z, tmp_path / "out")
    assert not (tmp_path / "out" / "pkg" / "file").exists()


def test_size_limit(tmp_path: Path) -> None:
    z = zip_with(tmp_path / "z.zip", [("pkg/file", b"x" * 100)])
    with pytest.raises(TorchlessError, match="larger than allowed"):
        extract_archive(z, tmp_path / "out", max_total_bytes=10)


def test_extract_package_strip_prefix(tmp_path: Path) -> None:
    p = make_package(tmp_path / "p.pt2", sample_consts(), layout="pickle_weights", prefix="mlp")
    out = tmp_path / "out"
    files = extract_archive(p, out, strip_prefix=True)
    with zipfile.ZipFile(p) as z:
        assert {f.member for f in files} == set(z.namelist())
        for n in z.namelist():
            assert (out / n.split("/", 1)[1]).read_bytes() == z.read(n)
    for f in files:  # never executable, whatever the archive says
        assert not os.stat(f.path).st_mode & 0o111


def test_cli_extract_refuses_traversal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    z = zip_with(tmp_path / "z.zip", [("../evil", b"x")])
    assert main(["extract", str(z), str(tmp_path / "out")]) == 2
    assert "unsafe archive member name" in capsys.readouterr().err


def test_safe_parts() -> None:
    assert safe_parts("a/b/c") == ["a", "b", "c"]
    assert safe_parts("a/b/") == ["a", "b"]
    for bad in ["", "..", "a/../b", "/a", "a\\b", "D:x", "a\0b"]:
        with pytest.raises(FormatError):
            safe_parts(bad)
