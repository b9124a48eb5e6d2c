"""Nested payloads: bytes a pickle hands to a loader at load time ("nested-loader" edges).

A global that deserialises its argument (:data:`~torchless.scan.policy.NESTED_LOADERS`:
``torch.storage._load_from_bytes``, ``torch.load``, ``pickle.loads``, ``numpy.load``,
``joblib.load`` ...) is an edge to a second carrier. The argument is evaluated as far as
it is a concrete value (bytes, a protocol-0 string, ``io.BytesIO(...)``,
``_codecs.encode(str, 'latin1')``, ``bytes(...)``/``bytearray(...)``, base64/hex, zlib
and the other decompressors) and the payload is scanned as a carrier of its own with the
loader named, *whatever its first bytes*. An argument computed at load time is
``unanalysable``. Each payload is analysed once per scan (keyed by content), however many
times the pickle passes it.
"""

from __future__ import annotations

import base64
import binascii
import bz2
import hashlib
import lzma
import os
import zlib
from typing import Any

from ..analysis import StreamResult, Sym, describe
from ..policy import NESTED_LOADERS
from .common import Carrier

__all__ = ["NestedCarrier", "concrete_bytes"]

#: nested loaders whose argument is a file object (or a path), not bytes
_FILE_ARG = frozenset(
    q
    for q in NESTED_LOADERS
    if q.rsplit(".", 1)[-1] in ("load", "_load", "_legacy_load", "Unpickler", "_Unpickler", "read_pickle")
)
_TEXT_CODECS = {
    "latin1",
    "latin-1",
    "iso-8859-1",
    "iso8859-1",
    "l1",
    "utf-8",
    "utf8",
    "ascii",
    "us-ascii",
    "raw_unicode_escape",
    "unicode_escape",
}
_DECOMPRESS = {"zlib.decompress", "gzip.decompress", "bz2.decompress", "lzma.decompress", "_bz2.decompress"}
_MAX_EVAL = 256 << 20  # bytes one evaluated argument may grow to


def _args(s: Sym) -> tuple[Any, ...]:
    return s.args if isinstance(s.args, tuple) else (s.args,)


def concrete_bytes(v: Any, depth: int = 0) -> tuple[bytes | None, str]:
    """The bytes a loader would read from ``v``, when ``v`` is concrete; else (None, why)."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v), "bytes"
    if isinstance(v, str):
        try:
            return v.encode("latin-1"), "a str (its latin-1 bytes: protocol-0 STRING)"
        except UnicodeEncodeError:
            return v.encode("utf-8", "surrogatepass"), "a str (its UTF-8 bytes)"
    if isinstance(v, list) and len(v) <= _MAX_EVAL and all(type(x) is int and 0 <= x < 256 for x in v):
        return bytes(v), "a list of byte values"
    if not isinstance(v, Sym) or v.kind != "result" or v.callee is None or v.callee.kind != "global" or depth > 8:
        return None, describe(v)
    q = v.callee.qualname
    a = _args(v)
    try:
        if q in ("io.BytesIO", "_io.BytesIO", "io.BufferedReader", "io.BufferedRandom"):
            return concrete_bytes(a[0], depth + 1) if a else (b"", "an empty BytesIO")
        if q in ("_codecs.encode", "codecs.encode", "builtins.bytes", "builtins.bytearray") and a:
            if isinstance(a[0], str):
                enc = a[1] if len(a) > 1 else "utf-8"
                if isinstance(enc, str) and enc.lower() in _TEXT_CODECS:
                    return a[0].encode(enc), f"{q}(str, {enc!r})"
                return None, f"{q} with encoding {describe(enc)}"
            if q.startswith("builtins."):
                inner, how = concrete_bytes(a[0], depth + 1)
                return inner, f"{q}({how})"
        if q in ("base64.b64decode", "base64.standard_b64decode", "binascii.a2b_base64", "base64.decodebytes") and a:
            inner, how = concrete_bytes(a[0], depth + 1)
            return (base64.b64decode(inner) if inner is not None else None), f"{q}({how})"
        if q in ("binascii.unhexlify", "binascii.a2b_hex", "builtins.bytes.fromhex") and a:
            inner, how = concrete_bytes(a[0], depth + 1)
            return (binascii.unhexlify(inner) if inner is not None else None), f"{q}({how})"
        if q in _DECOMPRESS and a:
            inner, how = concrete_bytes(a[0], depth + 1)
            if inner is None:
                return None, how
            if q.startswith("zlib"):
                d = zlib.decompressobj(a[1] if len(a) > 1 and type(a[1]) is int else 15)
                return d.decompress(inner, _MAX_EVAL), f"{q}({how})"
            if q.startswith("gzip"):
                return zlib.decompressobj(31).decompress(inner, _MAX_EVAL), f"{q}({how})"
            if "bz2" in q:
                return bz2.BZ2Decompressor().decompress(inner, _MAX_EVAL), f"{q}({how})"
            return lzma.LZMADecompressor(memlimit=256 << 20).decompress(inner, _MAX_EVAL), f"{q}({how})"
    except (ValueError, TypeError, zlib.error, lzma.LZMAError, OSError, EOFError, binascii.Error, IndexError, LookupError) as e:
        return None, f"{q}(...) that fails when evaluated ({type(e).__name__})"
    return None, f"the result of {describe(v)}, computed at load time"


class NestedCarrier(Carrier):
    """A carrier run by the scan engine (:class:`~torchless.scan.carriers.base.ScanEngine`): follows nested-loader edges."""

    def follow_nested(self, res: StreamResult, member: str | None, base: int | None, depth: int) -> None:
        """Scan every payload this stream hands to a loader (see the module docstring)."""
        where = member or os.path.basename(self.engine.path)

        def fo(off: int | None) -> int | None:
            return None if base is None or off is None else base + off

        for c in res.calls:
            callee = c.callee
            if callee.kind != "global" or callee.qualname not in NESTED_LOADERS:
                continue
            loader, idx, what = NESTED_LOADERS[callee.qualname]
            if idx is None:
                continue  # wrappers whose payload follows in the stream: reported at BUILD below
            args = c.args if isinstance(c.args, tuple) else (c.args,)
            arg = args[idx] if idx < len(args) else None
            if arg is None and isinstance(c.kwargs, dict):
                arg = next(
                    (c.kwargs[k] for k in ("file", "f", "data", "b", "filepath_or_buffer", "filename") if k in c.kwargs), None
                )
            if callee.qualname in _FILE_ARG and isinstance(arg, str):
                self.engine.add(
                    "unanalysable",
                    "high",
                    f"{callee.qualname} ({what}) reads the file {arg[:200]!r} named in the "
                    "pickle: bytes outside the artifact that the scanner does not read",
                    member,
                    c.offset,
                    fo(c.offset),
                    callee.qualname,
                    loader=loader,
                )
                continue
            payload, how = concrete_bytes(arg)
            if payload is None:
                self.engine.add(
                    "unanalysable",
                    "high",
                    f"{callee.qualname} ({what}) deserialises its argument with {loader}, "
                    f"but the argument is {how}: the payload cannot be analysed",
                    member,
                    c.offset,
                    fo(c.offset),
                    callee.qualname,
                    loader=loader,
                )
                continue
            self.nested_payload(
                payload,
                f"{where} > payload of {callee.qualname} at {c.offset:#x}",
                depth,
                loader,
                f"{callee.qualname} at {c.offset:#x} passes {how} ({len(payload)} bytes) to {loader}",
                member,
                c.offset,
            )
        skipped = {p for p, _n in res.skips}  # joblib view: these wrappers' bytes were modelled
        for b in res.builds:
            t = b.callee
            cls = t.callee if t.kind == "result" and t.callee is not None else t
            if b.offset + 1 in skipped:
                continue
            if cls.kind == "global" and cls.qualname in NESTED_LOADERS and NESTED_LOADERS[cls.qualname][1] is None:
                loader, _i, what = NESTED_LOADERS[cls.qualname]
                self.engine.add(
                    "unanalysable",
                    "high",
                    f"{cls.qualname}: {what}; the scanner does not model those bytes, so "
                    "what follows this BUILD is not analysed as the loader reads it",
                    member,
                    b.offset,
                    fo(b.offset),
                    cls.qualname,
                    loader=loader,
                )
        for g in res.globals:
            if g.qualname in NESTED_LOADERS and not g.called and NESTED_LOADERS[g.qualname][1] is not None:
                loader = NESTED_LOADERS[g.qualname][0]
                self.engine.add(
                    "unanalysable",
                    "high",
                    f"{g.qualname} (a nested loader: {NESTED_LOADERS[g.qualname][2]}) is referenced "
                    "but not called directly, so what it deserialises cannot be followed",
                    member,
                    g.offset,
                    fo(g.offset),
                    g.qualname,
                    loader=loader,
                )
        for op, blob, off in res.nested:  # bytes in any call that look like a carrier
            self.nested_payload(blob, f"{where} > bytes passed to {op} at {off:#x}", depth, None, None, member, off)

    def nested_payload(
        self, blob: bytes, sub: str, depth: int, loader: str | None, note: str | None, member: str | None, off: int | None
    ) -> None:
        """Scan ``blob`` (once per scan, by content) as bytes ``loader`` reads from memory."""
        if not self.engine.budget.once(("payload", hashlib.sha256(blob).digest())):
            return
        if note:
            self.engine.add(
                "nested-loader", "info", f"followed: {note}; analysed as a carrier of its own", member, off, loader=loader
            )
        self.engine.scan_bytes(blob, sub, None, depth + 1, context="memory", loader=loader)
