"""Files that other processes read while a worker may be killed at any moment (a cluster's
``handle.json``, the uid and GPU leases): each appears in one step, whole or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile

PARTIAL_PREFIX = ".partial-"  # a file being written aside; left only by a killed writer


def write_whole(path: str, text: str, *, exclusive: bool = False) -> bool:
    """Put ``text`` at ``path`` (mode 0600): written aside in the same directory, then renamed
    over ``path`` — or, ``exclusive``, hard-linked to it, which fails when ``path`` exists
    (then False, and nothing changes). A writer killed at any point leaves the file as it was
    or whole, never empty or cut short."""
    fd, partial = tempfile.mkstemp(dir=os.path.dirname(path), prefix=PARTIAL_PREFIX)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if exclusive:
            os.link(partial, path)
        else:
            os.replace(partial, path)
    except FileExistsError:
        if not exclusive:
            raise
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(partial)  # gone already after a rename
    return True
