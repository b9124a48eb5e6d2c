"""Shared libraries and object files of any of the three platforms, by magic number.

:mod:`.elf` (Linux), :mod:`.macho` (macOS) and :mod:`.pe` (Windows) each parse one format
into an :class:`~.elf.ElfInfo`; this module picks the parser (the two others build on
``elf``'s types, so the choice lives above all three).
"""

from __future__ import annotations

from ...core.errors import FormatError
from . import macho, pe
from .elf import ELF_MAGIC, ElfInfo, parse_elf

__all__ = ["parse_binary"]


def parse_binary(data: memoryview | bytes, *, name: str = "<so>", member: str | None = None) -> ElfInfo:
    """Parse an ELF, Mach-O (macOS) or PE/COFF (Windows) shared object or object file by
    its magic number; never loaded. See :func:`.elf.parse_elf`, :func:`.macho.parse_macho`,
    :func:`.pe.parse_pe`.

    Raises:
        FormatError: none of the three.
    """
    head = bytes(memoryview(data)[:4])
    if head == ELF_MAGIC:
        return parse_elf(data, name=name, member=member)
    if macho.is_macho(head):
        return macho.parse_macho(data, name=name, member=member)
    if pe.is_pe(data):
        return pe.parse_pe(data, name=name, member=member)
    raise FormatError(
        "not an ELF, Mach-O or PE/COFF file",
        path=name,
        member=member,
        expected="\\x7fELF, a Mach-O magic, MZ or a COFF object header",
        found=repr(head),
    )
