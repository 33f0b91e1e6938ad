"""The reads every admission pass makes, whatever it admits — which workspaces have a queue, which
queued jobs a preemption promised capacity to, and (under fair-share preemption) whether anyone
has waited long enough to claim — touch rows in proportion to what they find, not to the length
of the queue. PostgreSQL counts the rows or pages they read (EXPLAIN ANALYZE), with the queue
grown in bulk and not analysed since, as a queue that grew fast is: the planner then believes it
holds one row. Before, one read walked every queued job, one took them all for a DISTINCT and
one walked the queue's index when nobody was overdue: the first two made a pass's cost per job
grow by a quarter from 10,000 to 100,000 queued (bench/admission.py)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.utils import timezone

from jobs.admission import DatabaseQueue
from jobs.models import Job
from jobs.preemption import _queued_before, overdue_statement, promised_statement
from tests import factories as f
from tests.test_query_budgets import queued_in_bulk

QUEUED = 3000
LONGER = 20_000


def plan_of(sql: str, params: list, *, buffers: bool = False) -> dict:
    """The statement's plan as PostgreSQL ran it (EXPLAIN ANALYZE, with the pages it read)."""
    options = "ANALYZE, BUFFERS, FORMAT JSON" if buffers else "ANALYZE, FORMAT JSON"
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN ({options}) {sql}", params)
        ((plan,),) = cursor.fetchall()[0]
    return plan["Plan"]


def rows_touched(sql: str, params: list) -> int:
    """Rows every node of the statement's plan produced or filtered out, over all its loops."""

    def walk(node: dict) -> int:
        loops = node.get("Actual Loops", 1)
        own = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
        own += node.get("Rows Removed by Join Filter", 0)
        return own * loops + sum(walk(child) for child in node.get("Plans", []))

    return walk(plan_of(sql, params))


def blocks_read(sql: str, params: list) -> int:
    """Pages of tables and indexes the statement read (from shared buffers or not): what walking
    an index costs, which the rows of a plan do not show (a condition on a later column of the
    index is checked as the scan walks it)."""
    plan = plan_of(sql, params, buffers=True)
    return plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)


@pytest.fixture
def long_queue(world, template):
    queued_in_bulk(world, template, QUEUED)
    return world


def test_the_workspaces_with_a_queue_are_found_without_reading_the_queue(long_queue):
    org = long_queue.org.pk
    workspaces = DatabaseQueue(org).workspace_ids()
    assert list(workspaces) == [long_queue.ws.pk]
    assert rows_touched(*workspaces.query.sql_with_params()) < 50
    # A workspace whose only queued job the pass has dealt with already is not listed.
    other = f.WorkspaceFactory(organization=long_queue.org)
    one = Job.objects.filter(workspace=long_queue.ws).first()
    one.pk, one.workspace = None, other
    one.save()
    assert set(DatabaseQueue(org).workspace_ids()) == {long_queue.ws.pk, other.pk}
    assert list(DatabaseQueue(org, exclude=[one.pk]).workspace_ids()) == [long_queue.ws.pk]


def test_the_jobs_promised_capacity_are_found_without_reading_the_queue(long_queue):
    sql, params = promised_statement(long_queue.org.pk)
    assert rows_touched(sql, params) < 50


def test_whether_anyone_waited_long_enough_is_answered_without_reading_the_queue(world, template):
    queued_in_bulk(world, template, LONGER)
    org = world.org.pk
    queued = Job.objects.filter(organization_id=org, state="queued")
    oldest = min(queued.values_list("queued_at", flat=True))
    queued.filter(pk__in=queued.values("pk")[:1000]).update(priority=7)
    assert _queued_before(org, oldest + dt.timedelta(microseconds=1))
    assert not _queued_before(org, oldest)
    assert not _queued_before(world.other_org.pk, timezone.now())
    # every priority of the queue is asked: the oldest job of a lower one counts too
    queued.filter(priority=5).update(queued_at=oldest - dt.timedelta(hours=1))
    assert _queued_before(org, oldest)
    # nobody queued before the cutoff: a probe per priority (a range over the index read
    # 144-443 pages here)
    assert blocks_read(*overdue_statement(org, oldest - dt.timedelta(days=1))) < 30
