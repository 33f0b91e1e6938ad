"""Text that comes from a cluster (driver logs, Ray's status messages, error answers), made safe
to store and to count in.

A job controls what its cluster says, so its text may hold what PostgreSQL refuses (NUL) or
what UTF-8 cannot encode (lone surrogates, bytes that are not UTF-8). :func:`clean` is the one
gate every such text passes before it reaches a model or an event.

Driver logs are also counted in: offsets into a log are positions in the bytes the driver
wrote. :func:`decode` turns those bytes into text with one U+FFFD for every byte that is not
text (a NUL, a byte outside valid UTF-8, and each of the three bytes of a U+FFFD the log holds
itself), so every U+FFFD in log text stands for exactly one byte and :func:`width` tells how
many bytes of the log a text covers, whichever piece of it was read.
"""

from __future__ import annotations

import codecs
import re

from .base import LogPart

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")
_UNSTORABLE = dict.fromkeys([0, *range(0xD800, 0xE000)], REPLACEMENT)
_REPLACEMENT_BYTES = REPLACEMENT.encode()
_NOT_TEXT = b"\xff" * len(_REPLACEMENT_BYTES)  # never valid UTF-8: one U+FFFD per byte


def clean(text: str) -> str:
    """``text`` fit for the database: each NUL and each lone surrogate replaced by U+FFFD."""
    # Text without surrogates (ASCII: known without a look) needs the one C-speed replace.
    if text.isascii() or not _SURROGATE.search(text):
        return text.replace("\x00", REPLACEMENT)
    return text.translate(_UNSTORABLE)


def decode(data: bytes) -> str:
    """Log bytes as clean text, one U+FFFD per byte that is not text: ``width(decode(data))``
    is ``len(data)``."""
    data = data.replace(_REPLACEMENT_BYTES, _NOT_TEXT)
    # surrogateescape turns each byte that is not UTF-8 into one lone surrogate; clean() then
    # makes it (and each NUL) one U+FFFD.
    return clean(data.decode("utf-8", "surrogateescape"))


def width(text: str) -> int:
    """How many bytes of the log a clean log text stands for (U+FFFD counts one)."""
    return len(text.encode()) - 2 * text.count(REPLACEMENT)


def _as_bytes(text: str) -> bytes:
    """A clean log text as bytes of its width: each U+FFFD as a NUL (which decode() turns back
    into U+FFFD), everything else as UTF-8."""
    return text.replace(REPLACEMENT, "\x00").encode()


class LogDecoder:
    """decode() for a log read piece by piece: a character (or a U+FFFD the log holds) split
    between two pieces comes out whole with the second, so the widths of the pieces add up to
    the bytes fed."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self._held = b""

    def decode(self, data: bytes, final: bool = False) -> str:
        data = self._held + data
        self._held = b""
        if not final:
            for size in (2, 1):  # the start of a U+FFFD's bytes waits for the rest
                if data.endswith(_REPLACEMENT_BYTES[:size]):
                    data, self._held = data[:-size], data[-size:]
                    break
        data = data.replace(_REPLACEMENT_BYTES, _NOT_TEXT)
        return clean(self._utf8.decode(data, final))


def skip(text: str, count: int) -> str:
    """A clean log text without its first ``count`` bytes (a character cut in two loses its
    first bytes: what is left of it is one U+FFFD per byte)."""
    if count <= 0:
        return text
    return decode(_as_bytes(text)[count:])


def _complete(data: bytes, *, cut_start: bool) -> tuple[int, int]:
    """How many bytes to drop from the start (when ``cut_start``: continuation bytes of a
    character that began before) and from the end (a character whose rest is not written yet)
    of a piece of a log so that it holds whole characters."""
    head = 0
    if cut_start:
        while head < min(3, len(data)) and 0x80 <= data[head] < 0xC0:
            head += 1
        if head == len(data):
            head = 0  # nothing but continuation bytes: kept, one U+FFFD each
    tail = 0
    for back in range(1, min(4, len(data) - head + 1)):
        byte = data[-back]
        if 0x80 <= byte < 0xC0:
            continue
        if 0xC2 <= byte < 0xF5:  # the first byte of a character of 2, 3 or 4 bytes
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            if back < needed:
                tail = back
        break
    return head, tail


def read_part(size: int, since: int | None, limit: int, read) -> LogPart:
    """At most ``limit`` bytes of a log of ``size`` bytes, from byte ``since`` on when given,
    else its end, read with ``read(begin, end)`` (bytes; shorter when the log shrank) and cut to
    whole characters."""
    limit = max(0, limit)
    begin = max(0, size - limit) if since is None else min(max(0, since), size)
    data = read(begin, min(size, begin + limit)) if size > begin else b""
    # From its end, the piece starts with whole characters; from ``since``, exactly there.
    head, tail = _complete(data, cut_start=since is None and begin > 0)
    data = data[head : len(data) - tail]
    return LogPart(text=decode(data), start=begin + head, end=begin + head + len(data))


def part_of(text: str, *, since: int | None, limit: int) -> LogPart:
    """read_part() of a log held whole as (clean) text."""
    data = _as_bytes(clean(text))
    return read_part(len(data), since, limit, lambda begin, end: data[begin:end])
