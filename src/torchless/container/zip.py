"""The zip container of torch archives: a reader with torch's rules, and torch's writer.

This module is the facade: the code lives in :mod:`.zip_spec` (record layouts, end-record
search, miniz's rules), :mod:`.zip_read` (the reader), :mod:`.zip_run` (the directory-run
fast path), :mod:`.inflate`, :mod:`.zip_write` (the writer) and :mod:`.zip_batch` (record
loaders, batched reads); importers name ``torchless.container.zip``.

Reader (:class:`ZipReader`) - reads the central directory once and each record by
offset from a memory map, the way torch's ``PyTorchStreamReader`` (miniz) does:

* the end record is the one miniz 3.0.2 finds (:func:`locate_eocd`: backwards in 4 KiB
  windows, the last signature with 22 bytes after it, comment length ignored); a zip64
  locator is looked for only when the end record sits at offset >= 76, and the zip64
  record is read where the locator points (:func:`zip64_record`); the entry count, not
  the directory size, says how many entries there are;
* the archive prefix is the first central-directory entry's name up to its first ``/``;
* a member is looked up as ``prefix/name`` **case-insensitively**; when several entries
  match, the one torch reads is the one miniz's binary search over its heap-sorted index
  hits (:meth:`ZipReader.lookup` reproduces that; :meth:`ZipReader.duplicates` lists all);
* a record's data starts after the *local* header's name and extra field (FB padding);
* data descriptors and zip64 records (end records and extra fields) are honoured;
* a record miniz treats as a directory (name ending in ``/`` or DOS attribute 0x10) that
  declares data is refused: miniz extracts nothing and torch would return uninitialized
  memory;
* CRCs are not checked on read (torch builds miniz without it, and writes CRC 0 with
  ``compute_crc32=False``); :meth:`ZipReader.verify` checks them on request.

Writer (:class:`TorchZipWriter`) - torch 2.13's exact record layout (spec ``pt.md``
§1.3): stored records with flags 0x0808, zero time/date, an ``FB`` extra field padding
every record's data to the alignment, a data descriptor after each record, a central
directory, then ZIP64 end record + locator + classic end record, always. CRC-32 is
computed while writing, not in a second pass. The file is written to a temporary name and
renamed into place on success.
"""

from __future__ import annotations

from .inflate import MAX_DEFLATE_RATIO, MAX_INFLATE, check_inflate, inflate_chunks, inflate_into, inflate_pieces
from .zip_batch import BatchReader, RecordLoader
from .zip_read import EntryIndex, ZipReader
from .zip_run import DirectoryRun
from .zip_spec import (
    CENTRAL_HEADER,
    CENTRAL_SIG,
    DESC_SIG,
    EOCD64_RECORD,
    EOCD64_SIG,
    EOCD_RECORD,
    EOCD_SIG,
    LOC64_RECORD,
    LOC64_SIG,
    LOCAL_HEADER,
    LOCAL_SIG,
    MAX32,
    REFUSED_FLAG_BITS,
    REFUSED_FLAGS,
    ZipEntry,
    is_zip,
    locate_eocd,
    zip64_record,
)
from .zip_write import TorchZipWriter, iter_chunks

__all__ = [
    "ZipEntry",
    "ZipReader",
    "DirectoryRun",
    "EntryIndex",
    "RecordLoader",
    "BatchReader",
    "TorchZipWriter",
    "is_zip",
    "check_inflate",
    "inflate_chunks",
    "inflate_pieces",
    "inflate_into",
    "locate_eocd",
    "zip64_record",
    "iter_chunks",
    "MAX32",
    "MAX_DEFLATE_RATIO",
    "MAX_INFLATE",
    "REFUSED_FLAG_BITS",
    "REFUSED_FLAGS",
    "LOCAL_SIG",
    "CENTRAL_SIG",
    "EOCD_SIG",
    "EOCD64_SIG",
    "LOC64_SIG",
    "DESC_SIG",
    "LOCAL_HEADER",
    "CENTRAL_HEADER",
    "EOCD_RECORD",
    "EOCD64_RECORD",
    "LOC64_RECORD",
]
