"""Handlers declare what they can do; the API and the CLI ask the declaration, and a
format asked for what it cannot do is refused by name, listing the formats that can."""

from __future__ import annotations

import json

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.formats.base import CAPABILITIES, Capabilities, FormatHandler, Probe
from torchless.formats.registry import FORMATS, formats_that, handler, handlers, register, require


def test_every_handler_declares_capabilities_matching_its_methods():
    assert len(handlers()) >= 11
    for h in handlers():
        assert isinstance(h, FormatHandler), h
        caps = h.capabilities
        assert isinstance(caps, Capabilities), h.name
        # the declaration and the methods agree: a declared writer is implemented, an
        # undeclared one is the base class's refusal
        assert caps.write_tensors == (type(h).write_tensors is not FormatHandler.write_tensors), h.name
        assert caps.write_objects == (type(h).save is not FormatHandler.save), h.name
        assert set(caps.flags()) <= set(CAPABILITIES)
        assert caps.read and caps.list and caps.verify, h.name


def test_public_capabilities_are_the_declarations():
    caps = torchless.capabilities()
    assert set(caps) == {h.name for h in handlers()}
    assert all(caps[h.name] is h.capabilities for h in handlers())
    assert torchless._api.writable_formats() == formats_that("write_tensors")
    # the known facts about the formats, as the issue states them
    assert caps["pt"].write_objects and caps["pt"].write_tensors
    assert not caps["npz"].write_objects and caps["npz"].write_tensors
    assert caps["onnx"].edit and caps["torchscript"].edit and not caps["pt"].edit
    # issue 36 bug 6: the README's pt2 row says "new weights, edited graph": Program.state_dict
    # takes new tensors and save_pt2 writes them (the conformance suite's edit check, torch.export.load the oracle)
    assert caps["pt2"].edit and caps["pt2"].write_objects


def test_formats_command_says_pt2_edits(capsys):
    from torchless.cli.main import main

    assert main(["formats"]) == 0
    (row,) = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("pt2 ")]
    assert row[:7] == ["pt2", "yes", "yes", "yes", "-", "yes", "yes"], row


def test_a_wrong_declaration_is_refused_at_registration():
    class Liar(FormatHandler):
        name = "liar-h4"
        capabilities = Capabilities(write_tensors=True)  # but no write_tensors method

        def sniff(self, probe: Probe) -> bool:
            return False

    class Hider(FormatHandler):
        name = "hider-h4"
        capabilities = Capabilities()  # but it writes objects

        def sniff(self, probe: Probe) -> bool:
            return False

        def save(self, obj, path, *, progress=None):
            pass

    for cls in (Liar, Hider):
        with pytest.raises(TypeError, match="declared"):
            register(cls)
        assert cls.name not in FORMATS
    with pytest.raises(TypeError, match="Capabilities"):
        register(object())


def test_saving_an_object_to_a_tensor_format_names_the_formats_that_store_objects(tmp_path):
    able = [h.name for h in handlers() if h.capabilities.write_objects]
    assert able  # derived from the declarations, not written down here
    with pytest.raises(torchless.UsageError) as ei:
        torchless.save([1, 2], tmp_path / "x.npz")
    msg = str(ei.value)
    assert "npz cannot store objects" in msg
    assert f"formats that can: {', '.join(able)}" in msg
    assert not (tmp_path / "x.npz").exists()


@pytest.mark.parametrize("dst", ["m.onnx", "m.pt2", "m.ptl"])
def test_writing_tensors_to_a_format_that_cannot_names_the_ones_that_can(tmp_path, dst):
    with pytest.raises(torchless.UsageError) as ei:
        torchless.write_tensors([("w", np.zeros(2, np.float32))], tmp_path / dst)
    msg = str(ei.value)
    assert "cannot write tensors" in msg
    for name in formats_that("write_tensors"):
        assert name in msg
    assert not (tmp_path / dst).exists()


def test_an_undeclared_writer_refuses_when_called_directly(tmp_path):
    h = handler("onnx")
    with pytest.raises(torchless.UsageError, match="onnx cannot write tensors"):
        h.write_tensors([], tmp_path / "x.onnx")
    with pytest.raises(torchless.UsageError, match="onnx cannot store objects"):
        h.save({}, tmp_path / "x.onnx")
    assert require(handler("pt"), "write_objects") is handler("pt")
    with pytest.raises(ValueError, match="unknown capability"):
        require(h, "fly")


def test_cli_formats_lists_the_declarations(capsys):
    assert main(["formats", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by = {r["name"]: r for r in rows}
    assert set(by) == {h.name for h in handlers()}
    for h in handlers():
        for c in CAPABILITIES:
            assert by[h.name][c] == getattr(h.capabilities, c), (h.name, c)
        assert set(h.capabilities.open_options) <= set(by[h.name]["open_options"])
        assert "weights_only" in by[h.name]["open_options"]
    assert main(["formats"]) == 0
    text = capsys.readouterr().out
    assert "write objects" in text
    for h in handlers():
        assert h.name in text
