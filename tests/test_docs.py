"""Every code block of README.md and docs/*.md runs.

Blocks fenced as ```python run as scripts, ```sh/```console blocks run line by line
(``torchless ...`` lines in this process through ``torchless.cli.main.main``, others in
bash), in a temporary folder holding the artifacts the docs name (built from the
committed samples; see ``FIXTURES``). A command may exit 0 or 1 (findings, differences),
never 2 (an error) and never with a traceback. ```text blocks are not code (layout trees,
synopses). A block that cannot run here is preceded by ``<!-- skip: reason -->`` and
counted; any other fence language fails the test, so no block escapes by its label.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SAMPLES = os.path.join(ROOT, "samples")
DOCS = ["README.md"] + sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md"))
RUN = {"python", "sh", "console", "bash"}
NOT_CODE = {"text"}

FENCE = re.compile(r"^```(\S*)\s*$")
SKIP = re.compile(r"<!--\s*skip:\s*(.+?)\s*-->")


def blocks(path: str) -> list[tuple[int, str, str, str | None]]:
    """``(line, language, code, skip reason)`` of every fenced block."""
    lines = open(os.path.join(ROOT, path), encoding="utf-8").read().splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        skip = SKIP.search(prev)
        out.append((start + 1, lang, "\n".join(lines[start + 1 : j]), skip.group(1) if skip else None))
        i = j + 1
    return out


def _model_pt(path: str) -> None:
    import torchless

    rng = np.random.default_rng(0)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    torchless.save(
        {
            "layer.weight": f32(4, 3),
            "layer.bias": f32(4),
            "head.weight": f32(2, 4),
            "epoch": 3,
            "config": {"lr": 0.001},
        },
        path,
    )


def _dcp(dst: str) -> None:
    shutil.copytree(os.path.join(SAMPLES, "dcp_ckpt"), dst)


CACHE_KEY = "ccoovis4cdmj6x2qu6gyp4gcxoiroifocszxduniryqmwavjdeib"  # the entry docs/inductor_cache.md shows


def _cache(dst: str) -> None:
    kernel = os.path.join(dst, CACHE_KEY[1:3], CACHE_KEY + ".py")
    os.makedirs(os.path.dirname(kernel))
    with open(kernel, "w") as f:
        f.write(
            "import triton\nimport triton.language as tl\n\n@triton.jit\ndef triton_poi_fused_add_0(in_ptr0, "
            "out_ptr0, xnumel, XBLOCK: tl.constexpr):\n    pass\n"
        )


def _built(builder: str, dst: str) -> None:
    """The conformance suite's sample of a format (written by torch), moved to ``dst``."""
    import tempfile
    from pathlib import Path

    from torchless.testing import _builtin

    with tempfile.TemporaryDirectory(dir=os.path.dirname(dst)) as tmp:
        (sample,) = getattr(_builtin, builder)(Path(tmp), None)
        shutil.move(str(sample.path), dst)


#: per document: file name in the temporary folder -> sample file, folder or builder
COMMON = {"model.pt": _model_pt, "a.pt": _model_pt, "b.pt": "state_dict.pt", "downloads": "scan", "samples": "."}


def _zero3(dst: str) -> None:
    """A 2-rank ZeRO-3 checkpoint root in DeepSpeed's layout (the conformance sample)."""
    import pathlib
    import tempfile

    from torchless.testing._builtin import _build_deepspeed

    with tempfile.TemporaryDirectory() as tmp:
        _build_deepspeed(pathlib.Path(tmp), None)
        shutil.copytree(os.path.join(tmp, "zero3"), dst)


FIXTURES = {
    "docs/deepspeed.md": {"zero3": _zero3},
    "README.md": {"module.pt": "checkpoint.pt", "ckpt": _dcp},
    "docs/pt.md": {},
    "docs/torchscript.md": {
        "model.pt": "scripted_module.pt",
        "other.pt": "scripted_module.pt",
        "model.ptl": "scripted_module.ptl",
    },
    "docs/pt2.md": {"model.pt2": "mlp.pt2", "mlp.pt2": "mlp.pt2"},
    "docs/interpreter.md": {"mlp.pt2": "mlp.pt2"},
    "docs/view.md": {"model.pt": "checkpoint.pt", "other.pt": "state_dict.pt", "model.pt2": "mlp.pt2", "model.onnx": "mlp.onnx"},
    "docs/aoti.md": {"model.pt2": "mlp_aoti.pt2"},
    "docs/onnx.md": {"model.onnx": "mlp.onnx", "a.onnx": "mlp.onnx", "b.onnx": "mlp.onnx"},
    "docs/dcp.md": {"ckpt": _dcp},
    "docs/inductor_cache.md": {"cache": _cache},
    "docs/trainers.md": {
        "checkpoint-500": lambda d: _built("_build_trainer", d),
        "last.ckpt": lambda d: _built("_build_lightning", d),
        "megatron_run": lambda d: _built("_build_megatron", d),
    },
}


def _stage(doc: str, where: str) -> None:
    for name, src in {**COMMON, **FIXTURES.get(doc, {})}.items():
        dst = os.path.join(where, name)
        if callable(src):
            src(dst)
        elif os.path.isdir(os.path.join(SAMPLES, src)):
            shutil.copytree(os.path.join(SAMPLES, src), dst, dirs_exist_ok=True)
        else:
            shutil.copy(os.path.join(SAMPLES, src), dst)
    if doc == "docs/onnx.md":  # weights named like the model's initializers
        import torchless

        torchless.convert(os.path.join(where, "model.onnx"), os.path.join(where, "finetuned.safetensors"))
        torchless.convert(os.path.join(where, "model.onnx"), os.path.join(where, "finetuned.pt"))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _commands(code: str) -> list[str]:
    out: list[str] = []
    cur = ""
    for line in code.splitlines():
        line = line.rstrip()
        if line.startswith("$ "):
            line = line[2:]
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur += line
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        out.append(cur)
        cur = ""
    if cur:
        out.append(cur)
    return out


def _run_sh(code: str, where: str, capsys) -> None:
    from torchless.cli.main import main

    for cmd in _commands(code):
        plain = cmd.split("#", 1)[0].strip() if " #" in cmd else cmd.strip()
        if plain.startswith("torchless ") and not re.search(r"[|;&<>`$]", plain):
            old = os.getcwd()
            os.chdir(where)
            try:
                rc = main(shlex.split(plain)[1:])
            finally:
                os.chdir(old)
            out = capsys.readouterr()
            assert rc in (0, 1), f"{cmd!r} exited {rc}: {out.err.strip()}"
            assert "Traceback" not in out.err, out.err
            continue
        shim = os.path.join(where, ".bin")
        os.makedirs(shim, exist_ok=True)
        for name, line in (
            ("torchless", f'exec "{sys.executable}" -m torchless.cli.main "$@"'),
            ("python", f'exec "{sys.executable}" "$@"'),
        ):
            with open(os.path.join(shim, name), "w") as f:
                f.write(f"#!/bin/sh\n{line}\n")
            os.chmod(os.path.join(shim, name), 0o755)
        env = _env()
        env["PATH"] = shim + os.pathsep + env["PATH"]
        r = subprocess.run(["bash", "-c", plain], cwd=where, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode in (0, 1), f"{cmd!r} exited {r.returncode}: {r.stderr.strip()}"
        assert "Traceback" not in r.stderr, r.stderr


def _run_python(code: str, where: str) -> None:
    r = subprocess.run([sys.executable, "-c", code], cwd=where, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}:\n{r.stderr[-3000:]}"


@pytest.mark.parametrize("doc", DOCS)
def test_doc_code_blocks_run(doc, tmp_path, capsys, record_property):
    found = blocks(doc)
    ran = skipped = 0
    for line, lang, code, skip in found:
        if lang in NOT_CODE:
            continue
        assert lang in RUN, f"{doc}:{line}: fence ```{lang} is neither run ({sorted(RUN)}) nor ```text"
        if skip:
            skipped += 1
            continue
        where = tmp_path / f"block{line}"
        where.mkdir()
        _stage(doc, str(where))
        try:
            if lang == "python":
                _run_python(code, str(where))
            else:
                _run_sh(code, str(where), capsys)
        except AssertionError as e:
            raise AssertionError(f"{doc}:{line}: {e}") from None
        ran += 1
    record_property("blocks_run", ran)
    record_property("blocks_skipped", skipped)


def test_skip_markers_are_counted_and_few():
    """Skipped blocks are explicit and rare (each names its reason)."""
    skipped = [(d, line, reason) for d in DOCS for line, lang, _c, reason in blocks(d) if reason]
    code = [(d, line) for d in DOCS for line, lang, _c, _r in blocks(d) if lang in RUN]
    assert all(r for _d, _l, r in skipped)
    assert len(skipped) <= 4, skipped
    assert len(code) >= 15, "the docs' examples are collected"
