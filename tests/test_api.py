"""Public API: load / open / save / convert / detect over eager checkpoints."""

from __future__ import annotations

import io

import numpy as np
import pytest

import torchless
from torchless.core.errors import NotFoundError, TorchlessError, UnsafeGlobalError, UsageError
from torchless.pickle.globals import PickledObject


def test_detect_open_load_save(tmp_path):
    p = tmp_path / "a.pt"
    torchless.save({"w": np.arange(4, dtype=np.float32), "cfg": {"lr": 0.5}}, p)
    assert torchless.detect(p) == "pt"
    with torchless.open(p) as art:
        assert art["w"].shape == (4,)
        assert [n for n, _ in art.tensors()] == ["w"]
        assert art.info()["format"] == "pt"
        assert art.verify() == []
    obj = torchless.load(p)
    assert obj["cfg"] == {"lr": 0.5}
    np.testing.assert_array_equal(obj["w"].numpy(), np.arange(4))
    assert torchless.load(p.read_bytes())["cfg"] == {"lr": 0.5}
    st = tmp_path / "a.safetensors"
    res = torchless.convert(p, st)
    assert res == {
        "tensors": 1,
        "bytes": 16,
        "files": [str(st)],
        "object_kept": False,
        "dropped": [{"key": "cfg.lr", "type": "float"}],
    }
    assert torchless.detect(st) == "safetensors"
    np.testing.assert_array_equal(torchless.open(st)["w"].numpy(), np.arange(4))
    with pytest.raises(UsageError):
        torchless.save([1, 2], tmp_path / "b.safetensors")
    with pytest.raises(NotFoundError):
        torchless.load(tmp_path / "missing.pt")
    (tmp_path / "junk.bin").write_bytes(b"\x00" * 10)
    with pytest.raises(TorchlessError):
        torchless.load(tmp_path / "junk.bin")


def test_load_weights_only_switch(tmp_path):
    from torchless.container.zip import TorchZipWriter

    p = tmp_path / "obj.pt"
    with TorchZipWriter(p) as zw:
        zw.write("data.pkl", b"\x80\x02cmypkg.models\nNet\n)\x81}X\x01\x00\x00\x00aK\x01sb.")
        zw.write("version", b"3\n")
    with pytest.raises(UnsafeGlobalError):
        torchless.load(p)
    obj = torchless.load(p, weights_only=False)
    assert isinstance(obj, PickledObject) and obj.class_name == "mypkg.models.Net" and obj.a == 1


def test_failed_save_leaves_no_file(tmp_path):
    p = tmp_path / "x.pt"
    with pytest.raises(UsageError):
        torchless.save({"bad": object()}, p)
    assert not p.exists() and list(tmp_path.iterdir()) == []
    p.write_bytes(b"old")
    with pytest.raises(UsageError):
        torchless.save({"bad": object()}, p)
    assert p.read_bytes() == b"old"


def test_save_to_file_object_and_torch_reads_it():
    torch = pytest.importorskip("torch", reason="torch is the oracle")
    buf = io.BytesIO()
    torchless.save({"x": np.ones((2, 2), np.float16)}, buf)
    assert torch.load(io.BytesIO(buf.getvalue()), weights_only=True)["x"].dtype == torch.float16


def test_open_and_load_refuse_a_file_object_clearly():
    """A file object (or anything that is not a path) is a UsageError naming what was
    given, never a bare TypeError from deep inside detection."""
    import io

    for fn in (torchless.open, torchless.load, torchless.detect):
        with pytest.raises(torchless.UsageError, match="expected a path") as ei:
            fn(io.BytesIO(b"PK\x03\x04"))
        assert ei.value.found == "BytesIO"


def test_write_tensors_takes_a_mapping_and_refuses_bad_items_clearly(tmp_path):
    """A dict of tensors is what most callers hold: it writes like its items. A swapped
    argument order, or an entry that is not a (name, tensor) pair, is a one-line UsageError
    with a bounded description (never the repr of every tensor, never a bare ValueError),
    and nothing is left at the destination."""
    arrays = {"w": np.arange(1000, dtype=np.float32), "b": np.ones(3, np.int64)}
    torchless.write_tensors(arrays, tmp_path / "m.safetensors")
    with torchless.open(tmp_path / "m.safetensors") as a:
        got = dict(a.tensors())
        assert sorted(got) == ["b", "w"]
        np.testing.assert_array_equal(got["w"].numpy(), arrays["w"])

    with pytest.raises(torchless.UsageError, match="write_tensors\\(items, path\\)") as ei:
        torchless.write_tensors(tmp_path / "x.safetensors", arrays)
    assert len(str(ei.value)) < 300

    with pytest.raises(torchless.UsageError, match="entry 0 .* not a \\(name, tensor\\) pair"):
        torchless.write_tensors([np.zeros(2)], tmp_path / "y.safetensors")
    assert not (tmp_path / "y.safetensors").exists()


def test_error_path_is_bounded_for_non_path_values():
    """An error given something that is not a path as its path shows a bounded repr."""
    e = torchless.UsageError("bad", path={"w": np.arange(100_000)})
    assert len(str(e)) < 100


@pytest.mark.parametrize("ext", ["safetensors", "npz", "pt", "bin.index.json", "safetensors.index.json"])
def test_every_tensor_writer_refuses_two_tensors_of_one_name(tmp_path, ext):
    """Two tensors of one name, given directly or by a checkpoint whose nested keys flatten
    to one dotted name, are a UsageError in every writer; nothing is written (npz and .pt
    kept the last one silently)."""
    dst = tmp_path / f"out.{ext}"
    with pytest.raises(torchless.UsageError, match="two tensors are named 'a'"):
        torchless.write_tensors([("a", np.zeros(2)), ("a", np.ones(2))], dst)
    assert list(tmp_path.iterdir()) == []


def test_convert_refuses_names_that_collide_when_flattened(tmp_path):
    torch = pytest.importorskip("torch", reason="differential: torch writes the checkpoint")
    torch.save({"a.b": torch.zeros(2), "a": {"b": torch.ones(2)}}, tmp_path / "c.pt")
    for ext in ("safetensors", "npz"):
        with pytest.raises(torchless.UsageError, match="two tensors are named 'a.b'"):
            torchless.convert(tmp_path / "c.pt", tmp_path / f"c.{ext}")
        assert not (tmp_path / f"c.{ext}").exists()
