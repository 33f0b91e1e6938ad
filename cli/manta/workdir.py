"""A working directory as a code package: the zip Manta stores and Ray unpacks for the job.

The zip is the same bytes for the same files whatever their timestamps (entries sorted, times
and permissions fixed), so its sha256 names the content and an unchanged directory is never
uploaded twice.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from .ignore import IgnoreFile, is_ignored

IGNORE_FILES = (".gitignore", ".mantaignore")
ALWAYS_LEFT_OUT = ".git"  # the repository itself (a directory, or a file in a worktree)
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass
class WorkingDirPackage:
    data: bytes
    sha256: str
    files: list[str]
    skipped_links: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.data)


def package_files(root: Path) -> tuple[list[str], list[str]]:
    """The files under ``root`` that go into its package (posix paths relative to it, sorted),
    and the symbolic links left out. ``.gitignore`` files apply from their directory down, like
    git's, and ``.mantaignore`` files after every ``.gitignore``, so they have the last word;
    ``.git`` is always left out, and a directory left out is not entered."""
    gitignores: list[IgnoreFile] = []
    mantaignores: list[IgnoreFile] = []
    files: list[str] = []
    links: list[str] = []

    def read_ignore_files(directory: Path, rel: str) -> None:
        for name, into in zip(IGNORE_FILES, (gitignores, mantaignores), strict=True):
            path = directory / name
            if path.is_file() and not path.is_symlink():
                lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
                into.append(IgnoreFile(rel, lines))

    def walk(directory: Path, rel: str) -> None:
        read_ignore_files(directory, rel)
        with os.scandir(directory) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                path = f"{rel}/{entry.name}" if rel else entry.name
                if entry.name == ALWAYS_LEFT_OUT:
                    continue
                is_dir = entry.is_dir(follow_symlinks=False)
                if is_ignored([*gitignores, *mantaignores], path, is_dir):
                    continue
                if entry.is_symlink():
                    links.append(path)
                elif is_dir:
                    walk(Path(entry.path), path)
                elif entry.is_file(follow_symlinks=False):
                    files.append(path)

    walk(root, "")
    return sorted(files), links


def package_working_dir(root: str | os.PathLike[str]) -> WorkingDirPackage:
    """Zip the directory ``root`` (see :func:`package_files` for what goes in)."""
    root = Path(root)
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    files, links = package_files(root)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in files:
            source = root / name
            info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
            info.create_system = 3  # unix, so the permissions below are read
            executable = source.stat().st_mode & stat.S_IXUSR
            info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, source.read_bytes())
    data = buffer.getvalue()
    return WorkingDirPackage(
        data=data, sha256=hashlib.sha256(data).hexdigest(), files=files, skipped_links=links
    )
