"""No reader follows a path or symlink out of its artifact (issue 10, root cause 5).

For every format that reads sibling files (DCP ``.distcp`` files named by ``.metadata``,
the ``.metadata`` itself, DCP-sharded safetensors folders, ONNX external data), a
symbolic link, a ``../`` name and an absolute name that point outside the artifact are
refused by ``torchless.load``, ``open``, ``info``, ``ls`` (CLI) and ``convert``; the outside
file is a FIFO, so any attempt to open it would block: each call runs in a thread with a
deadline, and a writer-side probe proves no reader ever opened the FIFO.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import os
import threading
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import numpy as np
import pytest

import torchless
from torchless import LinkEscapeError, TorchlessError
from torchless.io.paths import confine, confined_file

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs and symlinks")


# -- the helper itself ------------------------------------------------------------------
def test_confine_rules(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"x")
    (tmp_path / "out").write_bytes(b"secret")
    os.symlink("f", tmp_path / "a" / "inside")
    os.symlink(tmp_path / "out", tmp_path / "a" / "outside")
    os.symlink("..", tmp_path / "a" / "up")
    root = tmp_path / "a"
    assert confine(root, "f") == os.path.realpath(root / "f")
    assert confine(root, "inside") == os.path.realpath(root / "f")
    for bad in ["outside", "../out", str(tmp_path / "out"), "", "f\x00", "C:\\x", "\\\\srv\\x"]:
        with pytest.raises(LinkEscapeError):
            confine(root, bad)
    with pytest.raises(LinkEscapeError):  # a plain name is required unless subdirs
        confine(root, "up/out")
    with pytest.raises(LinkEscapeError, match="symlink escape"):
        confine(root, "up/out", subdirs=True)
    # the artifact's folder itself may be reached through a link
    os.symlink(root, tmp_path / "alias")
    assert confine(tmp_path / "alias", "inside") == os.path.realpath(root / "f")
    os.mkfifo(root / "pipe")
    with pytest.raises(TorchlessError, match="not a regular file"):
        confined_file(root, "pipe")


# -- building artifacts that point outside ----------------------------------------------
def _outside_fifo(tmp_path) -> str:
    p = str(tmp_path / "outside.fifo")
    os.mkfifo(p)
    return p


def _nobody_opened(fifo: str) -> bool:
    """True unless a reader is blocked in open() on the FIFO (then it is released)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        return e.errno == errno.ENXIO  # no reader has it open
    os.close(fd)  # a reader was waiting: it now sees EOF and goes on
    return False


def _call(fn: Callable[[], Any], fifo: str) -> tuple[Any, BaseException | None]:
    out: list[Any] = [None, None]

    def run() -> None:
        try:
            out[0] = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            out[1] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)
    opened = t.is_alive() or not _nobody_opened(fifo)
    t.join(5)
    assert not opened, "the outside file was opened"
    return out[0], out[1]


def _dcp(tmp_path) -> str:
    from torchless import dcp

    src = tmp_path / "model.pt"
    torchless.save({"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(3, dtype=np.float32)}, str(src))
    d = tmp_path / "ckpt"
    dcp.reshard(str(src), str(d), 1)
    assert sorted(os.listdir(d)) == [".metadata", "__0_0.distcp"]
    return str(d)


def _dcp_renamed(d: str, new: str) -> None:
    from torchless.formats.dcp.metadata import dump_metadata, read_metadata

    md = read_metadata(d)
    md.storage_data = {k: dataclasses.replace(v, relative_path=new) for k, v in md.storage_data.items()}
    with open(os.path.join(d, ".metadata"), "wb") as f:
        f.write(dump_metadata(md))


def _case_dcp_symlink(tmp_path, fifo):
    d = _dcp(tmp_path)
    os.remove(os.path.join(d, "__0_0.distcp"))
    os.symlink(fifo, os.path.join(d, "__0_0.distcp"))
    return d


def _case_dcp_dotdot(tmp_path, fifo):
    d = _dcp(tmp_path)
    _dcp_renamed(d, "../" + os.path.basename(fifo))
    return d


def _case_dcp_absolute(tmp_path, fifo):
    d = _dcp(tmp_path)
    _dcp_renamed(d, fifo)
    return d


def _case_dcp_metadata_symlink(tmp_path, fifo):
    d = _dcp(tmp_path)
    os.remove(os.path.join(d, ".metadata"))
    os.symlink(fifo, os.path.join(d, ".metadata"))
    return d


def test_symlinked_metadata_to_a_regular_file_is_refused(tmp_path):
    d = _dcp(tmp_path)
    os.rename(os.path.join(d, ".metadata"), tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", os.path.join(d, ".metadata"))
    with pytest.raises(LinkEscapeError, match="DCP metadata file"):
        torchless.load(d)


def _case_dcp_linked_dir(tmp_path, fifo):
    # a storage file reached through a linked folder: a plain name is required
    d = _dcp(tmp_path)
    os.symlink(tmp_path, os.path.join(d, "up"))
    _dcp_renamed(d, "up/" + os.path.basename(fifo))
    return d


def _case_hf_symlink(tmp_path, fifo):
    d = tmp_path / "hf"
    d.mkdir()
    torchless.save({"w": np.ones(4, dtype=np.float32)}, str(d / "model-00001-of-00002.safetensors"))
    os.symlink(fifo, d / "model-00002-of-00002.safetensors")
    return str(d)


def _onnx(tmp_path, location: str, link: str | None = None) -> str:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    d = tmp_path / "model"
    d.mkdir()
    t = TensorProto()
    t.name = "w"
    t.data_type = TensorProto.FLOAT
    t.dims.extend([4])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("length", "16")):
        e = t.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [t]
    )
    p = str(d / "model.onnx")
    onnx.save(helper.make_model(g), p)
    if link is not None:
        os.symlink(link, d / location)
    return p


CASES = {
    "dcp-symlink": _case_dcp_symlink,
    "dcp-dotdot": _case_dcp_dotdot,
    "dcp-absolute": _case_dcp_absolute,
    "dcp-metadata-symlink": _case_dcp_metadata_symlink,
    "dcp-linked-dir": _case_dcp_linked_dir,
    "dcp-hf-symlink": _case_hf_symlink,
    "onnx-symlink": lambda tmp, fifo: _onnx(tmp, "w.bin", link=fifo),
    "onnx-dotdot": lambda tmp, fifo: _onnx(tmp, "../" + os.path.basename(fifo)),
    "onnx-absolute": lambda tmp, fifo: _onnx(tmp, fifo),
}


def _cli(*argv: str) -> int:
    from torchless.cli.main import main

    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as err:
        rc = main(list(argv))
    assert "Traceback" not in err.getvalue()
    return rc


def _ops(path: str, tmp_path) -> dict[str, Callable[[], Any]]:
    def open_and_read() -> None:
        with torchless.open(path) as art:
            for _n, t in art.tensors():
                t.numpy()

    def info() -> None:
        with torchless.open(path) as art:
            art.info()

    return {
        "load": lambda: torchless.load(path),
        "open": open_and_read,
        "info": info,
        "convert": lambda: torchless.convert(path, str(tmp_path / "out.safetensors")),
        "cli-ls": lambda: _cli("ls", path),
        "cli-info": lambda: _cli("info", path),
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_reader_leaves_the_artifact(tmp_path, case):
    fifo = _outside_fifo(tmp_path)
    path = CASES[case](tmp_path, fifo)
    for op, fn in _ops(path, tmp_path).items():
        rc, err = _call(fn, fifo)
        if op.startswith("cli-"):
            assert err is None and rc == 2, f"{op} on {case}: exit {rc}, {err!r}"
            continue
        assert isinstance(err, TorchlessError), f"{op} on {case}: {err!r}"
        if case != "dcp-metadata-symlink":  # (a FIFO .metadata is not even detected as DCP)
            assert isinstance(err, LinkEscapeError), f"{op} on {case}: {err!r}"
        assert not os.path.exists(tmp_path / "out.safetensors")


def test_links_inside_the_artifact_are_read(tmp_path):
    d = _dcp(tmp_path)
    os.rename(os.path.join(d, "__0_0.distcp"), os.path.join(d, "data.bin"))
    os.symlink("data.bin", os.path.join(d, "__0_0.distcp"))
    sd = torchless.load(d)
    assert sd["w"].numpy().tolist() == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()


@pytest.mark.parametrize("case", ["dcp-symlink", "dcp-hf-symlink", "onnx-symlink", "dcp-metadata-symlink"])
def test_scan_reports_links_out_of_the_folder(tmp_path, case):
    fifo = _outside_fifo(tmp_path)
    path = CASES[case](tmp_path, fifo)
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    rep, err = _call(lambda: torchless.scan(folder, jobs=1), fifo)
    assert err is None, err
    escapes = [f for fr in rep.files for f in fr.findings if f.rule == "link-escape"]
    assert escapes and rep.exit_code != 0
