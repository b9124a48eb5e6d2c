"""Eager checkpoint layouts (``torch.save``): magic numbers, record names, sniffers.

Spec: ``pt.md`` §1 (zip), §2 (legacy stream), §3 (legacy tar). The readers
(:mod:`.read`, :mod:`.handler`) and the scanner (:mod:`torchless.scan.carriers`) both
take these facts from here; every sniffer works on any byte source (a file, bytes, a zip
member, a DCP item), so it runs on nested members too.

Light on purpose: no pickle machine, no readers (the scanner imports it).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ...container.zip import EOCD_SIG, LOCAL_SIG
from ...io.source import ByteSource, SourceFile

if TYPE_CHECKING:
    import tarfile

__all__ = [
    "ZIP_MAGIC",
    "ZIP_END_MAGIC",
    "LEGACY_MAGIC",
    "LEGACY_PROTOCOL",
    "PREVIEW_MAGIC",
    "DATA_PKL",
    "DATA_DIR",
    "VERSION",
    "DATA_VERSION",
    "VERSION_RECORDS",
    "BYTEORDER",
    "FORMAT_VERSION",
    "STORAGE_ALIGNMENT",
    "SERIALIZATION_ID",
    "METADATA_RECORDS",
    "LEGACY_TAR_MEMBERS",
    "tar_errors",
    "PICKLE_PROTOCOL_HEADS",
    "is_legacy_stream",
    "is_tar_header",
    "open_legacy_tar",
    "opens_as_tar",
    "is_storage_record",
    "classify_record",
]

#: torch.load's zip test (``_is_zipfile``): the first local file header
ZIP_MAGIC = LOCAL_SIG
#: the end-of-central-directory record (an empty archive starts with it)
ZIP_END_MAGIC = EOCD_SIG

#: the first pickle of the legacy stream (§2)
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
#: the second pickle of the legacy stream
LEGACY_PROTOCOL = 1001
#: pre-release zip checkpoints (torch 1.4 preview): refused with a message
PREVIEW_MAGIC = b"PYTORCH1"

#: the object pickle and the folder of its storages (§1)
DATA_PKL = "data.pkl"
DATA_DIR = "data"
#: the container version record: ``version`` until file format 5, ``.data/version`` after
VERSION = "version"
DATA_VERSION = ".data/version"
VERSION_RECORDS = (VERSION, DATA_VERSION)
BYTEORDER = "byteorder"
FORMAT_VERSION = ".format_version"
STORAGE_ALIGNMENT = ".storage_alignment"
SERIALIZATION_ID = ".data/serialization_id"
#: the small metadata records ``torch.save`` writes next to ``data.pkl`` (§1.10)
METADATA_RECORDS = (VERSION, DATA_VERSION, BYTEORDER, FORMAT_VERSION, STORAGE_ALIGNMENT, SERIALIZATION_ID)

#: members torch's ``_legacy_load`` extracts from a legacy tar, in its order (§3)
LEGACY_TAR_MEMBERS = ("storages", "tensors", "pickle")

#: protocol heads of the pickles ``torch.save`` writes (PROTO 1..5)
PICKLE_PROTOCOL_HEADS = (b"\x80\x01", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
#: the legacy magic number as the first pickle (LONG1 of 10 bytes) at protocols 1..3
_LEGACY_HEADS = (b"\x80\x02\x8a\x0a", b"\x80\x01\x8a\x0a", b"\x80\x03\x8a\x0a")

#: storage records of the zip layout: ``data/<key>`` (and the same under other folders
#: that torch's persistent_load reads: TorchScript's ``constants/``, ``tensors/``)
_STORAGE_RECORD = re.compile(r"^(?:.*/)?(?:data|constants|tensors)/\d+$")


def is_legacy_stream(head: bytes) -> bool:
    """The legacy format's first pickle (the magic number as a LONG1 of 10 bytes), with
    any protocol ``torch.save(pickle_protocol=...)`` writes: 4 and 5 frame it."""
    if head[:4] in _LEGACY_HEADS:
        return True
    return head[:1] == b"\x80" and head[1:2] in (b"\x04", b"\x05") and head[2:3] == b"\x95" and head[11:13] == b"\x8a\x0a"


def tar_errors() -> tuple[type[BaseException], ...]:
    """What ``tarfile`` raises on bytes it refuses (torch then reads the legacy stream).
    ``tarfile`` is imported here and for tar files only: most runs never need it."""
    import tarfile

    return (tarfile.TarError, EOFError, OSError, ValueError, UnicodeError, OverflowError)


def is_tar_header(head: bytes) -> bool:
    """True when ``head`` starts with a tar header ``tarfile`` accepts (ustar, GNU and
    pre-POSIX v7 headers alike: tarfile checks the checksum, not the magic)."""
    if len(head) < 512:
        return False
    import tarfile

    try:
        tarfile.TarInfo.frombuf(head[:512], "utf-8", "surrogateescape")
    except (tarfile.TarError, ValueError, UnicodeError):
        return False
    return True


def open_legacy_tar(src: ByteSource) -> tarfile.TarFile:
    """The archive as torch opens it: ``tarfile.open(fileobj=f, mode="r:", format=PAX_FORMAT)``.

    Raises:
        one of :func:`tar_errors`: ``tarfile`` refuses it.
    """
    import tarfile

    opener: Any = tarfile.open
    return opener(fileobj=SourceFile(src), mode="r:", format=tarfile.PAX_FORMAT)


def opens_as_tar(src: ByteSource) -> bool:
    """Whether :func:`open_legacy_tar` accepts ``src`` (torch.load tries it on real files)."""
    if src.size < 512:
        return False
    try:
        tf = open_legacy_tar(src)
    except tar_errors():
        return False
    tf.close()
    return True


def is_storage_record(rel: str) -> bool:
    """A storage record of the zip layout (raw tensor bytes, never unpickled)."""
    return bool(_STORAGE_RECORD.match(rel))


def classify_record(rel: str) -> str:
    """``pickle``, ``storage``, ``metadata`` or ``other`` for a record name relative to
    the archive folder."""
    if rel == DATA_PKL or rel.endswith(".pkl"):
        return "pickle"
    if is_storage_record(rel):
        return "storage"
    if rel in METADATA_RECORDS:
        return "metadata"
    return "other"
