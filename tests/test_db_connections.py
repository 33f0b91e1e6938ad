"""Persistent database connections: the API's processes and the Celery workers keep theirs for
CONN_MAX_AGE seconds (MANTA_DB_CONN_MAX_AGE, 60 by default), health-checked, and close one that
is older or broken at a request's or a task's boundary, never in the middle of one."""

import re
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


def load_settings(printing: str, **env: str) -> subprocess.CompletedProcess:
    """config.settings loaded in a clean process with ``env``, printing ``printing`` (an
    expression over ``d``, the default database's settings)."""
    code = f"import config.settings as s; d = s.DATABASES['default']; print({printing})"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "MANTA_VAR_DIR": "/tmp/manta-settings-check", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def database_settings(**env: str) -> str:
    """CONN_MAX_AGE and CONN_HEALTH_CHECKS as config.settings reads them."""
    done = load_settings("d['CONN_MAX_AGE'], d['CONN_HEALTH_CHECKS']", **env)
    assert done.returncode == 0, done.stderr[-800:]
    return done.stdout.strip()


def test_connections_persist_for_a_minute_by_default_health_checked():
    assert database_settings() == "60 True"
    assert database_settings(MANTA_DB_CONN_MAX_AGE="5") == "5 True"
    assert database_settings(CONN_MAX_AGE="7") == "7 True"  # the older name still works
    assert database_settings(MANTA_DB_CONN_MAX_AGE="0") == "0 True"


def prepare_settings(**env: str) -> subprocess.CompletedProcess:
    """How config.settings tells psycopg to bind and prepare, on PostgreSQL."""
    postgresql = {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/test", **env}
    return load_settings(
        "d['OPTIONS']['server_side_binding'], d['OPTIONS']['prepare_threshold']", **postgresql
    )


def test_postgresql_binds_on_the_server_and_prepares_what_runs_five_times_by_default():
    assert prepare_settings().stdout.strip() == "True 5"
    assert prepare_settings(MANTA_DB_PREPARE_THRESHOLD="0").stdout.strip() == "True 0"
    assert prepare_settings(MANTA_DB_PREPARE_THRESHOLD="off").stdout.strip() == "True None"
    assert prepare_settings(MANTA_DB_PREPARE_THRESHOLD=" OFF ").stdout.strip() == "True None"
    for value, rule in [
        ("-1", "must be between 0 and"),
        ("99999999999999999999", "must be between 0 and"),
        ("five", "must be a whole number"),
        ("2.5", "must be a whole number"),
        ("5 rows", "must be a whole number"),  # (no NUL: an environment cannot hold one)
    ]:
        refused = prepare_settings(MANTA_DB_PREPARE_THRESHOLD=value)
        assert refused.returncode != 0, value
        assert f"MANTA_DB_PREPARE_THRESHOLD: {rule}" in refused.stderr, (
            value,
            refused.stderr[-800:],
        )


@pytest.mark.django_db
def test_a_statement_a_connection_runs_often_is_kept_prepared_by_the_server():
    from workspaces.models import Organization

    for slug in ("a", "b", "c", "d", "e", "f"):  # one statement, six values
        assert not Organization.objects.filter(slug=slug).exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        kept = [row[0] for row in cursor.fetchall()]
    slug = re.compile(
        r'FROM "workspaces_organization" WHERE "workspaces_organization"."slug" = \$\d'
    )
    assert [statement for statement in kept if slug.search(statement)], kept


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
