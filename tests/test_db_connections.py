"""Persistent database connections: the API's processes and the Celery workers keep theirs for
CONN_MAX_AGE seconds (MANTA_DB_CONN_MAX_AGE, 60 by default), health-checked, and close one that
is older or broken at a request's or a task's boundary, never in the middle of one."""

import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from celery.fixups.django import DjangoWorkerFixup
from celery.signals import task_postrun, task_prerun
from django.db import connection

from config.celery import app, probe

ROOT = Path(__file__).resolve().parents[1]


def database_settings(**env: str) -> str:
    """CONN_MAX_AGE and CONN_HEALTH_CHECKS as config.settings reads them in a clean process."""
    code = (
        "import config.settings as s; d = s.DATABASES['default']; "
        "print(d['CONN_MAX_AGE'], d['CONN_HEALTH_CHECKS'])"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "MANTA_VAR_DIR": "/tmp/manta-settings-check", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()


def test_connections_persist_for_a_minute_by_default_health_checked():
    assert database_settings() == "60 True"
    assert database_settings(MANTA_DB_CONN_MAX_AGE="5") == "5 True"
    assert database_settings(CONN_MAX_AGE="7") == "7 True"  # the older name still works
    assert database_settings(MANTA_DB_CONN_MAX_AGE="0") == "0 True"


def task_boundary(*, eager: bool = False) -> None:
    """What a worker sends around a task (here Manta's probe task): Celery's fix-up and
    Manta's handlers both listen."""
    probe.push_request(is_eager=eager)
    try:
        task_prerun.send(sender=probe, task_id="t", task=probe, args=(), kwargs={})
        task_postrun.send(
            sender=probe, task_id="t", task=probe, args=(), kwargs={}, state="SUCCESS"
        )
    finally:
        probe.pop_request()


@pytest.fixture
def persistent(transactional_db, monkeypatch):
    """A real connection in autocommit mode (as a worker's is between tasks), kept 60 s."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)
    connection.close()
    connection.ensure_connection()
    fixup = DjangoWorkerFixup(app).install()  # what `celery worker` installs at start
    yield connection
    task_prerun.disconnect(fixup.on_task_prerun)
    task_postrun.disconnect(fixup.on_task_postrun)
    connection.close()


def test_a_worker_keeps_its_connection_across_tasks(persistent):
    kept = persistent.connection
    for _ in range(3):
        task_boundary()
    assert persistent.connection is kept  # no reconnect per task
    with persistent.cursor() as cursor:  # and it still answers (health-checked first)
        cursor.execute("SELECT 1")
    assert persistent.connection is kept


def test_a_worker_closes_a_connection_older_than_conn_max_age(persistent):
    persistent.close_at = time.monotonic() - 1
    task_boundary()
    assert persistent.connection is None  # the next query opens a new one


def test_a_worker_replaces_a_connection_the_database_dropped(persistent):
    before = backend_pid(persistent)
    # Another session terminates it: what a database restart or a failover does.
    with psycopg.connect(**persistent.get_connection_params(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [before])
    task_boundary()  # the next query checks the kept connection first, and replaces it
    assert backend_pid(persistent) != before


def backend_pid(conn) -> int:
    with conn.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def test_an_eager_task_leaves_its_callers_connection_alone(persistent):
    kept = persistent.connection
    persistent.close_at = time.monotonic() - 1  # obsolete, but inside the caller's request
    task_boundary(eager=True)
    assert persistent.connection is kept
