"""Two uploads racing for a workspace's last room for a package: each passes the check made
before its blob is written, and the check made again with the workspace row locked lets one
through. Committed rows (``transactional_db``): each thread has its own connection."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from django.db import connection

from audit.context import Actor
from packages import services
from packages.models import CodePackage
from tests.conftest import build_world

from .test_packages import blobs
from .test_storage_quota import code


def store(world, body: bytes):
    with tempfile.NamedTemporaryFile(suffix=".zip") as tmp:
        tmp.write(body)
        tmp.flush()
        return services.package_store(
            actor=Actor.for_user(world.users["developer"]), workspace=world.ws, path=tmp.name
        )


def test_two_uploads_racing_for_the_last_room_do_not_both_get_it(
    transactional_db, package_storage, settings, monkeypatch
):
    """The barrier holds both after their first check, so both have passed it."""
    world = build_world()
    settings.MANTA_PACKAGE_STORAGE_COUNT = 1
    first_checks = threading.Barrier(2, timeout=30)
    check = services._check_storage
    seen: set[int] = set()

    def check_after_both(workspace, size):
        check(workspace, size)
        if threading.get_ident() not in seen:
            seen.add(threading.get_ident())
            first_checks.wait()

    monkeypatch.setattr(services, "_check_storage", check_after_both)
    results: list[object] = []

    def one(n: int) -> None:
        try:
            results.append(store(world, code(n)))
        except services.PackageStorageExceeded as exc:
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    refused = [r for r in results if isinstance(r, services.PackageStorageExceeded)]
    assert len(results) == 2 and len(refused) == 1, results
    assert CodePackage.objects.filter(workspace=world.ws).count() == 1
    # The refused upload's blob, written before the lock, is gone again.
    assert len(blobs(Path(package_storage))) == 1
