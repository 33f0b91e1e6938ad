"""The reads every admission pass makes, whatever it admits — which workspaces have a queue, which
queued jobs a preemption promised capacity to — touch rows in proportion to what they find, not
to the length of the queue. PostgreSQL counts the rows (EXPLAIN ANALYZE), with the queue grown
in bulk and not analysed since, as a queue that grew fast is: the planner then believes it holds
one row. Before, one read walked every queued job and the other took them all for a DISTINCT:
their cost per pass grew tenfold from 10,000 to 100,000 queued (bench/admission.py)."""

from __future__ import annotations

import pytest
from django.db import connection

from jobs.admission import DatabaseQueue
from jobs.preemption import promised_statement
from tests.test_query_budgets import queued_in_bulk

QUEUED = 3000


def rows_touched(sql: str, params: list) -> int:
    """Rows every node of the statement's plan produced or filtered out, over all its loops."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        ((plan,),) = cursor.fetchall()[0]

    def walk(node: dict) -> int:
        loops = node.get("Actual Loops", 1)
        own = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
        own += node.get("Rows Removed by Join Filter", 0)
        return own * loops + sum(walk(child) for child in node.get("Plans", []))

    return walk(plan["Plan"])


@pytest.fixture
def long_queue(world, template):
    queued_in_bulk(world, template, QUEUED)
    return world


def test_the_workspaces_with_a_queue_are_found_without_reading_the_queue(long_queue):
    org = long_queue.org.pk
    workspaces = DatabaseQueue(org).workspace_ids()
    assert list(workspaces) == [long_queue.ws.pk]
    assert rows_touched(*workspaces.query.sql_with_params()) < 50


def test_the_jobs_promised_capacity_are_found_without_reading_the_queue(long_queue):
    sql, params = promised_statement(long_queue.org.pk)
    assert rows_touched(sql, params) < 50
