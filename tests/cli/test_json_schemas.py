"""Every command's ``--json`` output validated against its documented schema
(``torchless.cli.schemas``), on the committed samples of every format."""

from __future__ import annotations

import json
import os

import pytest

from torchless.cli.main import build_parser, main
from torchless.cli.schemas import SCHEMAS, SchemaError, validate

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "samples")


def s(name: str) -> str:
    return os.path.abspath(os.path.join(SAMPLES, name))


def run_json(capsys, *argv) -> object:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert code in (0, 1), (argv, out.err)
    return json.loads(out.out)


def _cases(tmp: str) -> list[tuple[str, list[str]]]:
    """(schema name, argv) for every command that takes --json, on every sample kind."""
    return [
        *[
            ("info", ["info", s(n), "--json"])
            for n in (
                "checkpoint.pt",
                "state_dict.pt",
                "legacy_format.pt",
                "mlp.pt2",
                "mlp_aoti.pt2",
                "scripted_module.pt",
                "scripted_module.ptl",
                "mlp.onnx",
                "dcp_ckpt",
            )
        ],
        ("ls", ["ls", s("checkpoint.pt"), "--json"]),
        ("formats", ["formats", "--json"]),
        ("ls", ["ls", s("dcp_ckpt"), "--json"]),
        ("verify", ["verify", s("mlp.pt2"), "--json"]),
        ("verify", ["verify", s("checkpoint.pt"), "--json"]),
        ("diff", ["diff", s("checkpoint.pt"), s("state_dict.pt"), "--json"]),
        ("convert", ["convert", s("checkpoint.pt"), f"{tmp}/c.safetensors", "--json"]),
        ("convert", ["convert", s("checkpoint.pt"), f"{tmp}/c.pt", "--json"]),
        ("convert", ["convert", s("state_dict.pt"), f"{tmp}/sh.safetensors", "--max-shard-size", "10KB", "--json"]),
        ("reshard", ["reshard", s("checkpoint.pt"), f"{tmp}/dcp", "--ranks", "2", "--json"]),
        ("reshard", ["reshard", s("checkpoint.pt"), f"{tmp}/dcp2", "--ranks", "2", "--executor", "local:1", "--json"]),
        ("cleanup", ["reshard", s("checkpoint.pt"), f"{tmp}/dcp2", "--ranks", "2", "--cleanup", "--json"]),
        ("reshard-plan", ["reshard", s("dcp_ckpt"), "--ranks", "3", "--plan-only", "--json"]),
        ("dcp-layout", ["dcp-layout", s("dcp_ckpt"), "--json"]),
        ("code", ["code", s("scripted_module.pt"), "--json"]),
        ("graph", ["graph", s("mlp.pt2"), "--json"]),
        ("run", ["run", s("mlp.pt2"), "--sample-inputs", "-o", f"{tmp}/out.npz", "--json"]),
        ("onnx-graph", ["onnx", "graph", s("mlp.onnx"), "--json"]),
        ("extract", ["extract", s("mlp_aoti.pt2"), f"{tmp}/ex", "--json"]),
        ("ts-extra", ["ts", "extra", s("scripted_module.pt"), "--json"]),
        ("ts-bytecode", ["ts", "bytecode", s("scripted_module.ptl"), "--json"]),
        ("ls", ["ts", "tensors", s("scripted_module.pt"), "--all", "--json"]),
        ("scan", ["scan", s("checkpoint.pt"), "--json"]),
        ("scan", ["scan", s("scripted_module.pt"), s("checkpoint.pt"), "--json", "--coverage", "-j", "1"]),
        *[("view", ["view", s(n), "--json"]) for n in ("mlp.pt2", "mlp.onnx", "scripted_module.pt", "checkpoint.pt")],
        ("view", ["view", s("checkpoint.pt"), s("state_dict.pt"), "--json", "--no-scan"]),
        ("cache", ["cache", f"{tmp}/cache", "--json"]),
        ("cache-prune", ["cache", "prune", f"{tmp}/cache", "--older-than", "1d", "--json"]),
    ]


def _walk(x, path="$"):
    yield path, x
    if isinstance(x, dict):
        for k, v in x.items():
            yield path + "." + k, k
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _walk(v, f"{path}[{i}]")


def test_every_json_output_matches_its_schema(capsys, tmp_path):
    tmp = str(tmp_path)
    os.mkdir(f"{tmp}/cache")
    covered = set()
    for name, argv in _cases(tmp):
        out = run_json(capsys, *argv)
        validate(out, SCHEMAS[name])
        covered.add(name)
        for where, v in _walk(out):
            if isinstance(v, str):
                # never cut ("…" keys, "… 8 more"), never JSON inside a string
                assert not v.startswith("…") and "more" not in v[:8], (argv, where, v)
                if where.endswith("_spec"):
                    assert not v.lstrip().startswith(("[", "{")), (argv, where)
    # set-weights of both kinds, with weights taken from the models themselves
    assert main(["convert", s("mlp.onnx"), f"{tmp}/w.safetensors"]) == 0
    capsys.readouterr()
    validate(
        run_json(capsys, "onnx", "set-weights", s("mlp.onnx"), f"{tmp}/w.safetensors", "-o", f"{tmp}/m.onnx", "--json"),
        SCHEMAS["onnx-set-weights"],
    )
    assert main(["convert", s("scripted_module.pt"), f"{tmp}/t.safetensors"]) == 0
    capsys.readouterr()
    validate(
        run_json(capsys, "ts", "set-weights", s("scripted_module.pt"), f"{tmp}/t.safetensors", "-o", f"{tmp}/t.pt", "--json"),
        SCHEMAS["ts-set-weights"],
    )
    assert main(["convert", s("mlp.pt2"), f"{tmp}/p.safetensors"]) == 0
    capsys.readouterr()
    validate(
        run_json(capsys, "pt2", "set-weights", s("mlp.pt2"), f"{tmp}/p.safetensors", "-o", f"{tmp}/p.pt2", "--json"),
        SCHEMAS["pt2-set-weights"],
    )
    covered |= {"onnx-set-weights", "ts-set-weights", "pt2-set-weights", "error"}  # error: test_json_errors_are_documents
    capsys.readouterr()
    assert covered == set(SCHEMAS), set(SCHEMAS) - covered


def test_every_command_with_output_has_json():
    """Commands that print results take --json; the schemas cover each of them."""
    parser = build_parser()
    missing = []

    def visit(p, prefix):
        subs = [a for a in p._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not subs:
            if not any("--json" in a.option_strings for a in p._actions):
                missing.append(prefix)
            return
        for name, sp in subs[0].choices.items():
            visit(sp, f"{prefix} {name}".strip())

    visit(parser, "")
    assert missing == [], missing


def test_info_json_is_whole_and_trimmed(capsys, tmp_path):
    import torchless

    sd = {f"w{i}": torchless.tensor([float(i)]) for i in range(40)}
    p = tmp_path / "wide.pt"
    torchless.save({"state": sd, "names": [str(i) for i in range(30)], "version": 3}, p)
    info = run_json(capsys, "info", p, "--json")
    validate(info, SCHEMAS["info"])
    assert len(info["tree"]["state"]) == 40 and len(info["tree"]["names"]) == 30  # nothing cut
    w3 = info["tree"]["state"]["w3"]
    assert w3["__kind__"] == "tensor" and w3["shape"] == [1] and w3["parameter"] is False
    assert info["records"]["version"] == "3"
    aoti = run_json(capsys, "info", s("mlp_aoti.pt2"), "--json")
    assert "models_detail" in aoti and not [k for k in aoti if " " in k]
    spec = aoti["models_detail"]["model"]["in_spec"]
    assert isinstance(spec, list)  # the pytree spec as JSON, not a string holding JSON
    assert "context" in json.dumps(spec) and '"context": "' not in json.dumps(spec)  # node contexts too


def test_validator_catches_mismatches():
    with pytest.raises(SchemaError):
        validate({"name": "x"}, SCHEMAS["ls"])
    with pytest.raises(SchemaError):
        validate([{"name": "x", "dtype": "f", "shape": [1], "nbytes": 4, "extra": 1}], SCHEMAS["ls"])
    with pytest.raises(SchemaError):
        validate({"format": "pt", "path": "p", "model m": {}}, SCHEMAS["info"])


def test_torchscript_info_json_is_whole(capsys, tmp_path, torch):
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)
            self.ids: list[int] = list(range(30))

        def forward(self, x):
            return self.lin(x) * len(self.ids)

    p = tmp_path / "m.pt"
    torch.jit.save(torch.jit.script(M()), str(p))
    info = run_json(capsys, "info", p, "--json")
    validate(info, SCHEMAS["info"])
    tree = info["tree"]
    assert tree["__kind__"] == "object" and tree["fields"]["ids"] == list(range(30))
    assert tree["fields"]["lin"]["fields"]["weight"]["__kind__"] == "tensor"


def _json_commands():
    """The argv prefix of every command that takes --json (``["ts", "set-weights"]``...)."""
    found = []

    def visit(p, prefix):
        subs = [a for a in p._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not subs:
            if any("--json" in a.option_strings for a in p._actions):
                found.append(prefix)
            return
        for name, sp in subs[0].choices.items():
            if name not in {a for a in sp.prog.split()[:-1]}:
                visit(sp, [*prefix, name])

    visit(build_parser(), [])
    return found


def _error_doc(capsys, argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert code == 2, (argv, out.err)
    assert out.err.count("\n") >= 1 and "error:" in out.err  # the line on stderr stays
    doc = json.loads(out.out)
    validate(doc, SCHEMAS["error"])
    return doc["error"]


def test_json_errors_are_documents(capsys, tmp_path):
    """With --json a failure prints {"error": {...}} on stdout and exits 2, as without."""
    missing = str(tmp_path / "missing.pt")
    err = _error_doc(capsys, ["info", missing, "--json"])
    assert err["type"] == "NotFoundError" and err["path"] == missing and missing in err["text"]
    err = _error_doc(capsys, ["convert", s("checkpoint.pt"), f"{tmp_path}/x.unknown", "--to", "nope", "--json"])
    assert "nope" in err["text"]
    err = _error_doc(capsys, ["onnx", "graph", s("mlp.pt2"), "--json"])  # the wrong kind of input
    assert "graph" in err["text"]
    err = _error_doc(capsys, ["ts", "set-weights", s("scripted_module.pt"), missing, "-o", f"{tmp_path}/o.pt", "--json"])
    assert err["path"] == missing
    err = _error_doc(capsys, ["verify", s("checkpoint.pt"), "--json", "--storage-options", "{"])
    assert "--storage-options" in err["message"]
    # a usage error argparse finds, on every command that takes --json
    for prefix in _json_commands():
        err = _error_doc(capsys, [*prefix, "--json", "--no-such-option"])
        assert err["type"] == "UsageError" and err["message"], prefix
    # without --json: the line on stderr only
    assert main(["info", missing]) == 2
    assert capsys.readouterr().out == ""


def test_json_error_as_a_user_types_it(tmp_path):
    import subprocess
    import sys

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    env = {**os.environ, "PYTHONPATH": os.path.abspath(os.path.join(root, "src"))}
    r = subprocess.run(
        [sys.executable, "-m", "torchless", "ls", "--json", str(tmp_path / "none.safetensors")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.startswith("torchless: error:")
    assert json.loads(r.stdout)["error"]["type"] == "NotFoundError"
