"""``hf://`` URLs through huggingface_hub's HfFileSystem, against a local stand-in for the
Hub (tests/remote/hub.py: the revision, tree, paths-info and resolve endpoints, on
127.0.0.1). Not the real Hub: the machine the tests run on has no network.

Oracles: the local copy of each file (the CLI prints the same, convert writes the same
bytes), torch and safetensors (what they wrote), and the stand-in's count of the bytes it
sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import torchless
from torchless.io import remote

from .hub import Hub
from .test_remote import _cli

torch = pytest.importorskip("torch", reason="torch is the oracle of these tests")
pytest.importorskip("huggingface_hub", reason="the remote extra (huggingface_hub) is not installed")
st = pytest.importorskip("safetensors.torch", reason="safetensors writes the oracle files")

REPO = "user/repo"
FILES = ("model.safetensors", "sharded/model.safetensors.index.json", "torch.pt")


def _make_repo(folder) -> dict:
    """model.safetensors, a two-shard safetensors checkpoint with its index (written by
    safetensors), and a torch.save'd .pt with a 4 MiB tensor."""
    g = torch.Generator().manual_seed(3)
    folder.mkdir(parents=True)
    sd = {
        "emb.weight": torch.randn(300, 16, generator=g),
        "fc.bias": torch.arange(7),
        "h": torch.randn(5, 3, generator=g).to(torch.bfloat16),
    }
    st.save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "sharded").mkdir()
    shards = {
        "model-00001-of-00002.safetensors": {"a": torch.randn(256, 256, generator=g)},
        "model-00002-of-00002.safetensors": {"b": torch.ones(10, dtype=torch.float16), "c": torch.arange(12).reshape(3, 4)},
    }
    weight_map = {}
    for name, part in shards.items():
        st.save_file(part, str(folder / "sharded" / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    total = sum(t.numel() * t.element_size() for part in shards.values() for t in part.values())
    (folder / "sharded" / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    big = {"big": torch.randn(1 << 20, generator=g), "small": torch.arange(5, dtype=torch.int32)}
    torch.save(big, folder / "torch.pt")
    return {"model.safetensors": sd, "torch.pt": big}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """``(local repo folder, Hub, the tensors the files hold)``: the stand-in serving ``user/repo``; HfFileSystem
    instances opened in the test reach it (the endpoint HF_ENDPOINT would give)."""
    import huggingface_hub.constants
    from huggingface_hub import HfFileSystem

    root = tmp_path / "hub"
    made = _make_repo(root / REPO)
    with Hub(str(root)) as h:
        # what huggingface_hub.constants derives from HF_ENDPOINT when it is imported
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", h.endpoint)
        monkeypatch.setattr(
            huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", h.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
        )
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        HfFileSystem.clear_instance_cache()
        yield root / REPO, h, made
        HfFileSystem.clear_instance_cache()


def _same(a: tuple[int, str, str], b: tuple[int, str, str], local: str, url: str) -> None:
    assert a[0] == b[0] == 0, (a, b)
    assert a[1].replace(local, "<p>").replace(os.path.dirname(local), "<d>") == b[1].replace(url, "<p>").replace(
        url.rsplit("/", 1)[0], "<d>"
    )


@pytest.mark.parametrize("name", FILES)
def test_hf_cli_matches_local(hub, capsys, name):
    """info / ls / verify / scan (text and JSON) and diff of an hf:// file print what they
    print for the local copy."""
    folder, _h, _made = hub
    local, url = str(folder / name), f"hf://{REPO}/{name}"
    for cmd in (["info"], ["ls"], ["verify"], ["scan"], ["info", "--json"], ["ls", "--json"]):
        _same(_cli(capsys, *cmd, local), _cli(capsys, *cmd, url), local, url)
    code, out, err = _cli(capsys, "diff", local, url)
    assert code == 0 and "0 changed" in out, (out, err)


@pytest.mark.parametrize("name", FILES)
def test_hf_convert_to_local_is_bit_exact(hub, capsys, tmp_path, name):
    """convert from hf:// writes the bytes convert of the local copy writes, and they hold
    the tensors torch / safetensors wrote."""
    folder, _h, _made = hub
    outs = []
    for i, src in enumerate((str(folder / name), f"hf://{REPO}/{name}")):
        dst = tmp_path / f"out{i}" / "conv.safetensors"
        dst.parent.mkdir()
        code, _out, err = _cli(capsys, "convert", src, str(dst))
        assert code == 0, err
        outs.append({p.name: p.read_bytes() for p in dst.parent.iterdir()})
    assert outs[0] == outs[1] and outs[0]
    if name in _made:
        got = st.load(outs[1]["conv.safetensors"])
        for k, t in _made[name].items():
            assert torch.equal(got[k], t), k


def test_hf_info_fetches_metadata_only(hub, capsys):
    """info / ls of the .pt (a 4 MiB tensor) fetch a small part of it, by the stand-in's
    count; a tensor's numpy() fetches that tensor's range (not the 5 MiB blocks
    HfFileSystem's buffered files read ahead by default)."""
    folder, h, made = hub
    size = os.path.getsize(folder / "torch.pt")
    for cmd in ("info", "ls"):
        h.reset()
        code, _out, err = _cli(capsys, cmd, f"hf://{REPO}/torch.pt", "--stats")
        assert code == 0, err
        assert 0 < h.sent < min(size // 8, 1 << 19), (cmd, h.sent, size)
        assert f"{h.sent} bytes fetched" in err  # --stats counts what the stand-in sent
    remote.SHARED_BLOCKS.clear()
    with torchless.open(f"hf://{REPO}/torch.pt") as art:
        h.reset()
        small = art["small"].numpy()
        assert h.sent <= 1 << 16 and h.counts["resolve"] <= 1  # at most one block (it may be cached already)
        h.reset()
        big = art["big"].numpy()
        assert h.sent == 4 << 20 and h.counts["resolve"] == 1  # exactly its storage, once
    assert np.array_equal(small, np.arange(5, dtype=np.int32))
    assert big.tobytes() == made["torch.pt"]["big"].numpy().tobytes()


def test_hf_safetensors_header_only(hub, capsys):
    folder, h, made = hub
    h.reset()
    code, out, err = _cli(capsys, "ls", f"hf://{REPO}/sharded/model.safetensors.index.json", "--stats")
    assert code == 0, err
    assert "a" in out and h.counts["resolve"] <= 3  # the index, then one block of each shard
    assert h.sent < sum(p.stat().st_size for p in (folder / "sharded").iterdir())


def test_hf_write_is_refused(hub, capsys):
    """An output at hf:// is one line (exit 2) and nothing is sent to the Hub."""
    folder, h, made = hub
    h.reset()
    for argv in (
        ["convert", str(folder / "torch.pt"), f"hf://{REPO}/out.safetensors"],
        ["convert", str(folder / "torch.pt"), f"hf://{REPO}/out.pt"],
    ):
        code, out, err = _cli(capsys, *argv)
        assert code == 2 and "cannot write to hf://" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) <= 2, err  # the error and its hint
    assert h.counts["refused"] == 0 and not (folder / "out.safetensors").exists()
    with pytest.raises(torchless.UsageError, match="cannot write to hf://"):
        torchless.save({"x": np.zeros(2, np.float32)}, f"hf://{REPO}/x.safetensors")


def test_hf_missing(hub, capsys):
    """A missing file or repo is one not-found line, not a traceback."""
    for url in (f"hf://{REPO}/nope.safetensors", "hf://user/nothere/model.safetensors"):
        code, _out, err = _cli(capsys, "info", url)
        assert code == 2 and "Traceback" not in err and err.strip(), err


def test_hf_endpoint_environment(hub, tmp_path):
    """A new process reaches the Hub HF_ENDPOINT names (read when huggingface_hub is
    imported), as a user's shell would set it."""
    folder, h, made = hub
    env = dict(os.environ)
    src = os.path.join(os.path.dirname(torchless.__file__), os.pardir)
    env["PYTHONPATH"] = os.path.abspath(src) + os.pathsep + env.get("PYTHONPATH", "")
    env["HF_ENDPOINT"] = h.endpoint
    outs = []
    for p in (str(folder / "model.safetensors"), f"hf://{REPO}/model.safetensors"):
        r = subprocess.run(
            [sys.executable, "-m", "torchless", "ls", "--json", p],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout.replace(p, "<p>"))
    assert outs[0] == outs[1]
