"""How many entries a zip holds, read from its end records and counted in its central directory
before :mod:`zipfile` parses anything.

``zipfile.ZipFile`` builds a ``ZipInfo`` for every central directory record, and it walks the
directory by its size, whatever count the end record states: a 100 MiB upload of one-byte names
is two million objects (a zip of one million entries cost the API 516 MB and 7.7 s) before a
count could be refused. So the end of central directory record (and the ZIP64 locator and
record, PKWARE's APPNOTE.TXT 4.3.14–4.3.16) is read here with ``struct``, found the way
``zipfile`` finds it, its count and sizes are checked, and the records are counted — without
keeping any — until there are more than the limit.
"""

from __future__ import annotations

import mmap
import os
import struct

from config.errors import InvalidInput

EOCD = struct.Struct("<4s4H2LH")  # signature, disks, entries here/total, size, offset, comment
EOCD_SIGNATURE = b"PK\x05\x06"
ZIP64_LOCATOR = struct.Struct("<4sLQL")  # signature, disk, record offset, disks
ZIP64_LOCATOR_SIGNATURE = b"PK\x06\x07"
ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")  # signature, size, versions, disks, entries, size, offset
ZIP64_EOCD_SIGNATURE = b"PK\x06\x06"
CENTRAL_RECORD = 46  # a central directory record's fixed part; then name, extra and comment
CENTRAL_SIGNATURE = b"PK\x01\x02"
CENTRAL_LENGTHS = struct.Struct("<3H")  # name, extra and comment lengths, at offset 28
MAX_RECORD = CENTRAL_RECORD + 3 * 0xFFFF


def check_entry_count(path: str, *, limit: int) -> None:
    """Refuse (400 on ``package``) a file with no zip end record, one whose end records claim
    more than ``limit`` entries or a central directory that cannot be what they say, and one
    whose central directory holds more than ``limit`` records. Reads the last 64 KiB + 22 bytes,
    then at most ``limit`` + 1 record headers."""
    size = os.path.getsize(path)
    with open(path, "rb") as source:
        end = _end_record(source, size)
        if end is None:
            raise InvalidInput.on("package", "not a zip archive")
        entries, directory_size, directory_start = end
        if entries > limit:
            raise _too_many(limit, f"its end of central directory record claims {entries}")
        if directory_size > size or directory_start < 0:
            raise InvalidInput.on(
                "package",
                f"not a readable zip archive: its end record places a central directory of "
                f"{directory_size} bytes outside the file of {size} bytes",
            )
        if not entries * CENTRAL_RECORD <= directory_size <= entries * MAX_RECORD:
            raise InvalidInput.on(
                "package",
                f"not a readable zip archive: a central directory of {directory_size} bytes "
                f"cannot hold the {entries} entries its end record claims",
            )
        if directory_size and _records(source, directory_start, directory_size, limit) > limit:
            raise _too_many(limit, "its central directory holds more")


def _too_many(limit: int, why: str) -> InvalidInput:
    return InvalidInput.on("package", f"more than {limit} entries: {why} (at most {limit})")


def _end_record(source, size: int) -> tuple[int, int, int] | None:
    """(entries, central directory size, where the directory starts) as ``zipfile`` will read
    them (``_EndRecData``, ``_EndRecData64`` and ``_RealGetContents``), or None: no end record."""
    if size < EOCD.size:
        return None
    source.seek(size - EOCD.size)
    data = source.read(EOCD.size)
    if data[:4] == EOCD_SIGNATURE and data[-2:] == b"\0\0":
        at = size - EOCD.size
    else:
        # A comment follows the record: the last signature in the last 64 KiB + 22 bytes.
        window = max(size - (1 << 16) - EOCD.size, 0)
        source.seek(window)
        data = source.read()
        found = data.rfind(EOCD_SIGNATURE)
        if found < 0 or len(data) - found < EOCD.size:
            return None
        at = window + found
        data = data[found : found + EOCD.size]
    _, _, _, _, entries, directory_size, _, _ = EOCD.unpack(data)
    # The directory ends where the end records begin: zipfile ignores the stored offset but for
    # data prepended to the archive.
    directory_end = at
    if at >= ZIP64_LOCATOR.size:
        source.seek(at - ZIP64_LOCATOR.size)
        signature, disk, _, disks = ZIP64_LOCATOR.unpack(source.read(ZIP64_LOCATOR.size))
        if signature == ZIP64_LOCATOR_SIGNATURE:
            if disk != 0 or disks > 1:
                raise InvalidInput.on("package", "not a readable zip archive: it spans disks")
            # zipfile takes the ZIP64 record right before the locator (no extensible data).
            record_at = at - ZIP64_LOCATOR.size - ZIP64_EOCD.size
            if record_at >= 0:
                source.seek(record_at)
                record = ZIP64_EOCD.unpack(source.read(ZIP64_EOCD.size))
                if record[0] == ZIP64_EOCD_SIGNATURE:
                    entries, directory_size = record[7], record[8]
                    directory_end = record_at
    return entries, directory_size, directory_end - directory_size


def _records(source, start: int, length: int, limit: int) -> int:
    """Central directory records from ``start``, counted as ``zipfile`` walks them (by
    length), stopping past ``limit`` or at the first thing that is not a record (zipfile then
    refuses the archive itself)."""
    count, at, end = 0, start, start + length
    with mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as view:
        while at < end and count <= limit:
            if at + CENTRAL_RECORD > end or view[at : at + 4] != CENTRAL_SIGNATURE:
                break
            name, extra, comment = CENTRAL_LENGTHS.unpack_from(view, at + 28)
            count += 1
            at += CENTRAL_RECORD + name + extra + comment
    return count
