"""A zip's entries are counted from its end records and its central directory before zipfile
parses it (packages/central_directory.py): too many entries, or end records that cannot be
true, are a 400 naming the rule, and ``zipfile.ZipFile`` is never made for them."""

from __future__ import annotations

import io
import struct
import time
import zipfile

import pytest

from packages import services
from packages.central_directory import check_entry_count
from packages.models import CodePackage
from tests.conftest import SYSTEM

from .test_packages import blobs, upload

EOCD = struct.Struct("<4s4H2LH")
ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
ZIP64_LOCATOR = struct.Struct("<4sLQL")


@pytest.fixture(autouse=True)
def package_store(package_storage):
    return package_storage


def tiny_entries(count: int, *, comment: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for n in range(count):
            archive.writestr(f"{n}.py", "")
        archive.comment = comment
    return buffer.getvalue()


def split_end(data: bytes) -> tuple[bytes, tuple]:
    """The archive before its (comment-less) end record, and the record's fields."""
    return data[: -EOCD.size], EOCD.unpack(data[-EOCD.size :])


def with_end(data: bytes, *, entries: int | None = None, size: int | None = None) -> bytes:
    """The archive with its end record claiming ``entries`` and a directory of ``size``."""
    body, (sig, disk, disk_cd, here, total, cd_size, cd_offset, comment) = split_end(data)
    here = total = total if entries is None else entries
    cd_size = cd_size if size is None else size
    return body + EOCD.pack(sig, disk, disk_cd, here, total, cd_size, cd_offset, comment)


def with_zip64_end(data: bytes, *, entries: int | None = None) -> bytes:
    """The archive ended by ZIP64 records (what a zip of more than 65,535 entries has), the
    classic record's fields saying "see ZIP64"; the ZIP64 record claims ``entries``."""
    body, (sig, _, _, _, total, cd_size, cd_offset, _) = split_end(data)
    claimed = total if entries is None else entries
    record = ZIP64_EOCD.pack(
        b"PK\x06\x06", ZIP64_EOCD.size - 12, 45, 45, 0, 0, claimed, claimed, cd_size, cd_offset
    )
    locator = ZIP64_LOCATOR.pack(b"PK\x06\x07", 0, len(body), 1)
    end = EOCD.pack(sig, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return body + record + locator + end


@pytest.fixture
def forbid_zipfile(monkeypatch):
    """Call it once the test's zips are built: from then on, making a zipfile.ZipFile fails."""

    def refuse(*args, **kwargs):
        raise AssertionError("zipfile.ZipFile was made")

    return lambda: monkeypatch.setattr(zipfile, "ZipFile", refuse)


def test_one_entry_more_than_the_limit_is_refused(world, package_store, monkeypatch):
    monkeypatch.setattr(services, "MAX_ENTRIES", 50)
    assert upload(world, tiny_entries(50)).status_code == 201
    refused = upload(world, tiny_entries(51))
    assert refused.status_code == 400, refused.content
    body = refused.json()
    assert body["type"] == "validation_error"
    assert body["errors"]["package"] == [
        "more than 50 entries: its end of central directory record claims 51 (at most 50)"
    ]
    assert CodePackage.objects.count() == 1 and len(blobs(package_store)) == 1


def test_a_zip64_end_record_claiming_a_million_entries_is_refused_unparsed(
    world, package_store, forbid_zipfile
):
    crafted = with_zip64_end(tiny_entries(1), entries=1_000_000)
    forbid_zipfile()
    started = time.monotonic()
    refused = upload(world, crafted)
    assert time.monotonic() - started < 2
    assert refused.status_code == 400, refused.content
    message = refused.json()["errors"]["package"][0]
    assert message.startswith(f"more than {services.MAX_ENTRIES} entries")
    assert "claims 1000000" in message
    assert not CodePackage.objects.exists() and blobs(package_store) == []


def test_an_end_record_claiming_fewer_entries_than_the_directory_holds(tmp_path, forbid_zipfile):
    # zipfile walks the directory by its size, not by the count: the count here is a lie.
    path = tmp_path / "lies.zip"
    path.write_bytes(with_end(tiny_entries(60), entries=5))
    forbid_zipfile()
    with pytest.raises(services.InvalidInput, match="its central directory holds more"):
        check_entry_count(str(path), limit=50)


@pytest.mark.parametrize(
    ("claim", "rule"),
    [
        ({"size": 10**9}, "outside the file"),
        ({"entries": 3, "size": 3 * 46 - 1}, "cannot hold the 3 entries"),
        ({"entries": 0}, "cannot hold the 0 entries"),
    ],
)
def test_end_records_that_cannot_be_true_are_refused(tmp_path, forbid_zipfile, claim, rule):
    path = tmp_path / "crafted.zip"
    path.write_bytes(with_end(tiny_entries(3), **claim))
    forbid_zipfile()
    with pytest.raises(services.InvalidInput, match=rule):
        check_entry_count(str(path), limit=50)


@pytest.mark.parametrize(
    "body",
    [
        tiny_entries(3),
        tiny_entries(3, comment=b"a comment after the end record"),
        b"#!/bin/sh\nexec unzip\n" + tiny_entries(3),  # data in front, as self-extractors have
        with_zip64_end(tiny_entries(3)),
        tiny_entries(0),
    ],
    ids=["plain", "comment", "prefixed", "zip64", "empty"],
)
def test_zips_zipfile_reads_pass_as_it_reads_them(world, tmp_path, body):
    path = tmp_path / "ok.zip"
    path.write_bytes(body)
    check_entry_count(str(path), limit=3)
    with zipfile.ZipFile(path) as archive:
        assert len(archive.infolist()) <= 3
    _, created = services.package_store(actor=SYSTEM, workspace=world.ws, path=str(path))
    assert created


def test_what_is_not_a_zip_is_said_so(tmp_path, forbid_zipfile):
    forbid_zipfile()
    for body in (b"", b"hello", b"PK\x05\x06 short"):
        path = tmp_path / "not.zip"
        path.write_bytes(body)
        with pytest.raises(services.InvalidInput, match="not a zip archive"):
            check_entry_count(str(path), limit=50)
