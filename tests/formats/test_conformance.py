"""Every registered format handler passes the conformance suite (torchless.testing.handlers):
sniffing, open/info, tensors bit-exact against the format's oracle, verify, truncation and
bit-flip fuzz, unknown-option refusal, close releasing the file, write round trips, CLI.

A handler without a conformance entry fails ``test_every_handler_has_an_entry``; a new
format gets every check here by registering its handler and its entry.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from torchless.formats.registry import handler, handlers
from torchless.testing import CHECKS, ConformanceSkip, Expected, missing_entries, run_check
from torchless.testing import handlers as handlers_mod
from torchless.testing.handlers import Suite

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
HANDLERS = [h.name for h in handlers()]

#: (handler, check) -> reason: known failures, each an xfail(strict=True) while its cause
#: is present (the condition), so the fix turns it into a plain pass
KNOWN: dict[tuple[str, str], tuple[bool, str]] = {}


@pytest.fixture(scope="session")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Suite:
    return Suite(tmp_path_factory.mktemp("conformance"), SAMPLES)


@pytest.fixture(autouse=True)
def _harness_mutations(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fuzz check also applies the structure-aware mutations of the fuzz harness
    (zip member swaps, JSON header and pickle mutations, interesting values at record
    boundaries), a few per sample."""
    from fuzz.harness import mutate_bytes

    def harness(data: bytes, rng: random.Random, name: str) -> tuple[str, bytes]:
        try:
            return mutate_bytes(data, rng, name=name)
        except Exception:  # noqa: BLE001 - a mutator tripping on its input: a plain bit flip instead
            bit = rng.randrange(len(data) * 8)
            return f"bitflip@{bit} (fallback)", data[: bit // 8] + bytes([data[bit // 8] ^ (1 << bit % 8)]) + data[bit // 8 + 1 :]

    monkeypatch.setattr(handlers_mod, "MUTATORS", [harness])


def test_every_handler_has_an_entry() -> None:
    assert HANDLERS, "no handler registered"
    assert missing_entries() == [], "registered handlers without a conformance entry (add one in torchless.testing)"


def _params() -> list:
    out = []
    for name in HANDLERS:
        for check in CHECKS:
            cond, reason = KNOWN.get((name, check), (False, ""))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if cond else []
            out.append(pytest.param(name, check, id=f"{name}-{check}", marks=marks))
    return out


@pytest.mark.parametrize(("name", "check"), _params())
def test_conformance(suite: Suite, name: str, check: str) -> None:
    try:
        run_check(check, suite, name)
    except ConformanceSkip as e:
        pytest.skip(str(e))


# -------------------------------------------------- the checks can fail: broken handlers
def test_oracle_check_catches_a_wrong_byte(suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    s = suite.samples("safetensors")[0]
    want = s.oracle()
    k, e = next((k, e) for k, e in want.items() if e.data)
    bad = {**want, k: Expected(e.dtype, e.shape, bytes([e.data[0] ^ 1]) + e.data[1:])}
    monkeypatch.setattr(s, "oracle", lambda: bad)
    with pytest.raises(AssertionError, match="values differ"):
        run_check("oracle", suite, "safetensors")


def test_fuzz_check_catches_foreign_exceptions_and_hangs(suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(path, name, options=None):  # noqa: ANN001
        raise KeyError("a bug")

    monkeypatch.setattr(handlers_mod, "exercise", crash)
    with pytest.raises(AssertionError, match="KeyError"):
        handlers_mod.check_fuzz(suite, "safetensors", truncations=2, flips=1)

    def spin(path, name, options=None):  # noqa: ANN001
        while True:
            pass

    monkeypatch.setattr(handlers_mod, "exercise", spin)
    monkeypatch.setattr(handlers_mod, "CASE_CPU_SECONDS", 0.02)
    monkeypatch.setattr(handlers_mod, "truncation_offsets", lambda data, n: [1])
    with pytest.raises(AssertionError, match="still running"):
        handlers_mod.check_fuzz(suite, "safetensors", truncations=1, flips=0)


def test_close_check_catches_a_leaked_file(suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchless.formats.safetensors import SafetensorsArtifact

    monkeypatch.setattr(SafetensorsArtifact, "close", lambda self: None)
    leak: list = []
    real_init = SafetensorsArtifact.__init__

    def init(self, path, policy=None):  # noqa: ANN001
        real_init(self, path, policy)
        leak.append(self)  # a global keeps every artifact: a leak only the release check sees

    monkeypatch.setattr(SafetensorsArtifact, "__init__", init)
    with pytest.raises(AssertionError, match="still open after close"):
        run_check("release", suite, "safetensors")


def test_sniff_check_catches_a_greedy_sniffer(suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(handler("npz")), "sniff", lambda self, probe: True)
    with pytest.raises(AssertionError, match="npz claims the"):
        run_check("sniff", suite, "npz")
