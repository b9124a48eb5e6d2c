"""Zip layouts that torch (miniz) and Python's ``zipfile`` (NumPy, most tools) read differently.

:func:`zip_differentials` reads an archive with both models
(:class:`~torchless.container.zip.ZipReader`, :class:`~torchless.container.pyzip.PyZipReader`)
and reports every way the two could see different archives, whether or not the members
differ today: an end record one of them does not find, a zip64 record only one follows
(miniz looks for the locator only when the end record sits at offset >= 76 and reads the
record where the locator points; zipfile reads it at ``eocd - 76``), classic and zip64
records that disagree, bytes between the central directory and the end record (zipfile
assumes none and shifts every offset by them), data before the archive, entries beyond
the end record's count, and names that select different entries.
"""

from __future__ import annotations

import struct
from typing import Any

from ..core.errors import TorchlessError
from ..core.findings import Problem
from ..io.source import open_source
from .pyzip import PyZipReader
from .zip import EOCD64_RECORD, EOCD_RECORD, LOC64_RECORD, LOC64_SIG, MAX32, ZipReader

__all__ = ["zip_differentials"]

CODE = "zip-reader-differential"


def _p(msg: str, offset: int | None = None, member: str | None = None) -> Problem:
    return Problem(CODE, msg, member, offset, "error")


def zip_differentials(source: Any) -> list[Problem]:
    """Every way miniz (torch) and CPython's ``zipfile`` (NumPy) could read ``source``
    as different archives; an empty list means both see the same members at the same
    bytes. Never raises for bad input (a reader that refuses is itself a finding when the
    other reads the file)."""
    src = open_source(source)
    out: list[Problem] = []
    mz: ZipReader | None = None
    py: PyZipReader | None = None
    mz_err = py_err = None
    try:
        mz = ZipReader(src, require_prefix=False)
    except TorchlessError as e:
        mz_err = e
    try:
        py = PyZipReader(src)
    except TorchlessError as e:
        py_err = e
    if mz is None and py is None:
        return out
    if mz is None or py is None:
        who, other, err = (
            ("Python's zipfile", "torch (miniz)", mz_err) if mz is None else ("torch (miniz)", "Python's zipfile", py_err)
        )
        n = len(py.entries) if py is not None else len(mz.entries) if mz is not None else 0
        if n:
            out.append(_p(f"{who} reads an archive of {n} entries that {other} refuses ({err.message if err else '?'})"))
        return out
    _end_records(src, mz, py, out)
    if py.concat:
        out.append(
            _p(
                f"Python's zipfile shifts every offset by {py.concat} bytes (data before the archive or "
                "between the central directory and the end record); torch reads the offsets as written",
                py.cd_offset,
            )
        )
    end_start = mz.eocd64_offset if mz.zip64 and mz.eocd64_offset is not None else mz.eocd_offset
    cd_end = mz.cd_offset + mz.cd_size
    if cd_end != end_start:
        out.append(
            _p(
                f"the central directory ends at {cd_end}, the end records start at {end_start}: zipfile assumes they "
                "touch and shifts offsets by the difference",
                min(cd_end, end_start),
            )
        )
    if mz.cd_offset != py.cd_offset or mz.cd_size != py.cd_size:
        out.append(
            _p(
                f"torch reads the central directory at {mz.cd_offset} ({mz.cd_size} "
                f"bytes), Python's zipfile at {py.cd_offset} ({py.cd_size} bytes)",
                py.cd_offset,
            )
        )
    if len(mz.entries) != len(py.entries):
        out.append(
            _p(
                f"torch lists {len(mz.entries)} entries, Python's zipfile {len(py.entries)} (the end record's count "
                "and the directory's size disagree)",
                mz.cd_offset + mz.cd_used,
            )
        )
    _members(mz, py, out)
    return out


def _end_records(src: Any, mz: ZipReader, py: PyZipReader, out: list[Problem]) -> None:
    if mz.eocd_offset != py.eocd_offset:
        out.append(
            _p(
                f"two end records: torch uses the one at {mz.eocd_offset}, Python's zipfile the one at {py.eocd_offset}",
                py.eocd_offset,
            )
        )
    eocd = mz.eocd_offset
    has_loc = eocd >= LOC64_RECORD.size and src.read_at(eocd - LOC64_RECORD.size, 4) == LOC64_SIG
    if has_loc:
        target = struct.unpack("<Q", src.read_at(eocd - 12, 8))[0]
        fixed = eocd - LOC64_RECORD.size - EOCD64_RECORD.size
        if eocd < LOC64_RECORD.size + EOCD64_RECORD.size:
            out.append(
                _p(
                    f"a zip64 locator before an end record at offset {eocd} (< 76): torch ignores it, Python's zipfile does not",
                    eocd - LOC64_RECORD.size,
                )
            )
        elif target != fixed:
            out.append(
                _p(
                    f"the zip64 locator points at {target}, but Python's zipfile reads the zip64 record at {fixed}",
                    eocd - LOC64_RECORD.size,
                )
            )
        if mz.zip64 != py.zip64:
            out.append(
                _p(
                    f"{'torch' if mz.zip64 else 'Python zipfile'} follows the zip64 end "
                    f"record, {'Python zipfile' if mz.zip64 else 'torch'} does not",
                    eocd - LOC64_RECORD.size,
                )
            )
    if mz.zip64:
        # a reader that ignores the zip64 record sees the classic values
        _s, disk, cd_disk, n_disk, n_total, cd_size, cd_off, _c = EOCD_RECORD.unpack(src.read_at(eocd, EOCD_RECORD.size))
        rec = EOCD64_RECORD.unpack(src.read_at(mz.eocd64_offset, EOCD64_RECORD.size))
        pairs = [
            ("entry count", n_total, rec[7], 0xFFFF),
            ("directory size", cd_size, rec[8], MAX32),
            ("directory offset", cd_off, rec[9], MAX32),
        ]
        for what, classic, z64, sentinel in pairs:
            if classic != sentinel and classic != z64:
                out.append(
                    _p(
                        f"classic and zip64 end records disagree on the {what} ({classic} "
                        f"vs {z64}): readers that ignore zip64 see another archive",
                        eocd,
                    )
                )


def _members(mz: ZipReader, py: PyZipReader, out: list[Problem]) -> None:
    seen: set[str] = set()
    for pe in py.entries:
        name = pe.filename
        if name in seen:
            continue
        seen.add(name)
        last = py.name_to_info[name]
        if last is not pe:
            out.append(
                _p(f"several entries named {name!r}: Python's zipfile reads the last, torch's sorted lookup another", member=name)
            )
        me = mz.lookup(name, full=True)
        if me is None:
            out.append(_p(f"Python's zipfile lists {name!r}, torch finds no such record", member=name))
            continue
        try:
            a = (mz.data_offset(me), me.compressed_size, me.size, me.method)
        except TorchlessError:
            a = None
        try:
            b = (py.data_offset(last), last.compress_size, last.file_size, last.compress_type)
        except TorchlessError:
            b = None
        if a != b:
            out.append(_p(f"{name!r} is read from different bytes: torch {a}, Python's zipfile {b}", b[0] if b else None, name))
    for me in mz.entries:
        n = me.name
        if n.split("\x00", 1)[0] not in seen and n not in seen:
            out.append(_p(f"torch lists {n!r}, Python's zipfile does not", member=n))
