"""The format handler conformance suite: checks every registered handler must pass.

A handler takes part by having a :class:`Conformance` entry (torchless's own are in
:mod:`torchless.testing._builtin`; a third party calls :func:`register_conformance` next
to its ``@register``). An entry builds a few small samples in a temporary folder (with
torchless's own writer where the format is writable, else with the producing library or
from committed files) and gives each sample an oracle: the tensors as the real tool
(``torch.load``, ``safetensors``, ``numpy.load``, ``onnx``...) reads them.

The checks (:data:`CHECKS`, each ``check(suite, name)`` raising ``AssertionError``):

* ``sniff``: the handler recognizes its samples, detection picks it, and it refuses
  every other handler's samples (unless that handler sniffs first: see :func:`check_sniff`).
* ``open``: ``open`` / ``tensors`` / ``keys`` / ``info`` work; ``info`` is JSON as is.
* ``oracle``: every tensor's dtype, shape and bytes equal the oracle's.
* ``verify``: ``verify`` finds no error in a good sample, and a damaged copy is never
  passed (``open`` refuses it, or ``verify`` reports an error; the CLI exits non-zero).
* ``fuzz``: truncation at many offsets, bad magic, huge length fields and bit flips raise
  nothing but ``TorchlessError`` subclasses, each within a CPU-time budget.
* ``options``: an unknown option is a ``UsageError`` (opening, and writing where the
  handler writes).
* ``close``: after ``close`` no file descriptor or memory mapping of the sample remains,
  though the artifact object is still referenced; ``release``: none remains once it is
  dropped either (no cache or global holds the file); ``after-close``: arrays taken before
  ``close`` stay valid (and the file goes with the last of them); a tensor read only after
  it raises a ``TorchlessError`` or gives its right values.
* ``roundtrip``: what the handler writes reads back equal (tensors, or whole objects),
  in torchless and in the oracle.
* ``edit``: a handler that edits replaces a sample's tensors in a new file.
* ``cli``: ``info``, ``info --json``, ``ls --json`` and ``verify`` exit 0.

Nothing here imports torch at import time.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import random
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import TorchlessError, UsageError
from ..core.lazy import import_modules
from ..core.registry import Registry

__all__ = [
    "CHECKS",
    "Conformance",
    "ConformanceSkip",
    "Expected",
    "Sample",
    "Suite",
    "capabilities",
    "conformance",
    "conformance_entries",
    "missing_entries",
    "register_conformance",
    "run_check",
]

#: dtypes a tensor writer is asked to round-trip unless its entry says otherwise
WRITE_DTYPES: tuple[str, ...] = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "complex64",
)
#: CPU seconds one fuzz case may take (open, info, every tensor, verify)
CASE_CPU_SECONDS = 5.0


class ConformanceSkip(Exception):
    """A check cannot run here: an oracle library is not installed, a committed sample is
    absent, or the check does not apply to the handler (a reader-only format has no
    round trip). The test runner turns it into a skip."""


# ------------------------------------------------------------------------------- values
@dataclass(frozen=True)
class Expected:
    """One tensor as an oracle sees it: torch dtype name (``"bfloat16"``), shape, and its
    logical values, C-contiguous, in host byte order."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    @classmethod
    def from_numpy(cls, a: Any) -> Expected:
        a = np.asarray(a)
        if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and a.dtype.isnative is False):
            a = a.astype(a.dtype.newbyteorder("="))
        return cls(a.dtype.name, tuple(int(d) for d in a.shape), np.ascontiguousarray(a).tobytes())

    @classmethod
    def from_torch(cls, t: Any) -> Expected:
        import torch

        t = t.detach().cpu()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        c = t.contiguous().reshape(-1)
        data = c.view(torch.uint8).numpy().tobytes() if c.numel() else b""
        return cls(str(t.dtype).removeprefix("torch."), tuple(int(d) for d in t.shape), data)

    @classmethod
    def from_torchless(cls, t: Any) -> Expected:
        return cls(t.dtype.name, tuple(int(d) for d in t.shape), t.tobytes())


def flatten(obj: Any, prefix: str = "", *, is_tensor: Callable[[Any], bool]) -> Iterator[tuple[str, Any]]:
    """``(dotted name, tensor)`` for every tensor in nested dicts, lists and tuples (the
    names torchless gives an object tree's tensors)."""
    if is_tensor(obj):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else str(k), is_tensor=is_tensor)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from flatten(v, f"{prefix}.{i}" if prefix else str(i), is_tensor=is_tensor)


def torch_tensors(obj: Any) -> dict[str, Expected]:
    """The tensors of a torch object tree (``torch.load``'s result) by dotted name."""
    import torch

    return {n: Expected.from_torch(t) for n, t in flatten(obj, is_tensor=lambda x: isinstance(x, torch.Tensor))}


# ------------------------------------------------------------------------------ entries
@dataclass
class Sample:
    """One sample artifact of a handler.

    Attributes:
        path: the file or folder.
        oracle: returns the tensors as the reference tool reads them (None: the entry's
            ``oracle`` on :attr:`path`; with neither, the ``oracle`` check fails unless
            ``note`` says why).
        fuzz_file: the file mutated by the ``fuzz`` check, relative to ``path`` for a
            folder (None for a file: the file itself; for a folder: not fuzzed).
        corrupt: damages a copy of the sample in place (file or folder) so that
            ``verify`` must fail; default: drop the last byte of ``fuzz_file``.
        open_options: options given to ``torchless.open``.
        label: a short name for messages.
        note: why the sample has no oracle.
        with_folder: the file needs its siblings (an index and its shards, an ONNX model
            and its external data): copies take the whole containing folder.
    """

    path: Path
    oracle: Callable[[], dict[str, Expected]] | None = None
    fuzz_file: str | None = None
    corrupt: Callable[[Path], None] | None = None
    open_options: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    note: str = ""
    with_folder: bool = False

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.label = self.label or self.path.name

    def target_file(self, root: Path | None = None) -> Path | None:
        """The file fuzzed and damaged in ``root`` (a copy of :attr:`path`; default the sample)."""
        root = self.path if root is None else root
        if not self.path.is_dir():
            return root
        return root / self.fuzz_file if self.fuzz_file else None


@dataclass(frozen=True)
class Conformance:
    """How to test one handler.

    Attributes:
        handler: the registered handler name.
        build: ``build(out_dir, samples_dir)`` writes samples under ``out_dir`` and returns
            them; ``samples_dir`` is a folder of committed samples (or None). It raises
            :class:`ConformanceSkip` when a library it needs is missing.
        write_dtypes: the dtypes the tensor writer must round-trip.
        write_suffix: the file name ending used when writing (default: the handler's
            first extension).
        write_options: options the write round trip passes (``max_shard_size`` to make
            a sharded checkpoint).
        oracle: ``oracle(path)``: the tensors of any file of the format as the reference
            tool reads them; used for samples without their own oracle and for what the
            handler writes or edits.
        edit: ``edit(src, dst, {name: ndarray})`` writes a copy of ``src`` with those
            tensors replaced (required of handlers declaring ``edit``).
        oracle_lacks: dtypes the oracle cannot represent (NumPy has no bfloat16: ``np.load``
            returns its raw ``V2`` bytes); the oracle is not asked about those.
        roundtrip_object: ``roundtrip_object(sample) -> object`` to :func:`torchless.save`
            for handlers that write objects (default: the opened artifact's ``load()``).
    """

    handler: str
    build: Callable[[Path, Path | None], list[Sample]]
    write_dtypes: tuple[str, ...] = WRITE_DTYPES
    write_suffix: str | None = None
    write_options: dict[str, Any] = field(default_factory=dict)
    oracle: Callable[[Path], dict[str, Expected]] | None = None
    edit: Callable[[Path, Path, dict[str, np.ndarray]], None] | None = None
    oracle_lacks: tuple[str, ...] = ()
    roundtrip_object: Callable[[Any], Any] | None = None


CONFORMANCE: Registry[str, Conformance] = Registry("conformance entry")
_builtin_loaded = False


def register_conformance(entry: Conformance) -> Conformance:
    """Add the conformance entry of a handler (one per handler name)."""
    CONFORMANCE.add(entry.handler, entry)
    return entry


def _load_builtin() -> None:
    global _builtin_loaded
    if not _builtin_loaded:
        _builtin_loaded = True
        import_modules(["torchless.testing._builtin"])  # registers torchless's entries


def conformance(name: str) -> Conformance:
    """The entry of handler ``name``."""
    _load_builtin()
    return CONFORMANCE.get(name)


def conformance_entries() -> dict[str, Conformance]:
    _load_builtin()
    return dict(CONFORMANCE.items())


def missing_entries() -> list[str]:
    """Registered handlers without a conformance entry (each is a failure of the suite)."""
    from ..formats.registry import handlers

    entries = conformance_entries()
    return sorted(h.name for h in handlers() if h.name not in entries)


def capabilities(h: Any) -> frozenset[str]:
    """What handler ``h`` declares it can do (its :class:`~torchless.formats.base.Capabilities`
    flags: ``read``, ``list``, ``verify``, ``write_tensors``, ``write_objects``, ``edit``);
    the checks run from this declaration, never from probing methods."""
    return frozenset(h.capabilities.flags())


# -------------------------------------------------------------------------------- suite
class Suite:
    """Builds each handler's samples once, under ``root``; the checks take it.

    Args:
        root: a scratch folder (a pytest ``tmp_path_factory`` folder).
        samples_dir: committed samples (torchless's ``samples/``), or None.
    """

    def __init__(self, root: Path, samples_dir: Path | None = None) -> None:
        self.root = Path(root)
        self.samples_dir = samples_dir
        self._built: dict[str, list[Sample] | ConformanceSkip] = {}
        self._n = 0

    def handler(self, name: str) -> Any:
        from ..formats.registry import handler

        return handler(name)

    def samples(self, name: str) -> list[Sample]:
        """The samples of handler ``name``, built on first use.

        Raises:
            ConformanceSkip: the entry cannot build them here.
        """
        if name not in self._built:
            out = self.root / "samples" / name
            out.mkdir(parents=True, exist_ok=True)
            try:
                built = conformance(name).build(out, self.samples_dir)
                if not built:
                    raise AssertionError(f"the conformance entry of {name!r} built no sample")
                self._built[name] = built
            except ConformanceSkip as e:
                self._built[name] = e
        got = self._built[name]
        if isinstance(got, ConformanceSkip):
            raise ConformanceSkip(str(got))
        return got

    def scratch(self, tag: str) -> Path:
        """A new empty folder."""
        self._n += 1
        p = self.root / "scratch" / f"{self._n}-{tag}"
        p.mkdir(parents=True)
        return p


def run_check(check: str, suite: Suite, name: str) -> None:
    """Run check ``check`` on handler ``name``.

    Raises:
        AssertionError: the handler fails it.
        ConformanceSkip: the check cannot run or does not apply.
    """
    CHECKS[check](suite, name)


# ------------------------------------------------------------------------------ helpers
def _open(sample: Sample, name: str, path: Path | None = None, **extra: Any) -> Any:
    import torchless

    return torchless.open(path if path is not None else sample.path, format=name, **{**sample.open_options, **extra})


def _tensors(art: Any) -> dict[str, Expected]:
    out: dict[str, Expected] = {}
    for n, t in art.tensors():
        assert n not in out, f"tensor name {n!r} listed twice"
        out[n] = Expected.from_torchless(t)
    return out


def assert_same_tensors(
    got: dict[str, Expected], want: dict[str, Expected], what: str, *, got_by: str = "torchless", want_by: str = "oracle"
) -> None:
    """Same names, and per name the same dtype, shape and bytes."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing and not extra, f"{what}: tensors missing {missing[:8]}, unexpected {extra[:8]}"
    for n, w in want.items():
        g = got[n]
        assert (g.dtype, g.shape) == (w.dtype, w.shape), (
            f"{what}: {n}: {got_by} {g.dtype}{list(g.shape)}, {want_by} {w.dtype}{list(w.shape)}"
        )
        if g.data != w.data:
            first = (
                next(i for i, (a, b) in enumerate(zip(g.data, w.data, strict=False)) if a != b)
                if len(g.data) == len(w.data)
                else -1
            )
            raise AssertionError(
                f"{what}: {n}: values differ: {got_by} vs {want_by} "
                f"(first differing byte {first}, {len(g.data)} vs {len(w.data)} bytes)"
            )


def _copy(sample: Sample, dst_dir: Path) -> Path:
    """A copy of the sample in ``dst_dir``; its path."""
    src = sample.path
    if sample.with_folder:
        shutil.copytree(src.parent, dst_dir / src.parent.name)
        return dst_dir / src.parent.name / src.name
    dst = dst_dir / src.name
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)
    return dst


def _error_problems(problems: list[Any]) -> list[Any]:
    return [p for p in problems if getattr(p, "severity", "error") == "error"]


def _cli(argv: list[str]) -> tuple[int, str, str]:
    from ..cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


class _Hang(BaseException):
    """Raised by the CPU-time alarm (a BaseException: handler code must not catch it)."""


@contextlib.contextmanager
def _cpu_budget(seconds: float) -> Iterator[None]:
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(_sig: int, _frame: Any) -> None:
        raise _Hang()

    old = signal.signal(signal.SIGPROF, fire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


def exercise(path: Path, name: str, options: dict[str, Any] | None = None) -> None:
    """What the fuzz check runs on each input: open with handler ``name``, ``info`` as
    JSON, every tensor's values, ``verify``, ``close``."""
    import torchless

    with torchless.open(path, format=name, **(options or {})) as art:
        json.dumps(art.info())
        for _n, t in art.tensors():
            if getattr(t, "storage", None) is not None:
                t.tobytes()
        art.verify()


def truncation_offsets(data: bytes, n: int) -> list[int]:
    """``n``-ish offsets to cut ``data`` at: the first bytes, evenly spread points, the last
    bytes, and the starts of zip records."""
    size = len(data)
    offs = {0, 1, 2, 4, 7, 8, 9, 16, 31, 64, size - 1, size - 2, size - 4, size - 22, size - 23}
    offs.update(size * i // n for i in range(1, n))
    for magic in (b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06", b"PK\x06\x06"):
        i = data.find(magic)
        hits = 0
        while i >= 0 and hits < 4:
            offs.update((i, i + 4, i + 30))
            hits += 1
            i = data.find(magic, i + 1)
    return sorted(o for o in offs if 0 <= o < size)


#: values written over length and offset fields: huge, sign-bit, all ones, zero
_HUGE = (b"\xff\xff\xff\xff", b"\xff\xff\xff\x7f", b"\x00\x00\x00\x80", b"\x00\x00\x00\x00")


def overwrites(data: bytes) -> list[tuple[str, bytes]]:
    """Bad magic and huge lengths: the first 8 bytes zeroed and set to ``0xff`` (a
    safetensors header length of 2**64-1, a broken magic), and the size, offset and
    count fields of the first zip records (local header, central directory entry, end
    of central directory) set to huge and zero values."""
    out = [("magic=00*8", bytes(8) + data[8:]), ("magic=ff*8", b"\xff" * 8 + data[8:])]
    fields = []
    for magic, offs in ((b"PK\x03\x04", (18, 22, 26)), (b"PK\x01\x02", (20, 24, 28, 42)), (b"PK\x05\x06", (8, 10, 12, 16))):
        i = data.find(magic) if magic != b"PK\x05\x06" else data.rfind(magic)
        if i >= 0:
            fields += [(f"{magic[2:].hex()}+{o}", i + o) for o in offs]
    for name, at in fields:
        for v in _HUGE[:2] if len(fields) > 6 else _HUGE:
            if at + 4 <= len(data):
                out.append((f"{name}={v.hex()}", data[:at] + v + data[at + 4 :]))
    return out


# -------------------------------------------------------------------------------- checks
def check_sniff(suite: Suite, name: str) -> None:
    """The handler sniffs its samples, detection picks it, and it refuses the samples of
    every other handler, except those of a handler that sniffs before it (lower
    ``priority``) and is picked by detection: a more specific flavour of the same
    container (a TorchScript archive is also a torch zip)."""
    import torchless

    from ..formats.base import Probe
    from ..formats.registry import handlers

    h = suite.handler(name)
    for s in suite.samples(name):
        assert h.sniff(Probe.of(s.path)), f"{name} does not sniff its own sample {s.label}"
        got = torchless.detect(s.path)
        assert got == name, f"detection picks {got!r} for the {name} sample {s.label}"
    for other in handlers():
        if other.name == name:
            continue
        try:
            theirs = suite.samples(other.name)
        except ConformanceSkip:
            continue
        for s in theirs:
            if h.sniff(Probe.of(s.path)):
                assert other.priority < h.priority, f"{name} claims the {other.name} sample {s.label}"


def check_open(suite: Suite, name: str) -> None:
    """open, tensors, keys, indexing and info work, and info is JSON without help."""
    for s in suite.samples(name):
        with _open(s, name) as art:
            assert art.format == name, f"{s.label}: artifact format {art.format!r}"
            names = [n for n, _ in art.tensors()]
            assert len(names) == len(set(names)), f"{s.label}: a tensor name is listed twice"
            assert list(art.keys()) == names, f"{s.label}: keys() differs from tensors()"
            for n in names[:4]:
                t = art[n]
                assert t.nbytes == t.numel() * t.dtype.itemsize or t.dtype.itemsize == 0, f"{s.label}: {n}: nbytes"
            info = art.info()
            assert isinstance(info, dict), f"{s.label}: info() is a {type(info).__name__}"
            text = json.dumps(info)  # no default=: every value must be JSON already
            assert json.loads(text).get("format") == name, f"{s.label}: info()['format'] is {info.get('format')!r}"


def check_oracle(suite: Suite, name: str) -> None:
    """Every tensor equals the oracle's: names, dtype, shape and every byte."""
    checked = 0
    entry = conformance(name)
    for s in suite.samples(name):
        if s.oracle is not None:
            want = s.oracle()
        elif entry.oracle is not None:
            want = entry.oracle(s.path)
        else:
            assert s.note, f"{s.label}: no oracle and no reason given"
            continue
        with _open(s, name) as art:
            got = _tensors(art)
        assert_same_tensors(got, want, s.label)
        assert want, f"{s.label}: the oracle found no tensor (a sample must hold some)"
        checked += 1
    assert checked, f"no {name} sample has an oracle"


def _default_corrupt(sample: Sample) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        f = sample.target_file(root)
        assert f is not None, f"{sample.label}: a folder sample needs fuzz_file or corrupt"
        data = f.read_bytes()
        f.write_bytes(data[:-1])

    return corrupt


def check_verify(suite: Suite, name: str) -> None:
    """verify passes a good sample; a damaged copy is refused by open or fails verify,
    and the CLI's verify never exits 0 on it."""
    for s in suite.samples(name):
        with _open(s, name) as art:
            errors = _error_problems(art.verify())
        assert not errors, f"{s.label}: verify reports errors on a good sample: {[str(p) for p in errors[:3]]}"
        bad = _copy(s, suite.scratch(f"{name}-corrupt"))
        (s.corrupt or _default_corrupt(s))(bad)
        try:
            with _open(s, name, bad) as art:
                errors = _error_problems(art.verify())
            assert errors, f"{s.label}: verify passes a damaged copy"
        except TorchlessError:
            pass  # refused at open: also a failure to pass it
        rc, out, _err = _cli(["verify", "--format", name, str(bad)])
        assert rc != 0, f"{s.label}: `verify` exits 0 on a damaged copy: {out[-300:]}"
        assert "OK" not in out.split(":")[-1][:4], out


#: more mutators for the fuzz check: ``mutator(data, rng, file_name) -> (description, new
#: bytes)``, each applied ``EXTRA_MUTATIONS`` times per sample (a test suite plugs its own
#: fuzzer in)
MUTATORS: list[Callable[[bytes, random.Random, str], tuple[str, bytes]]] = []
EXTRA_MUTATIONS = 12


def check_fuzz(suite: Suite, name: str, *, truncations: int = 24, flips: int = 24, seed: int = 0) -> None:
    """Truncations at many offsets, bad magic, huge length fields and single-bit flips of
    each sample's fuzz file raise only TorchlessError subclasses, each case within
    CASE_CPU_SECONDS of CPU time."""
    failures: list[str] = []
    cases = 0
    for s in suite.samples(name):
        if s.target_file() is None:
            continue
        work = suite.scratch(f"{name}-fuzz")
        root = _copy(s, work)
        target = s.target_file(root)
        assert target is not None
        orig = target.read_bytes()
        rng = random.Random(f"torchless-conformance:{name}:{s.label}:{seed}")
        muts: list[tuple[str, bytes]] = [(f"truncate@{o}", orig[:o]) for o in truncation_offsets(orig, truncations)]
        muts += overwrites(orig)
        for _ in range(flips):
            bit = rng.randrange(len(orig) * 8)
            buf = bytearray(orig)
            buf[bit // 8] ^= 1 << (bit % 8)
            muts.append((f"bitflip@{bit // 8}.{bit % 8}", bytes(buf)))
        for mutator in MUTATORS:
            for _ in range(EXTRA_MUTATIONS):
                desc, data = mutator(orig, rng, target.name)
                muts.append((f"{getattr(mutator, '__name__', 'mutator')}: {desc[:120]}", data))
        for desc, data in muts:
            target.write_bytes(data)
            cases += 1
            try:
                with _cpu_budget(CASE_CPU_SECONDS):
                    exercise(root, name, s.open_options)
            except TorchlessError:
                pass
            except _Hang:
                failures.append(f"{s.label} {desc}: still running after {CASE_CPU_SECONDS} CPU seconds")
            except Exception as e:  # noqa: BLE001 - the finding this check exists for
                failures.append(f"{s.label} {desc}: {type(e).__name__}: {str(e)[:200]}")
        target.write_bytes(orig)
        shutil.rmtree(work, ignore_errors=True)
    if cases == 0:
        raise ConformanceSkip(f"no {name} sample names a file to fuzz")
    assert not failures, f"{len(failures)} of {cases} mutated inputs raised outside TorchlessError:\n" + "\n".join(failures[:10])


def _write_items(dtypes: tuple[str, ...]) -> dict[str, np.ndarray]:
    import ml_dtypes  # noqa: F401 - registers bfloat16 and float8 with NumPy

    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {}
    for i, dt in enumerate(dtypes):
        shape = (3, 4) if i % 3 else (5,)
        if dt == "bool":
            a = rng.integers(0, 2, shape).astype(bool)
        elif dt.startswith(("int", "uint")):
            info = np.iinfo(dt)
            a = rng.integers(max(info.min, -1000), min(info.max, 1000), shape).astype(dt)
        elif dt.startswith("complex"):
            a = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
        else:
            a = rng.standard_normal(shape).astype(np.float32).astype(dt)
        out[f"layer{i}.{dt}"] = a
    out["scalar"] = np.asarray(1.5, dtype=np.float32)
    out["empty"] = np.zeros((0, 3), dtype=np.float32)
    return out


def _suffix(name: str, entry: Conformance) -> str:
    if entry.write_suffix:
        return entry.write_suffix
    exts = suite_handler_extensions(name)
    return exts[0] if exts else f".{name}"


def suite_handler_extensions(name: str) -> tuple[str, ...]:
    from ..formats.registry import handler

    return tuple(handler(name).extensions)


def check_options(suite: Suite, name: str) -> None:
    """An option the handler does not take is a UsageError, at open (through the API and
    on the handler itself) and at write."""
    import torchless

    h = suite.handler(name)
    s = suite.samples(name)[0]
    for how, call in (
        ("torchless.open", lambda: _open(s, name, no_such_option=1)),
        (f"{type(h).__name__}.open", lambda: h.open(s.path, no_such_option=1)),
    ):
        try:
            call().close()
        except UsageError:
            pass
        else:
            raise AssertionError(f"{name}: {how} accepted an unknown option")
    caps = capabilities(h)
    out = suite.scratch(f"{name}-options")
    if "write_tensors" in caps:
        dst = out / ("x" + _suffix(name, conformance(name)))
        try:
            torchless.write_tensors({"x": np.zeros(3, np.float32)}.items(), dst, format=name, no_such_option=1)
        except UsageError:
            pass
        else:
            raise AssertionError(f"{name}: write_tensors accepted an unknown option")
        assert not os.listdir(out), f"{name}: a refused write left files: {os.listdir(out)}"
    if "write_objects" in caps:
        dst = out / ("y" + _suffix(name, conformance(name)))
        with _open(s, name) as art:
            obj = art.load()
            try:
                torchless.save(obj, dst, format=name, no_such_option=1)
            except UsageError:
                pass
            else:
                raise AssertionError(f"{name}: save accepted an unknown option")
        assert not os.listdir(out), f"{name}: a refused save left files: {os.listdir(out)}"


def _held(paths: list[str]) -> list[str]:
    """File descriptors and memory mappings of this process on ``paths`` (Linux)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if any(target == p or target.startswith(p + os.sep) for p in paths):
            held.append(f"fd {fd} -> {target}")
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            target = parts[5].strip() if len(parts) == 6 else ""
            target = target.removesuffix(" (deleted)")
            if any(target == p or target.startswith(p + os.sep) for p in paths):
                held.append(f"mapping {parts[0]} of {target}")
    return held


def _open_read_close(s: Sample, name: str, p: Path) -> Any:
    """Open ``p``, read every tensor's values, verify, info, close; the closed artifact."""
    art = _open(s, name, p)
    for _n, t in art.tensors():
        if getattr(t, "storage", None) is not None:
            t.tobytes()
    art.verify()
    json.dumps(art.info())
    art.close()
    return art


def _held_paths(s: Sample, p: Path) -> list[str]:
    return [os.path.realpath(p.parent if s.with_folder else p)]


def check_close(suite: Suite, name: str) -> None:
    """After close (values read and dropped), no file descriptor or memory mapping of the
    sample remains (Linux: /proc/self/fd and /proc/self/maps) while the artifact object
    itself is still referenced, as it is after a ``with`` block."""
    if not os.path.isdir("/proc/self/fd"):
        raise ConformanceSkip("needs /proc (Linux)")
    for s in suite.samples(name):
        p = _copy(s, suite.scratch(f"{name}-close"))  # a path nothing else has opened
        art = _open_read_close(s, name, p)
        gc.collect()
        held = _held(_held_paths(s, p))
        del art
        assert not held, f"{s.label}: still open after close(): {held[:4]}"


def check_release(suite: Suite, name: str) -> None:
    """Once a closed artifact is dropped, nothing of the sample stays open: no cache,
    cycle or global keeps a descriptor or a mapping."""
    if not os.path.isdir("/proc/self/fd"):
        raise ConformanceSkip("needs /proc (Linux)")
    for s in suite.samples(name):
        p = _copy(s, suite.scratch(f"{name}-release"))
        art = _open_read_close(s, name, p)
        del art
        gc.collect()
        held = _held(_held_paths(s, p))
        assert not held, f"{s.label}: still open after close() and collection: {held[:4]}"


def check_after_close(suite: Suite, name: str) -> None:
    """What ``close`` does to values: arrays taken before it stay readable and correct
    (they keep their pages mapped, as torch's ``mmap=True`` tensors do) and the file goes
    once the last of them is dropped; a tensor read only after ``close`` raises a
    ``TorchlessError`` (the file is closed) or gives its right values (bytes the handler
    had already copied into memory), nothing else."""
    if not os.path.isdir("/proc/self/fd"):
        raise ConformanceSkip("needs /proc (Linux)")
    for s in suite.samples(name):
        p = _copy(s, suite.scratch(f"{name}-after-close"))
        _read_around_close(s, name, p)
        left = _held(_held_paths(s, p))
        if left:  # a reference cycle, not a reference: the collector frees it (slow with torch loaded)
            gc.collect()
            left = _held(_held_paths(s, p))
        assert not left, f"{s.label}: still open once the arrays taken before close() are dropped: {left[:4]}"


def _read_around_close(s: Sample, name: str, p: Path) -> None:
    """Take every other tensor's array, close, check them and read the others (the
    arrays go when this returns)."""
    with _open(s, name, p) as ref:
        want = {n: Expected.from_torchless(t) for n, t in ref.tensors() if getattr(t, "storage", None) is not None}
    art = _open(s, name, p)
    tensors = [(n, t) for n, t in art.tensors() if n in want]
    held = {n: t.numpy(raw=True) for n, t in tensors[::2]}
    art.close()
    for n, a in held.items():
        assert np.ascontiguousarray(a).tobytes() == want[n].data, f"{s.label}: {n}: an array taken before close() changed"
    for n, t in tensors[1::2]:
        try:
            got = t.tobytes()
        except TorchlessError:
            continue
        assert got == want[n].data, f"{s.label}: {n}: read after close() gives wrong values"
    try:
        list(art.tensors())
    except TorchlessError:
        pass  # refused: the file is closed
    except Exception as e:  # noqa: BLE001 - the check: nothing but a TorchlessError
        raise AssertionError(f"{s.label}: tensors() after close() raised {type(e).__name__}: {e}") from e


def check_roundtrip(suite: Suite, name: str) -> None:
    """Tensors written by the handler read back equal; objects saved by it keep their tensors."""
    import torchless

    h = suite.handler(name)
    entry = conformance(name)
    caps = capabilities(h)
    if not caps & {"write_tensors", "write_objects"}:
        raise ConformanceSkip(f"{name} is read-only (declares no writer)")
    out = suite.scratch(f"{name}-roundtrip")
    if "write_tensors" in caps:
        items = _write_items(entry.write_dtypes)
        dst = out / ("rt" + _suffix(name, entry))
        files = torchless.write_tensors(items.items(), dst, format=name, **entry.write_options)
        assert files and all(os.path.exists(f) for f in files), f"{name}: write_tensors returned {files}"
        want = {k: Expected.from_numpy(v) for k, v in items.items()}
        with torchless.open(files[-1], format=name) as art:
            got = _tensors(art)
        assert_same_tensors(got, want, f"{name} write_tensors", want_by="written")
        if entry.oracle is not None:  # and the reference tool reads the same
            ref = {k: v for k, v in want.items() if v.dtype not in entry.oracle_lacks}
            got = {k: v for k, v in entry.oracle(Path(files[-1])).items() if k in ref}
            assert_same_tensors(got, ref, f"{name} write_tensors", got_by="oracle", want_by="written")
    if "write_objects" in caps:
        for i, s in enumerate(suite.samples(name)):
            with _open(s, name) as art:
                want = _tensors(art)
                obj = entry.roundtrip_object(art) if entry.roundtrip_object else art.load()
                dst = out / (f"obj{i}" + _suffix(name, entry))
                torchless.save(obj, dst, format=name)
            with torchless.open(dst, format=name, **s.open_options) as art2:
                got = _tensors(art2)
            assert_same_tensors(got, want, f"{s.label} saved again", want_by="source")
            if entry.oracle is not None:
                assert_same_tensors(entry.oracle(dst), want, f"{s.label} saved again", got_by="oracle", want_by="source")


def replacement_values(t: Any) -> np.ndarray:
    """New values for tensor ``t`` (same dtype and shape, different from a typical
    checkpoint's): a small repeating integer ramp."""
    a = t.numpy()
    if a.dtype == np.bool_:
        return (np.arange(a.size) % 2 == 0).reshape(a.shape)
    return ((np.arange(a.size) % 7) - 3 if a.dtype.kind != "u" else np.arange(a.size) % 7).astype(a.dtype).reshape(a.shape)


def check_edit(suite: Suite, name: str) -> None:
    """Handlers declaring ``edit`` replace every tensor of a sample in a new file; the new
    file reads back with the new values (torchless and the oracle), the source is unchanged."""
    import torchless

    if "edit" not in capabilities(suite.handler(name)):
        raise ConformanceSkip(f"{name} declares no edit")
    entry = conformance(name)
    assert entry.edit is not None, f"{name} declares edit but its conformance entry has no edit hook"
    for i, s in enumerate(suite.samples(name)):
        src = _copy(s, suite.scratch(f"{name}-edit"))
        before = src.read_bytes() if src.is_file() else None
        with torchless.open(src, format=name, **s.open_options) as art:
            new = {n: replacement_values(t) for n, t in art.tensors() if getattr(t, "storage", None) is not None}
        dst = src.parent / f"edited{i}{src.suffix}"
        entry.edit(src, dst, new)
        want = {k: Expected.from_numpy(v) for k, v in new.items()}
        with torchless.open(dst, format=name, **s.open_options) as art:
            got = {k: v for k, v in _tensors(art).items() if k in want}
        assert_same_tensors(got, want, f"{s.label} edited", want_by="new values")
        if entry.oracle is not None:
            ref = {k: v for k, v in entry.oracle(dst).items() if k in want}
            assert_same_tensors(ref, want, f"{s.label} edited", got_by="oracle", want_by="new values")
        if before is not None:
            assert src.read_bytes() == before, f"{s.label}: editing into a new file changed the source"


def check_cli(suite: Suite, name: str) -> None:
    """info, info --json, ls --json and verify exit 0; the JSON lists the same tensors."""
    for s in suite.samples(name):
        p = str(s.path)
        rc, _out, err = _cli(["info", p])
        assert rc == 0, f"{s.label}: `info` exits {rc}: {err[-300:]}"
        rc, out, err = _cli(["info", "--json", p])
        assert rc == 0, f"{s.label}: `info --json` exits {rc}: {err[-300:]}"
        assert json.loads(out).get("format") == name
        rc, out, err = _cli(["ls", "--json", p])
        assert rc == 0, f"{s.label}: `ls --json` exits {rc}: {err[-300:]}"
        with _open(s, name) as art:
            names = [n for n, _ in art.tensors()]
        assert [r["name"] for r in json.loads(out)] == names, f"{s.label}: `ls --json` lists other tensors than tensors()"
        rc, out, err = _cli(["verify", p])
        assert rc == 0, f"{s.label}: `verify` exits {rc}: {(out + err)[-300:]}"


#: check name -> function
CHECKS: dict[str, Callable[[Suite, str], None]] = {
    "sniff": check_sniff,
    "open": check_open,
    "oracle": check_oracle,
    "verify": check_verify,
    "fuzz": check_fuzz,
    "options": check_options,
    "close": check_close,
    "release": check_release,
    "after-close": check_after_close,
    "roundtrip": check_roundtrip,
    "edit": check_edit,
    "cli": check_cli,
}
