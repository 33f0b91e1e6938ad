"""The reads every admission pass makes, whatever it admits — which workspaces have a queue, which
queued jobs a preemption promised capacity to, and (under fair-share preemption) whether anyone
has waited long enough to claim, each workspace's next job and what it has queued — touch rows
in proportion to what they find, not to the length of the queue. PostgreSQL counts the rows or
pages they read (EXPLAIN ANALYZE), with the queue grown in bulk and not analysed since, as a
queue that grew fast is: the planner then believes it holds one row. Before, one read walked
every queued job, one took them all for a DISTINCT and one walked the queue's index when nobody
was overdue: the first two made a pass's cost per job grow by a quarter from 10,000 to 100,000
queued (bench/admission.py). The last two sorted the whole queue and summed it."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.admission import DatabaseQueue, ledger_for
from jobs.models import Job
from jobs.preemption import (
    _queue_sums,
    _queued_before,
    fair_allocations,
    heads_query,
    overdue_statement,
    promised_statement,
    queue_sums_statement,
    workspace_heads,
)
from quotas.fairness import fair_allocation
from tests import factories as f
from tests.quotas.test_admission import queue_job, setup_quota, two_workspaces  # noqa: F401
from tests.quotas.test_preemption import guarantee, run
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


def copies(job_id: int, n: int) -> list[int]:
    """``n`` more queued jobs like ``job_id``, inserted in one go, queued after it."""
    one = Job.objects.get(pk=job_id)
    fields = [field.attname for field in Job._meta.concrete_fields if not field.primary_key]
    later = [one.queued_at + dt.timedelta(seconds=i + 1) for i in range(n)]
    rows = [
        Job(**{**{name: getattr(one, name) for name in fields}, "queued_at": at}) for at in later
    ]
    return [job.pk for job in Job.objects.bulk_create(rows)]


def test_fair_shares_read_each_queue_only_as_far_as_they_depend_on_it(
    two_workspaces,  # noqa: F811
):
    """Under fair-share preemption, each workspace's next job and its fair allocation are found
    from the first few jobs of each queue: the allocations are those of the whole queues."""
    world, spaces, templates = two_workspaces
    ml, other = spaces["ml"], spaces["other"]
    guarantee(ml, 1)
    guarantee(other, 3)
    setup_quota(world, 40, "fair_share", preemption=True, fair_share_preemption=True)
    run(world, other, templates["other"], 2, minutes_ago=90)
    first = queue_job(world, ml, templates["ml"], 1, minutes_ago=60)
    ml_jobs = [first, *copies(first, LONGER // 200 - 1)]  # 100 jobs of 1 GPU
    theirs = queue_job(world, other, templates["other"], 2, minutes_ago=30)
    copies(theirs, 4)  # 5 of 2 GPUs
    ledger = ledger_for(world.org.pk)

    def whole(dealt) -> dict[int, float]:
        """The fair allocations from every queued job (all but ``dealt``), summed in Python."""
        queued = Job.objects.filter(organization=world.org, state="queued").exclude(pk__in=dealt)
        wants = {ml.pk: 0.0, other.pk: 2.0}
        for ws, gpu in queued.values_list("workspace_id", "requested_gpu"):
            wants[ws] += gpu
        return fair_allocation(wants, {ml.pk: 1.0, other.pk: 3.0}, 40.0)

    heads = workspace_heads(world.org.pk, {})
    assert [job.pk for job in heads] == [first, theirs]
    # ml wants 100, other 2 + 10: other gets its 12, ml the 28 left, more than the first read
    # of ml's queue (16 jobs) could show: ml's queue is read again, further
    expected = whole({})
    assert expected == pytest.approx({ml.pk: 28.0, other.pk: 12.0})
    with CaptureQueriesContext(connection) as reads:
        assert fair_allocations(ledger, heads, {}, ["gpu"]) == {"gpu": expected}
    assert len(reads) == 2
    # The jobs a pass dealt with already are left out: 90 of ml's leave it wanting 10, which
    # the first read (16 jobs, 90 of them dealt with) cannot bound, so it reads further too.
    dealt = {pk: job for pk, job in Job.objects.in_bulk(ml_jobs[:90]).items()}
    heads = workspace_heads(world.org.pk, dealt)
    assert [job.pk for job in heads] == [ml_jobs[90], theirs]
    assert fair_allocations(ledger, heads, dealt, ["gpu"]) == {"gpu": whole(dealt)}
    assert whole(dealt)[ml.pk] == pytest.approx(10.0)


def test_a_queue_read_in_part_stays_unbounded_while_another_is_read_further(
    two_workspaces,  # noqa: F811
):
    """ml's first read (16 jobs of 2 GPUs: 32) covers what it would get (28 of 60) while
    other's (16 of 1 GPU) does not: other is read further, wants only 20, and the level rises
    to 36 for ml, more than ml's first read showed. ml must still count as wanting more than
    was read, or it would be given 32."""
    world, spaces, templates = two_workspaces
    ml, other = spaces["ml"], spaces["other"]
    third = f.WorkspaceFactory(organization=world.org, slug="third")
    setup_quota(world, 60, "fair_share", preemption=True, fair_share_preemption=True)
    first = queue_job(world, ml, templates["ml"], 2, minutes_ago=60)
    copies(first, 99)  # 100 jobs of 2 GPUs
    theirs = queue_job(world, other, templates["other"], 1, minutes_ago=50)
    copies(theirs, 19)  # 20 jobs of 1 GPU
    small = queue_job(world, third, templates["other"], 2, minutes_ago=40)
    Job.objects.filter(pk=small).update(workspace=third)
    copies(small, 1)  # 2 jobs of 2 GPUs
    heads = workspace_heads(world.org.pk, {})
    fair = fair_allocations(ledger_for(world.org.pk), heads, {}, ["gpu"])
    assert fair["gpu"] == pytest.approx({ml.pk: 36.0, other.pk: 20.0, third.pk: 4.0})


def test_each_workspaces_next_job_and_queue_are_read_without_reading_the_queue(long_queue):
    """With the queue grown in bulk and not analysed: the heads are an index probe per
    workspace (a window over the queue sorted all of it), and a read of a workspace's queue
    touches as many jobs as it was asked to (a grouped sum read them all)."""
    org, ws = long_queue.org.pk, long_queue.ws.pk
    f.WorkspaceFactory(organization=long_queue.org)  # with nothing queued
    query = heads_query(org, {})
    assert [job.workspace_id for job in workspace_heads(org, {})] == [ws]
    assert rows_touched(*query.query.sql_with_params()) < 50
    ((_, count, gpu, cpu),) = _queue_sums([ws], ["gpu", "cpu"], 16)
    one = Job.objects.filter(workspace_id=ws).first()
    assert (count, gpu, cpu) == (16, 16 * one.requested_gpu, 16 * one.requested_cpu)
    assert rows_touched(*queue_sums_statement([ws], ["gpu", "cpu"], 16)) < 3 * 16 * 3
