"""Which loader reads these bytes as what: carriers recognised the way their loaders do.

Each supported loader decides by the first bytes (never by the name):

* ``torch.load`` (torch 2.13 ``serialization.py``): ``PK\\x03\\x04`` -> zip (miniz);
  otherwise, for a real file at offset 0, ``tarfile.open(fileobj=f, mode="r:")`` -> the
  legacy tar layout (any header ``tarfile`` accepts, with or without ``ustar`` magic);
  otherwise pickles (the legacy stream). In-memory buffers (``io.BytesIO``, DCP slices,
  ``_load_from_bytes``) have no ``fileno()``, so torch never tries ``tarfile`` on them.
* ``numpy.load``: ``PK\\x03\\x04`` or ``PK\\x05\\x06`` -> ``.npz`` through Python's
  ``zipfile``; ``\\x93NUMPY`` -> ``.npy``; otherwise ``pickle.load`` (allow_pickle=True).
* ``joblib.load`` (joblib 1.x ``compressor.py``): its prefix table, in order: ``ZF``
  (pre-0.9.3 zfile), ``\\x78`` zlib, ``\\x1f\\x8b`` gzip, ``BZ`` bz2, ``\\x5d\\x00`` lzma
  (alone), ``\\xfd7zXZ`` xz, ``\\x04\\x22\\x4d\\x18`` lz4; otherwise a pickle.
* ``pickle.load``: any bytes; whether anything executes is decided by the real unpickler
  (:func:`probe_pickle`).

Beyond the loaders' own tables, every header the ``lzma`` module accepts (``.lzma`` alone
with any properties byte, ``.xz``) and zlib with any valid header are inflated too, so a
payload that a user's ``pickle.loads(lzma.decompress(...))`` would run is still analysed.
"""

from __future__ import annotations

import lzma
import zlib
from dataclasses import dataclass

from ...core.npyheader import MAGIC as NPY_MAGIC
from ...formats.joblib_spec import COMPRESSOR_PREFIXES as JOBLIB_PREFIXES
from ...formats.npz_spec import ZIP_MAGICS
from ...formats.pt.spec import LEGACY_MAGIC, opens_as_tar
from ...io.source import ByteSource

__all__ = [
    "Probe",
    "probe_pickle",
    "compressor_of",
    "opens_as_tar",
    "MODEL_SUFFIXES",
    "NPY_MAGIC",
    "ZIP_MAGICS",
    "JOBLIB_PREFIXES",
]

# NPY_MAGIC (core.npyheader), ZIP_MAGICS (numpy.load's test; torch tests the first only:
# formats.npz_spec), JOBLIB_PREFIXES (joblib's prefix table: formats.joblib_spec) and the
# tar sniff (formats.pt.spec) are the formats' own facts, imported.

#: names that say "a pickle-based model": such a file that no carrier recognises is
#: reported UNANALYSABLE even when no supported loader would run anything from it.
#: (Not ``.bin``/``.model``: ONNX external data, sentencepiece and GGML files use them.)
MODEL_SUFFIXES = (
    ".pt",
    ".pth",
    ".pt2",
    ".ptl",
    ".ckpt",
    ".pkl",
    ".pickle",
    ".pck",
    ".pcl",
    ".joblib",
    ".jbl",
    ".npy",
    ".npz",
    ".distcp",
    ".tar",
    ".sav",
    ".dill",
    ".mar",
    ".nemo",
    ".torchscript",
)

_PROBE_WINDOW = 1 << 20  # bytes the real unpicklers probe
_FIRST_WINDOW = 1 << 16  # probed first (the block detection reads); see probe_pickle
_PY_MARGIN = 4096  # bytes past the C unpickler's stop the pure-Python one is run over
_LINE_OPS = frozenset(
    b"cFgILPpSVi"
)  # opcodes whose argument is a line of text (GLOBAL, FLOAT, GET, INT, LONG, PERSID, PUT, STRING, UNICODE, INST)
_MAX_MODULE = 4096  # longer than any path a module could be imported from (PATH_MAX)
_MAX_LINE_WINDOW = 64 << 20  # a first line up to this long is probed whole


@dataclass
class Probe:
    """What the real unpicklers do with a stream that starts at byte 0.

    ``outcome``: ``resolves`` (a global would be imported: the stream matters),
    ``data`` (a complete pickle of plain data; ``legacy`` when it is torch's magic
    number, so torch reads further pickles), ``stops`` (both unpicklers raise before
    importing anything: no loader executes a thing from these bytes), ``undecided``
    (the probe window ended, or the probe hit a resource limit).
    """

    outcome: str
    detail: str = ""
    legacy: bool = False
    pos: int = 0  # where the unpickler stopped (about: the bytes it consumed)
    py_cost: int = 0  # bytes the pure-Python unpickler was run over (for the scan's budget)
    timeout: bool = False  # the engine's child hit its wall-clock watchdog (reported as such)

    @property
    def inert(self) -> bool:
        return self.outcome == "stops"


def _one(kind: str, data: bytes, complete: bool) -> Probe:
    """The real unpicklers on ``data`` with a ``find_class`` that never imports, run in the
    scan's resource-limited engine child (:mod:`torchless.scan.engine`: they allocate
    what a stream asks for, a memo key of 2**30 is a 16 GiB array). ``kind`` ``"c"``:
    CPython's C unpickler through every reader the loaders use (bytes, io.BytesIO, a
    buffered file, a zip member: frames make them read different bytes); ``"py"``: the
    pure-Python one. Where the child cannot answer, the probe is ``undecided``."""
    from .. import engine

    w = engine.shared_worker()
    got = w.probe(bytes(data), complete, kind)
    if got is None and w.timed_out:
        return Probe("undecided", f"the real unpicklers gave no answer within {w.timeout:.0f} s", timeout=True)
    if got is None:
        return Probe("undecided", "the real unpicklers ran out of their memory or CPU limits on it")
    outcome, detail, value, pos = got
    return Probe(outcome, detail, legacy=value == LEGACY_MAGIC, pos=int(pos))


def probe_pickle(src: ByteSource, *, window: int = _PROBE_WINDOW, py_limit: int = _PROBE_WINDOW) -> Probe:
    """Run CPython's C unpickler (through every reader the loaders use) and its
    pure-Python one (joblib's base) on the stream at byte 0 with a ``find_class`` that
    never imports, in the engine's resource-limited child: does any loader import anything?

    The pure-Python unpickler runs only to confirm a stop of the C one, on the bytes the C
    one consumed (plus a margin) and at most ``py_limit`` bytes (the scan's budget): when
    it cannot confirm, the outcome is ``undecided`` (the stream is then analysed).

    The unpicklers first get the first 64 KiB (the block detection already read: a remote
    file is not fetched again); their answer stands when they ended more than the
    pure-Python margin before that window's end, where the rest of the window could not
    have changed it (they read sequentially, and no line they read was cut by the
    window). Otherwise the whole window is probed."""
    if src.size > _FIRST_WINDOW and window > _FIRST_WINDOW:
        data = src.read_at(0, _FIRST_WINDOW)
        c = _one("c", data, False)
        if c.outcome in ("resolves", "data", "stops") and c.pos + _PY_MARGIN <= _FIRST_WINDOW:
            if c.outcome != "stops":
                return c
            m = c.pos + _PY_MARGIN
            if m <= py_limit:
                py = _one("py", data[:m], False)
                if py.outcome == "resolves":
                    return Probe(py.outcome, py.detail + " (pure-Python unpickler, which joblib uses)", py_cost=m)
                if py.outcome == "data":
                    return Probe("data", py.detail + " (pure-Python unpickler, which joblib uses)", legacy=py.legacy, py_cost=m)
                if py.outcome == "stops":
                    c.py_cost = m
                    return c
    return _probe_window(src, window, py_limit)


def _probe_window(src: ByteSource, window: int, py_limit: int) -> Probe:
    n = min(src.size, window)
    data = src.read_at(0, n)
    complete = n == src.size
    c = _one("c", data, complete)
    long_line = 0  # bytes of a first line read in one opcode (no per-byte work for the probes)
    if c.outcome == "undecided" and not complete and data and data[0] in _LINE_OPS:
        # the first opcode reads a line that runs past the window (a safetensors header
        # length or tensor bytes that happen to start with 'c', 'S' ...): decide by the line
        nl = src.searchable().find(b"\n", 1)
        nl = src.size if nl < 0 else nl
        if data[:1] in b"ci" and nl > _MAX_MODULE:
            return Probe("stops", f"GLOBAL/INST module name of {nl} bytes: no importable module has such a name")
        n2 = min(src.size, nl + 1 + window)
        if nl >= n and n2 <= _MAX_LINE_WINDOW:
            n, data, long_line = n2, src.read_at(0, n2), nl
            complete = n == src.size
            c = _one("c", data, complete)
    if c.outcome != "stops":
        return c  # resolves / undecided: analysed; data: analysed by the machine anyway
    m = min(n, c.pos + _PY_MARGIN)
    if m - long_line > py_limit:
        return Probe("undecided", f"{c.detail}; the pure-Python unpickler was not run (budget)")
    py = _one("py", data[:m], complete and m == n)
    cost = max(0, m - long_line)
    if py.outcome in ("resolves", "undecided"):
        return Probe(py.outcome, py.detail + " (pure-Python unpickler, which joblib uses)", py_cost=cost, timeout=py.timeout)
    if py.outcome == "data":
        return Probe("data", py.detail + " (pure-Python unpickler, which joblib uses)", legacy=py.legacy, py_cost=cost)
    c.py_cost = cost
    return c


def compressor_of(head: bytes) -> tuple[str, str] | None:
    """(kind, who reads it) of a compressed stream: joblib's prefix table first, then any
    other header the ``lzma``/``zlib`` modules accept."""
    for prefix, kind in JOBLIB_PREFIXES:
        if head.startswith(prefix):
            return kind, "joblib.load"
    if len(head) >= 13 and head[0] < 225 and head[13:14] == b"\x00":
        try:  # .lzma "alone" header with any properties byte: the decoder says
            lzma.LZMADecompressor(lzma.FORMAT_ALONE, memlimit=256 << 20).decompress(head[:64], 1)
            return "lzma", "lzma.decompress"
        except lzma.LZMAError as e:
            if "memory" in str(e).lower():  # a valid header asking for a huge dictionary: lzma.decompress goes on
                return "lzma", "lzma.decompress"
    if len(head) >= 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and (head[0] * 256 + head[1]) % 31 == 0:
        try:
            zlib.decompressobj().decompress(head[:64], 1)
            return "zlib", "zlib.decompress"
        except zlib.error:
            pass
    return None
