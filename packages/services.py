"""Receiving, checking, storing, finding and expiring code packages.

An upload is streamed to a temporary file while it is hashed and counted (never held in memory,
cut off as soon as it passes the limit), checked as a zip whose every entry stays inside the
directory it unpacks to, counted against its workspace's storage quota, and stored under its
sha256 unless that content is stored already.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import shutil
import stat
import tempfile
import time
import zipfile
from collections.abc import Callable
from typing import BinaryIO

from django.conf import settings
from django.core.files import File
from django.core.files.storage import storages
from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone
from django.utils.crypto import constant_time_compare, salted_hmac
from rest_framework import status

from audit import services as audit
from audit.context import Actor
from config.errors import Conflict, DomainError, InvalidInput
from workspaces.archive import require_active
from workspaces.models import Workspace

from .central_directory import check_entry_count
from .models import URI_PREFIX, CodePackage

CHUNK = 1024 * 1024
MAX_ENTRIES = 100_000
URI = re.compile(rf"^{re.escape(URI_PREFIX)}([0-9a-f]{{64}})$")


class PackageTooLarge(DomainError):
    type = "payload_too_large"
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE


class PackageStorageExceeded(Conflict):
    type = "package_storage_exceeded"


def storage():
    return storages["packages"]


def blob_name(sha256: str) -> str:
    return f"{sha256[:2]}/{sha256}.zip"


def package_upload(
    *, actor: Actor, workspace: Workspace, stream: BinaryIO, length: int | None
) -> tuple[CodePackage, bool]:
    """Store the zip read from ``stream`` for ``workspace``; (package, created). The same
    content uploaded again is stored once and answers the existing package."""
    limit = settings.MANTA_PACKAGE_MAX_BYTES
    if length is not None and length > limit:
        raise _too_large(length)
    with tempfile.NamedTemporaryFile(prefix="pkg-", suffix=".zip") as tmp:
        digest, size = hashlib.sha256(), 0
        while chunk := stream.read(CHUNK):
            size += len(chunk)
            if size > limit:
                raise _too_large(size, at_least=True)
            digest.update(chunk)
            tmp.write(chunk)
        tmp.flush()
        if size == 0:
            raise InvalidInput.on("package", "the body is empty: send the zip as the body")
        return package_store(
            actor=actor, workspace=workspace, path=tmp.name, sha256=digest.hexdigest(), size=size
        )


def package_store(
    *,
    actor: Actor,
    workspace: Workspace,
    path: str,
    sha256: str | None = None,
    size: int | None = None,
    metadata: dict | None = None,
) -> tuple[CodePackage, bool]:
    """Check the zip at ``path`` and store it for ``workspace`` under its sha256 (once per
    content); (package, created). Content the workspace holds already is answered as it is;
    new content over the workspace's storage quota is a 409 ``package_storage_exceeded`` that
    leaves neither a row nor a stored blob."""
    if sha256 is None or size is None:
        digest, size = hashlib.sha256(), 0
        with open(path, "rb") as source:
            while chunk := source.read(CHUNK):
                size += len(chunk)
                digest.update(chunk)
        sha256 = digest.hexdigest()
    if size > settings.MANTA_PACKAGE_MAX_BYTES:
        raise _too_large(size)
    require_active(workspace)
    _check_zip(path)
    held = CodePackage.objects.filter(workspace=workspace, sha256=sha256)
    if not held.exists():
        _check_storage(workspace, size)  # before the blob is written: a refusal writes nothing
    name = blob_name(sha256)
    stored_here = False
    if not storage().exists(name):
        with open(path, "rb") as source:
            storage().save(name, File(source))
        stored_here = True
    try:
        with transaction.atomic():
            # Uploads into one workspace take its row in turn, so two cannot both fit in the
            # room only one has. NO KEY: rows that merely refer to the workspace (a job, an
            # audit row) are not held up.
            locked = Workspace.objects.select_for_update(no_key=True).get(pk=workspace.pk)
            require_active(locked)
            existing = held.first()
            if existing is not None:
                return existing, False
            _check_storage(workspace, size)
            package = CodePackage.objects.create(
                workspace=workspace, sha256=sha256, size=size, uploaded_by=actor.user
            )
            audit.record(
                actor=actor,
                action="package.upload",
                target=package,
                target_repr=f"package {sha256[:12]}",
                workspace=workspace,
                changes={"sha256": [None, sha256]},
                metadata={"size": size, **(metadata or {})},
            )
    except BaseException:
        if stored_here and not CodePackage.objects.filter(sha256=sha256).exists():
            storage().delete(name)
        raise
    return package, True


def _check_storage(workspace: Workspace, size: int) -> None:
    """Refuse a new package of ``size`` bytes that would take ``workspace`` past
    MANTA_PACKAGE_STORAGE_COUNT packages or MANTA_PACKAGE_STORAGE_GB."""
    used = CodePackage.objects.filter(workspace=workspace).aggregate(
        count=Count("pk"), bytes=Sum("size", default=0)
    )
    most = settings.MANTA_PACKAGE_STORAGE_COUNT
    if used["count"] + 1 > most:
        message = (
            f"the workspace holds {used['count']} packages and may hold {most} "
            "(MANTA_PACKAGE_STORAGE_COUNT); this upload needs 1 more"
        )
    else:
        gib = settings.MANTA_PACKAGE_STORAGE_GB
        limit = int(gib * 1024**3)
        if used["bytes"] + size <= limit:
            return
        message = (
            f"the workspace's packages use {used['bytes']} of {limit} bytes "
            f"(MANTA_PACKAGE_STORAGE_GB {gib:g}); this upload needs {size} more"
        )
    expiry = settings.MANTA_PACKAGE_RETENTION_DAYS
    raise PackageStorageExceeded(
        f"no room for this package in the workspace {workspace.slug!r}: {message}; packages "
        f"no job used for {expiry} days are deleted",
        errors={"package": [message]},
    )


def _too_large(size: int, *, at_least: bool = False) -> PackageTooLarge:
    limit = settings.MANTA_PACKAGE_MAX_BYTES
    what = f"more than {limit}" if at_least else str(size)
    return PackageTooLarge(
        f"the package is {what} bytes; the limit is {limit} bytes (MANTA_PACKAGE_MAX_BYTES)",
        errors={"package": [f"larger than the limit of {limit} bytes"]},
    )


def _check_zip(path: str) -> None:
    """A zip of at most MAX_ENTRIES entries that all unpack inside its directory: no absolute
    paths, no ``..``, no links, no device files, and not more in total than
    MANTA_PACKAGE_MAX_UNPACKED_BYTES."""
    # Its end records first: zipfile would build every entry of a huge directory before a
    # count could refuse it.
    check_entry_count(path, limit=MAX_ENTRIES)
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError) as exc:
        raise InvalidInput.on("package", f"not a readable zip archive: {exc}") from exc
    if len(entries) > MAX_ENTRIES:
        raise InvalidInput.on("package", f"more than {MAX_ENTRIES} entries")
    unpacked = 0
    for entry in entries:
        rule = _entry_rule(entry)
        if rule:
            message = f"entry {entry.filename!r}: {rule}"
            raise InvalidInput(message, errors={"package": [message]})
        unpacked += entry.file_size
    limit = settings.MANTA_PACKAGE_MAX_UNPACKED_BYTES
    if unpacked > limit:
        raise InvalidInput.on("package", f"unpacks to {unpacked} bytes; the limit is {limit} bytes")


def _entry_rule(entry: zipfile.ZipInfo) -> str:
    name = entry.filename  # zipfile cuts a name at a NUL byte when it reads the archive
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "absolute paths are not allowed"
    if ".." in re.split(r"[/\\]", name):
        return "'..' is not allowed in a path"
    kind = stat.S_IFMT(entry.external_attr >> 16)
    if kind == stat.S_IFLNK:
        return "links are not allowed"
    if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
        return "only files and directories are allowed"
    return ""


def sha_of(uri: str) -> str | None:
    """The sha256 a ``manta://packages/<sha256>`` URI names (None for anything else)."""
    match = URI.match(uri or "")
    return match.group(1) if match else None


def package_require(workspace: Workspace, uri: str, *, field: str) -> CodePackage:
    """The workspace's package ``uri`` names, marked as used now; a 400 on ``field`` when the
    workspace has no such package (a package of another workspace does not exist here)."""
    sha256 = sha_of(uri)
    package = sha256 and CodePackage.objects.filter(workspace=workspace, sha256=sha256).first()
    if not package:
        raise InvalidInput.on(field, f"no package {uri!r} in this workspace: upload it first")
    CodePackage.objects.filter(pk=package.pk).update(last_used_at=timezone.now())
    return package


def local_path(sha256: str) -> str:
    """A path on this host holding the package's zip (a copy for remote storage)."""
    name = blob_name(sha256)
    try:
        return storage().path(name)
    except NotImplementedError:  # object storage: keep a local copy
        cache = os.path.join(settings.VAR_DIR, "package-cache")
        os.makedirs(cache, exist_ok=True)
        target = os.path.join(cache, f"{sha256}.zip")
        if not os.path.exists(target):
            with (
                storage().open(name, "rb") as src,
                tempfile.NamedTemporaryFile(dir=cache, delete=False) as dst,
            ):
                shutil.copyfileobj(src, dst)
            os.replace(dst.name, target)
        return target


# --- short-lived download URLs (for clusters that fetch code themselves: kuberay) ---------------

DOWNLOAD_SALT = "manta.packages.download"


def download_urls_available() -> bool:
    """Whether a cluster outside this host can be handed a package: object storage presigns its
    own URLs; the filesystem store needs MANTA_PUBLIC_URL, where the API serves them."""
    return _presigns() or bool(settings.MANTA_PUBLIC_URL)


def _presigns() -> bool:
    try:
        from storages.backends.s3 import S3Storage
    except ImportError:  # pragma: no cover - django-storages is a runtime dependency
        return False
    return isinstance(storage(), S3Storage)


def download_url(sha256: str, *, now: float | None = None) -> str:
    """A URL the package can be downloaded from without credentials for
    MANTA_PACKAGE_URL_SECONDS: presigned by object storage, or signed by Manta. Its path ends in
    ``.zip``, as Ray wants of a remote working_dir."""
    seconds = settings.MANTA_PACKAGE_URL_SECONDS
    if _presigns():
        return storage().url(blob_name(sha256), expire=seconds)
    expires = int((now if now is not None else time.time()) + seconds)
    base = settings.MANTA_PUBLIC_URL.rstrip("/")
    return f"{base}/api/v1/package-downloads/{sha256}-{expires}-{_signature(sha256, expires)}.zip"


def _signature(sha256: str, expires: int) -> str:
    return salted_hmac(DOWNLOAD_SALT, f"{sha256}:{expires}", algorithm="sha256").hexdigest()


def download_open(token: str, *, now: float | None = None):
    """The stored zip a signed token names, opened; None when the token is not one we signed,
    has expired, or names content no longer stored."""
    match = re.fullmatch(r"([0-9a-f]{64})-(\d{1,12})-([0-9a-f]{64})", token or "")
    if not match:
        return None
    sha256, expires, signature = match.group(1), int(match.group(2)), match.group(3)
    if not constant_time_compare(signature, _signature(sha256, expires)):
        return None
    if expires < (now if now is not None else time.time()):
        return None
    name = blob_name(sha256)
    if not storage().exists(name):
        return None
    return storage().open(name, "rb")


def packages_expire(
    *, in_use: Callable[[CodePackage], bool], now: dt.datetime | None = None
) -> int:
    """Delete the packages no job used for MANTA_PACKAGE_RETENTION_DAYS — except those a job that
    has not ended still runs, which ``in_use`` tells (jobs know: ``jobs.selectors``) — and the
    stored content no workspace holds any more. Returns how many packages were deleted."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(days=settings.MANTA_PACKAGE_RETENTION_DAYS)
    stale = CodePackage.objects.filter(last_used_at__lt=cutoff)
    deleted = 0
    for package in stale:
        if in_use(package):
            continue
        package.delete()
        deleted += 1
        if not CodePackage.objects.filter(sha256=package.sha256).exists():
            storage().delete(blob_name(package.sha256))
    return deleted
