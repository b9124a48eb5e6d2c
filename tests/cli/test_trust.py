"""Commands do what they say or refuse clearly (issue 11: items 6, 8, 10, 12, 13, 19)."""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.core.tensor import Tensor
from torchless.diff import compare_tensors, diff_artifacts

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "samples")


def s(name: str) -> str:
    return os.path.abspath(os.path.join(SAMPLES, name))


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# -- item 6: same-format convert keeps the object; lossy conversion names what it drops ------
def test_pt_to_pt_keeps_the_whole_object(capsys, tmp_path, torch):
    src = tmp_path / "ckpt.pt"
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    torch.save(
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 7, "config": {"name": "x", "layers": [3, 2]}}, src
    )
    dst = tmp_path / "copy.pt"
    code, out, err = run(capsys, "convert", src, dst)
    assert code == 0 and err == "" and "whole object kept" in out
    got = torch.load(dst, weights_only=True)
    assert got["epoch"] == 7 and got["config"] == {"name": "x", "layers": [3, 2]}
    assert got["optimizer"]["param_groups"][0]["lr"] == 0.01
    assert torch.equal(got["model"]["weight"], model.weight.detach())


def test_lossy_conversion_names_what_it_drops_and_strict_refuses(capsys, tmp_path, torch):
    src = tmp_path / "ckpt.pt"
    torch.save({"w": torch.ones(2), "epoch": 3, "config": {"lr": 0.5}}, src)
    dst = tmp_path / "w.safetensors"
    code, out, err = run(capsys, "convert", src, dst, "--json")
    res = json.loads(out)
    assert code == 0 and res["tensors"] == 1
    assert {d["key"] for d in res["dropped"]} == {"epoch", "config.lr"}
    code, out, err = run(capsys, "convert", src, tmp_path / "w2.safetensors")
    assert code == 0 and "dropped 2 values" in err and "epoch" in err and "config.lr" in err
    code, out, err = run(capsys, "convert", src, tmp_path / "w3.safetensors", "--strict")
    assert code == 2 and "would drop 2" in err and not (tmp_path / "w3.safetensors").exists()
    # DCP folders: the non-tensor values are named too
    code, out, err = run(capsys, "convert", s("dcp_ckpt"), tmp_path / "d.safetensors", "--strict")
    assert code == 2 and "step" in err
    code, out, err = run(capsys, "convert", s("dcp_ckpt"), tmp_path / "d.safetensors", "--json")
    assert "step" in {d["key"] for d in json.loads(out)["dropped"]}


def test_safetensors_to_safetensors_keeps_metadata(tmp_path):
    from torchless.formats.safetensors import write_safetensors

    src = tmp_path / "a.safetensors"
    write_safetensors([("w", np.ones(3, np.float32))], src, metadata={"format": "pt", "note": "x"})
    res = torchless.convert(src, tmp_path / "b.safetensors")
    assert res["object_kept"] and res["dropped"] == []
    assert torchless.open(tmp_path / "b.safetensors").metadata == {"format": "pt", "note": "x"}
    res = torchless.convert(src, tmp_path / "b.npz")
    assert res["dropped"] == [{"key": "__metadata__", "type": "dict"}]


# -- item 8: options that do not apply are errors ------------------------------------------
def test_option_that_does_not_apply_is_an_error(capsys, tmp_path):
    code, _out, err = run(capsys, "convert", s("state_dict.pt"), tmp_path / "x.pt", "--max-shard-size", "1MB")
    assert code == 2 and "max_shard_size" in err and "pt files" in err
    assert not (tmp_path / "x.pt").exists()
    code, _out, err = run(capsys, "convert", s("dcp_ckpt"), tmp_path / "y.pt", "--max-shard-size", "1MB")
    assert code == 2 and not (tmp_path / "y.pt").exists()
    with pytest.raises(torchless.UsageError, match="max_shard_size"):
        torchless.write_tensors([("w", np.ones(2))], tmp_path / "z.npz", max_shard_size="1MB")


def test_to_lists_only_writable_formats(capsys, tmp_path):
    from torchless._api import writable_formats
    from torchless.cli.main import build_parser

    assert {"pt", "safetensors", "npz"} <= set(writable_formats())
    assert not {"onnx", "pt2", "torchscript", "aoti", "dcp"} & set(writable_formats())
    conv = build_parser()._subparsers._group_actions[0].choices["convert"]
    to = next(a for a in conv._actions if "--to" in a.option_strings)
    assert set(to.metavar.strip("{}").split(",")) == set(writable_formats())  # the help lists exactly these
    code, _out, err = run(capsys, "convert", s("state_dict.pt"), tmp_path / "x.onnx")
    assert code == 2 and "onnx cannot write tensors" in err and "safetensors" in err


def test_sharded_output_message_names_a_file_that_exists(capsys, tmp_path):
    dst = tmp_path / "m.safetensors"
    code, out, _err = run(capsys, "convert", s("state_dict.pt"), dst, "--max-shard-size", "10KB")
    assert code == 0
    named = out.split("wrote ", 1)[1].split(" ", 1)[0].rstrip(":")
    assert os.path.exists(named) and named.endswith(".index.json")


# -- item 10: diff never counts what it could not compare as the same ----------------------
class _Art:
    format = "safetensors"  # a tensor file with no metadata: nothing but tensors to compare
    metadata = None

    def __init__(self, items):
        self.items = items

    def tensors(self):
        return iter(self.items.items())


def test_diff_reports_not_compared_and_fails(capsys, tmp_path):
    ok = torchless.tensor(np.arange(4, dtype=np.float32))
    meta = Tensor(None, ok.dtype, (4,))
    res = diff_artifacts(_Art({"a": ok, "m": meta}), _Art({"a": ok, "m": meta}))
    assert res["same"] == 1 and [c["name"] for c in res["not_compared"]] == ["m"] and not res["identical"]


def test_diff_values_exact():
    def t(a):
        return torchless.tensor(np.asarray(a))

    big = 2**60
    assert compare_tensors(t([big]), t([big + 1]))["status"] == "changed"  # beyond float64's precision
    assert compare_tensors(t([np.nan, 1.0]), t([np.nan, 1.0]))["status"] == "same"
    assert compare_tensors(t([np.nan]), t([1.0]))["status"] == "changed"  # NaN on one side only
    assert compare_tensors(t([np.inf]), t([-np.inf]))["status"] == "changed"
    assert compare_tensors(t([1.0, 2.0]), t([1.0, 2.001]), atol=0.01)["status"] == "same"


def test_diff_cli_exit_code_and_progress(capsys, tmp_path, monkeypatch):
    import torchless.diff as d

    monkeypatch.setattr(d, "CHUNK_ELEMENTS", 64)  # many chunks: progress advances per chunk
    code, out, err = run(capsys, "diff", s("checkpoint.pt"), s("checkpoint.pt"), "--progress")
    assert code == 0 and out.startswith("0 added") and "diff [" in err and "100.0%" in err  # on stderr only
    code, out, err = run(capsys, "diff", s("checkpoint.pt"), s("checkpoint.pt"))
    assert err == ""  # no progress when stderr is not a terminal


# -- item 12: verify checks every checksum -------------------------------------------------
def test_verify_catches_a_flipped_byte_inside_npz(capsys, tmp_path):
    p = tmp_path / "a.npz"
    np.savez(p, w=np.arange(1000, dtype=np.float32))
    assert run(capsys, "verify", p)[0] == 0
    data = bytearray(p.read_bytes())
    with zipfile.ZipFile(p) as z:
        info = z.getinfo("w.npy")
    data[info.header_offset + 30 + len("w.npy") + 200] ^= 0x10  # inside the array's bytes
    p.write_bytes(bytes(data))
    with pytest.raises(zipfile.BadZipFile), np.load(p) as z:  # NumPy's own CRC check catches it
        z["w"]
    code, out, _err = run(capsys, "verify", p)
    assert code == 1 and "crc" in out.lower()


def test_verify_pt_crc(capsys, tmp_path, torch):
    p = tmp_path / "m.pt"
    torch.save({"w": torch.arange(100, dtype=torch.float32)}, p)
    data = bytearray(p.read_bytes())
    i = data.index(np.arange(100, dtype=np.float32).tobytes()[40:48])
    data[i] ^= 1
    p.write_bytes(bytes(data))
    code, out, _err = run(capsys, "verify", p)
    assert code == 1 and "CRC-32" in out


def test_verify_counts_info_lines_as_notes_not_warnings(capsys):
    from torchless.core.findings import Problem

    class Art:
        format = "x"

        def verify(self):
            return [Problem("a", "m", None, None, "info"), Problem("b", "m", None, None, "warning")]

        def __enter__(self):
            return self

        def __exit__(self, *a):
            pass

    import torchless.cli.commands.generic as g

    orig = g._open
    g._open = lambda p, f: Art()
    try:
        code, out, _ = run(capsys, "verify", "x")
    finally:
        g._open = orig
    assert code == 0 and "(0 errors, 1 warnings, 1 notes)" in out


# -- item 13: the wrong kind of input says so ----------------------------------------------
@pytest.mark.parametrize(
    "argv, fits",
    [
        (["code", s("state_dict.pt")], "torchless info"),
        (["graph", s("mlp.onnx")], "torchless onnx graph"),
        (["onnx", "graph", s("mlp.pt2")], "torchless graph"),
        (["ts", "tensors", s("mlp.pt2")], "torchless graph"),
    ],
)
def test_wrong_kind_of_input_names_the_command_that_fits(capsys, argv, fits):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and fits in err


def test_cache_missing_folder_and_relative_show(capsys, tmp_path, monkeypatch):
    code, _out, err = run(capsys, "cache", tmp_path / "missing")
    assert code == 2 and "no such cache folder" in err
    key = "ccoovis4cdmj6x2qu6gyp4gcxoiroifocszxduniryqmwavjdeib"
    k = tmp_path / "cache" / key[1:3] / f"{key}.py"
    k.parent.mkdir(parents=True)
    k.write_text("import triton\n\n@triton.jit\ndef triton_poi_fused_add_0(x):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "cache", "cache", "--show", f"cache/{key[1:3]}/{key}.py")
    assert code == 0 and "triton_poi_fused_add_0" in out, err


# -- item 19: empty and truncated files -----------------------------------------------------
def test_empty_and_truncated_files_say_so(capsys, tmp_path):
    e = tmp_path / "e.pt"
    e.write_bytes(b"")
    code, _out, err = run(capsys, "info", e)
    assert code == 2 and "empty" in err
    t = tmp_path / "t.pt"
    t.write_bytes(open(s("state_dict.pt"), "rb").read()[:3000])
    code, _out, err = run(capsys, "info", t)
    assert code == 2 and "truncated" in err


def test_extract_twice_names_the_option(capsys, tmp_path):
    out = tmp_path / "x"
    assert run(capsys, "extract", s("mlp_aoti.pt2"), out)[0] == 0
    code, _o, err = run(capsys, "extract", s("mlp_aoti.pt2"), out)
    assert code == 2 and "--overwrite" in err
    assert "--force" in err  # the one option every command that writes takes (issue 36 item 9)
    assert run(capsys, "extract", s("mlp_aoti.pt2"), out, "--overwrite")[0] == 0
    assert run(capsys, "extract", s("mlp_aoti.pt2"), out, "--force")[0] == 0


class Cfg:  # pickled by reference: torchless sees an unknown class (never imported)
    def __init__(self) -> None:
        self.lr = 0.1


def test_pt_with_unknown_classes_to_pt_says_what_it_drops(capsys, tmp_path, torch):
    src = tmp_path / "full.pt"
    torch.save({"w": torch.ones(2), "cfg": Cfg()}, src)
    dst = tmp_path / "out.pt"
    code, out, err = run(capsys, "convert", src, dst, "--strict")
    assert code == 2 and "allowlist" in err and not dst.exists()
    code, out, err = run(capsys, "convert", src, dst, "--json")
    res = json.loads(out)
    assert code == 0 and not res["object_kept"] and "Cfg" in res["dropped"][0]["type"]
    assert torch.equal(torch.load(dst, weights_only=True)["w"], torch.ones(2))


def test_npz_other_members_are_named_when_dropped(tmp_path):
    p = tmp_path / "a.npz"
    with zipfile.ZipFile(p, "w") as z:
        import io

        b = io.BytesIO()
        np.save(b, np.arange(3))
        z.writestr("w.npy", b.getvalue())
        z.writestr("notes.txt", b"hello")
    res = torchless.convert(p, tmp_path / "b.safetensors")
    assert res["dropped"] == [{"key": "notes.txt", "type": "bytes"}]
    with pytest.raises(torchless.UsageError, match="notes.txt"):
        torchless.convert(p, tmp_path / "c.npz", strict=True)
