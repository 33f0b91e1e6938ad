"""A workspace's package storage is bounded: MANTA_PACKAGE_STORAGE_COUNT packages and
MANTA_PACKAGE_STORAGE_GB in all. New content past either is a 409 ``package_storage_exceeded``
naming the limit, the use and the need, and leaves no row and no blob; content the workspace
holds already is free. (Two uploads racing for the last room: test_storage_race.py.)"""

from __future__ import annotations

import io
import zipfile

import pytest

from packages import services
from packages.models import CodePackage
from tests.conftest import SYSTEM
from tests.factories import WorkspaceFactory, WorkspaceMembershipFactory

from .test_packages import blobs, upload

GIB = 1024**3


@pytest.fixture(autouse=True)
def package_store(package_storage):
    return package_storage


def code(n: int) -> bytes:
    """The same bytes for the same ``n`` (a fixed timestamp), so content can be sent again."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(zipfile.ZipInfo("train.py", (2024, 1, 1, 0, 0, 0)), f"print({n})\n")
    return buffer.getvalue()


def assert_no_room(response, *, rule: str, used: str, needs: str) -> None:
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["type"] == "package_storage_exceeded"
    assert rule in body["detail"] and used in body["detail"] and needs in body["detail"]
    assert body["errors"]["package"][0] in body["detail"]


def test_the_package_count_is_bounded_and_content_held_already_is_free(
    world, package_store, settings
):
    settings.MANTA_PACKAGE_STORAGE_COUNT = 2
    first = upload(world, code(1))
    assert first.status_code == 201 and upload(world, code(2)).status_code == 201
    refused = upload(world, code(3))
    assert_no_room(
        refused,
        rule="may hold 2 (MANTA_PACKAGE_STORAGE_COUNT)",
        used="holds 2 packages",
        needs="needs 1 more",
    )
    assert CodePackage.objects.count() == 2 and len(blobs(package_store)) == 2
    # What the workspace holds already is answered whatever the quota says.
    again = upload(world, code(1))
    assert again.status_code == 200 and again.json()["sha256"] == first.json()["sha256"]


def test_the_bytes_are_bounded_per_workspace(world, package_store, settings):
    a, b = code(1), code(2)
    settings.MANTA_PACKAGE_STORAGE_GB = (len(a) + len(b) - 1) / GIB  # exact: a whole byte count
    assert upload(world, a).status_code == 201
    refused = upload(world, b)
    limit = len(a) + len(b) - 1
    assert_no_room(
        refused,
        rule="MANTA_PACKAGE_STORAGE_GB",
        used=f"use {len(a)} of {limit} bytes",
        needs=f"needs {len(b)} more",
    )
    assert CodePackage.objects.count() == 1 and len(blobs(package_store)) == 1

    # Another workspace has room of its own, for the same content too.
    WorkspaceMembershipFactory(
        workspace=WorkspaceFactory(organization=world.org, slug="other"),
        user=world.users["developer"],
        role="developer",
    )
    other = "/api/v1/orgs/acme/workspaces/other/"
    assert upload(world, b, ws=other).status_code == 201
    assert upload(world, a, ws=other).status_code == 409  # its own room is now used up


def test_a_code_source_fetch_is_bounded_too(world, package_store, settings, tmp_path):
    settings.MANTA_PACKAGE_STORAGE_COUNT = 1
    assert upload(world, code(1)).status_code == 201
    path = tmp_path / "fetched.zip"
    path.write_bytes(code(2))
    with pytest.raises(services.PackageStorageExceeded, match="MANTA_PACKAGE_STORAGE_COUNT"):
        services.package_store(
            actor=SYSTEM, workspace=world.ws, path=str(path), metadata={"commit": "x"}
        )
    assert CodePackage.objects.count() == 1 and len(blobs(package_store)) == 1
