"""Shared libraries and object files of any of the three platforms, by magic number.

:mod:`.elf` (Linux), :mod:`.macho` (macOS) and :mod:`.pe` (Windows) each parse one format
into an :class:`~.elf.ElfInfo`; this module picks the parser (the two others build on
``elf``'s types, so the choice lives above all three).
"""

from __future__ import annotations

from ...core.errors import FormatError, TorchlessError
from ...io.source import ByteSource
from . import macho, pe
from .elf import ELF_MAGIC, ElfInfo, as_source, parse_elf

__all__ = ["parse_binary"]


def parse_binary(data: ByteSource | memoryview | bytes, *, name: str = "<so>", member: str | None = None) -> ElfInfo:
    """Parse an ELF, Mach-O (macOS) or PE/COFF (Windows) shared object or object file by
    its magic number; never loaded. See :func:`.elf.parse_elf`, :func:`.macho.parse_macho`,
    :func:`.pe.parse_pe`.

    ``data`` is the file's bytes or a ByteSource over them: the parsers read the headers
    and tables they need by ranges (a stored record of a remote archive is not fetched
    whole), each checked against the file's size first.

    Raises:
        FormatError: none of the three.
        TorchlessError: a header or table that lies outside the file (naming ``name``,
            ``member`` and the offset).
    """
    src = as_source(data, name)
    head = src.read_at(0, min(4, src.size), what="magic number")
    try:
        if head == ELF_MAGIC:
            return parse_elf(src, name=name, member=member)
        if macho.is_macho(head):
            return macho.parse_macho(src, name=name, member=member)
        if pe.is_pe(src):
            return pe.parse_pe(src, name=name, member=member)
    except TorchlessError as err:
        err.with_context(path=name, member=member)
        raise
    raise FormatError(
        "not an ELF, Mach-O or PE/COFF file",
        path=name,
        member=member,
        expected="\\x7fELF, a Mach-O magic, MZ or a COFF object header",
        found=repr(head),
    )
