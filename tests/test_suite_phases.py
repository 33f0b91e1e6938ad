"""`make test` runs the cluster tests two files at a time (tests/conftest.py): a test file that
measures the host's disk or leases what is the host's (the GPU inventory's devices, sandbox uids)
must be marked `whole_host`, or it would share the host with another test's clusters and read
their bytes or wait for their leases."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# What only a test with the host to itself may do.
HOST_WIDE = re.compile(r"\bstatvfs\(|\btake_gpus\(|\btake_uid\(|\bMANTA_LOCAL_GPUS=|uid_range=")
CLUSTER_MARKS = re.compile(r"pytest\.mark\.(?:ray|e2e)\b")


def runs_with_clusters(root: Path, path: Path, text: str) -> bool:
    """Whether tests/conftest.py puts the file's tests among the cluster tests (every launcher
    test, and those marked ray or e2e)."""
    return path.is_relative_to(root / "launchers") or bool(CLUSTER_MARKS.search(text))


def unmarked_host_users(root: Path = TESTS) -> list[str]:
    found = []
    for path in sorted(root.rglob("test_*.py")):
        text = path.read_text()
        if path == Path(__file__).resolve() or not runs_with_clusters(root, path, text):
            continue
        if HOST_WIDE.search(text) and "pytest.mark.whole_host" not in text:
            found.append(str(path.relative_to(root)))
    return found


def test_every_cluster_test_that_measures_or_leases_the_host_runs_alone():
    assert unmarked_host_users() == []


def test_the_check_finds_a_cluster_test_that_forgot_the_mark(tmp_path):
    (tmp_path / "launchers").mkdir()
    marked = "import pytest\npytestmark = [pytest.mark.e2e, pytest.mark.whole_host]\n"
    (tmp_path / "test_marked.py").write_text(marked + "os.statvfs(path)\n")
    (tmp_path / "test_forgot.py").write_text("pytestmark = [pytest.mark.ray]\nos.statvfs(p)\n")
    (tmp_path / "test_quiet.py").write_text("pytestmark = [pytest.mark.e2e]\nprint(1)\n")
    (tmp_path / "test_unit.py").write_text("settings.MANTA_LOCAL_GPUS = ('0',)\ntake_gpus(x)\n")
    (tmp_path / "launchers" / "test_leases.py").write_text("take_uid(leases, s, 'c')\n")
    assert unmarked_host_users(tmp_path) == ["launchers/test_leases.py", "test_forgot.py"]
