"""Mutation fuzzing of every format's samples (issue 10/11 robustness contract).

For every mutated input: the API (open/info/tensors/bytes, load with weights_only True
and False, verify), the scanner and the CLI (info, ls, verify, scan; cache for inductor
caches) finish within 5 s and 1 GiB and raise nothing but a TorchlessError that is not
an InternalError; the CLI exits 0/1/2 with at most one line on stderr and no traceback.
The long run is ``scripts/fuzz_formats.py`` (counts in docs/robustness.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import harness

CASES = int(os.environ.get("TORCHLESS_FUZZ_CASES", "2400"))
#: wall seconds after which no new batch starts (a loaded CI machine runs fewer cases, never past
#: the test timeout); about 30-60 s cover all cases on two idle cores
DEADLINE = float(os.environ.get("TORCHLESS_FUZZ_DEADLINE", "150"))
MIN_CASES = 200
BASE_SEED = 20261201


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> list[harness.Seed]:
    return harness.build_seeds(tmp_path_factory.mktemp("fuzz-seeds"))


def test_seeds_cover_every_format(seeds: list[harness.Seed]) -> None:
    import torchless

    formats = set()
    for s in seeds:
        if s.kind == "cache":
            formats.add("inductor_cache")
            continue
        formats.add(torchless.detect(s.path / s.entry if s.entry else s.path))
    assert formats >= {"pt", "torchscript", "pt2", "aoti", "onnx", "safetensors", "npz", "dcp", "inductor_cache"}, formats
    names = {s.name for s in seeds}
    assert {
        "legacy.tar",
        "legacy_format.pt",
        "scripted_module.ptl",
        "mlp_aoti.pt2",
        "arrays_deflate.npz",
        "array.npy",
        "dcp_ckpt",
    } <= names


def test_mutation_fuzz_every_format(seeds: list[harness.Seed], tmp_path: Path) -> None:
    s = harness.run_campaign(
        CASES,
        base_seed=BASE_SEED,
        workers=2,
        workdir=tmp_path / "work",
        faildir=tmp_path / "failures",
        seeds=seeds,
        deadline=DEADLINE,
        chunk=100,
    )
    assert s.cases + s.skipped == CASES
    assert s.cases >= min(CASES, MIN_CASES), s.report()
    assert set(s.by_seed) == {x.name for x in seeds}, "every seed is mutated"
    assert s.targets >= s.cases * 5
    assert not s.failures, f"inputs saved under {tmp_path / 'failures'}\n" + s.report(limit=30)


def test_cli_in_a_real_process_is_one_line(seeds: list[harness.Seed], tmp_path: Path) -> None:
    """The console entry point itself (python -m torchless) on mutated inputs: exit
    0/1/2, one stderr line, no traceback."""
    env = harness._env()
    seen_error = False
    for i in range(0, 60, 20):
        case = harness.materialize(seeds, BASE_SEED + 1, i, tmp_path / f"c{i}")
        for cmd in ("info", "ls", "verify", "scan"):
            p = subprocess.run(
                [sys.executable, "-m", "torchless", cmd, str(case.target)], capture_output=True, text=True, env=env, timeout=60
            )
            harness.check_cli_output(p.returncode, p.stderr)
            seen_error |= p.returncode == 2
    assert seen_error, "some mutated input is refused (the check is not vacuous)"


# --- the harness itself finds what it must find ------------------------------------------
@pytest.mark.allows_internal_error
def test_harness_flags_every_kind_of_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    from torchless.core.errors import FormatError, InternalError

    def boom(_p: Path) -> None:
        raise TypeError("a bug")

    def internal(_p: Path) -> None:
        raise InternalError("internal error while testing")

    def refuse(_p: Path) -> None:
        raise FormatError("bad file")

    def hang(_p: Path) -> None:
        end = time.monotonic() + 10
        while time.monotonic() < end:  # CPU time: the alarm counts work
            pass

    def oom(_p: Path) -> None:
        raise MemoryError()

    def cli_tb(_p: Path) -> None:
        harness.check_cli_output(2, "Traceback (most recent call last):\n  ...\nTypeError: x\n")

    for name, fn in {"boom": boom, "internal": internal, "refuse": refuse, "hang": hang, "oom": oom, "cli_tb": cli_tb}.items():
        monkeypatch.setitem(harness.TARGETS, name, fn)
    old = signal.signal(signal.SIGPROF, harness._alarm)
    try:
        assert harness.run_target("boom", tmp_path, 5)["kind"] == "exception"
        assert harness.run_target("internal", tmp_path, 5)["kind"] == "internal"
        assert harness.run_target("refuse", tmp_path, 5) is None
        t0 = time.monotonic()
        assert harness.run_target("hang", tmp_path, 0.3)["kind"] == "timeout"
        assert time.monotonic() - t0 < 9
        assert harness.run_target("oom", tmp_path, 5)["kind"] == "memory"
        assert harness.run_target("cli_tb", tmp_path, 5)["kind"] == "cli"
    finally:
        signal.signal(signal.SIGPROF, old)
    with pytest.raises(harness.CliFailure):
        harness.check_cli_output(0, "one\ntwo\n")
    with pytest.raises(harness.CliFailure):
        harness.check_cli_output(3, "")


def test_worker_memory_limit_is_enforced() -> None:
    """Workers run under RLIMIT_AS = 1 GiB: a 2 GiB allocation fails there."""
    code = "try:\n    b = bytearray(2 << 30)\n    print('allocated')\nexcept MemoryError:\n    print('MemoryError')\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=harness._limits, timeout=60)
    assert p.stdout.strip() == "MemoryError"


def test_mutations_are_reproducible(seeds: list[harness.Seed], tmp_path: Path) -> None:
    a = harness.materialize(seeds, 7, 123, tmp_path / "a")
    b = harness.materialize(seeds, 7, 123, tmp_path / "b")
    assert a.description == b.description
    fa = sorted(p.relative_to(a.root.parent) for p in a.root.parent.rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b.root.parent) for p in b.root.parent.rglob("*") if p.is_file())
    assert fa == fb
    for r in fa:
        assert (a.root.parent / r).read_bytes() == (b.root.parent / r).read_bytes()
