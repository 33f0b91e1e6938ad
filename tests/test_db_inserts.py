"""``config.db.insert_rows`` and ``copy_insert`` write what ``bulk_create`` writes: the same
columns for the same instances, read back from PostgreSQL, and instances that know their ids and
are saved. Rows they do not handle go through ``bulk_create`` itself."""

from __future__ import annotations

import pytest
from django.db import DataError, connection, transaction
from django.db.models import Value
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.chain import verify_chain
from audit.models import AuditEvent
from config.db import COPY_ABOVE, copy_insert, insert_rows
from jobs.models import Job, JobEvent
from outbox.models import DomainEvent
from tests import factories as f

pytestmark = pytest.mark.django_db

TIMES = {"created_at", "updated_at", "occurred_at"}  # set to now by each insert


def columns(model, pks) -> list[dict]:
    """The rows as stored, in the order of ``pks``, without ids and insert times."""
    stored = {row["id"]: row for row in model.objects.filter(pk__in=pks).values()}
    return [{k: v for k, v in stored[pk].items() if k != "id" and k not in TIMES} for pk in pks]


def events(job, n: int) -> list[JobEvent]:
    return [
        JobEvent(
            job=job,
            from_state="queued",
            to_state="running",
            kind="started",
            actor=None,
            actor_label=f"system:{i}",
            reason="é ' \" \\ %s",
            data={"nested": {"list": [1, 2.5, None, "x"]}, "n": i},
        )
        for i in range(n)
    ]


def domain_events(job, n: int) -> list[DomainEvent]:
    return [
        DomainEvent(
            type="job.started",
            organization=job.organization,
            workspace=job.workspace if i % 2 else None,
            payload={"job": job.pk, "i": i},
        )
        for i in range(n)
    ]


def newer(model, than: int | None) -> list[int]:
    rows = model.objects.filter(pk__gt=than) if than is not None else model.objects.all()
    return list(rows.order_by("pk").values_list("pk", flat=True))


@pytest.mark.parametrize("n", [1, 3, COPY_ABOVE, COPY_ABOVE + 5])  # the last one by COPY
@pytest.mark.parametrize("make", [events, domain_events])
def test_rows_are_those_bulk_create_writes(make, n):
    job = f.JobFactory()
    ours, django_s = make(job, n), make(job, n)
    model = type(ours[0])
    last = model.objects.order_by("-pk").values_list("pk", flat=True).first()
    before = timezone.now()
    returned = copy_insert(model, ours)
    assert len(returned) == n and all(a is b for a, b in zip(returned, ours, strict=True))
    # ids made by the database (JobEvent) grow in insert order; DomainEvent's are uuid4s
    auto = model._meta.pk.get_internal_type() in ("AutoField", "BigAutoField")
    written = newer(model, last) if auto else [obj.pk for obj in ours]
    model.objects.bulk_create(django_s)
    assert columns(model, written) == columns(model, [obj.pk for obj in django_s])
    if n <= COPY_ABOVE:  # the small path learns its ids, as bulk_create does
        assert [obj.pk for obj in ours] == written
        assert not any(obj._state.adding for obj in ours)
        for name in TIMES & {field.attname for field in model._meta.concrete_fields}:
            assert all(getattr(obj, name) >= before for obj in ours)


def test_a_job_inserted_is_the_job_bulk_create_inserts():
    model = f.JobFactory()  # its template version, workspace and submitter, saved

    def like_it() -> Job:
        values = {field.attname: getattr(model, field.attname) for field in Job._meta.fields}
        return Job(**{**values, "id": None, "created_at": None, "updated_at": None})

    first, second = like_it(), like_it()
    with CaptureQueriesContext(connection) as queries:
        assert insert_rows(Job, [first]) == [first]
    assert len(queries.captured_queries) == 1  # one INSERT … RETURNING
    Job.objects.bulk_create([second])
    assert columns(Job, [first.pk]) == columns(Job, [second.pk])
    assert Job.objects.get(pk=first.pk).spec == model.spec
    assert first._state.db == "default" and not first._state.adding
    assert first.created_at is not None and first.updated_at is not None


def test_the_statement_is_kept_per_model_and_row_count():
    job = f.JobFactory()
    connection.__dict__.pop("_manta_insert_sql", None)  # what earlier tests kept
    copy_insert(JobEvent, events(job, 2))
    kept = connection._manta_insert_sql
    assert (JobEvent, 2, False) in kept and (JobEvent, 1, False) not in kept
    copy_insert(JobEvent, events(job, 1))
    assert kept[(JobEvent, 1, False)].count("(%s") == 1
    assert kept[(JobEvent, 2, False)].count("(%s") == 2


def test_ids_the_caller_chose_are_written():
    job = f.JobFactory()
    given, django_s = events(job, 2), events(job, 1)
    given[0].pk, given[1].pk = 10**9, 10**9 + 1
    with CaptureQueriesContext(connection) as queries:
        insert_rows(JobEvent, given)
    assert len(queries.captured_queries) == 1
    assert [e.pk for e in given] == [10**9, 10**9 + 1]
    JobEvent.objects.bulk_create(django_s)
    assert columns(JobEvent, [10**9]) == columns(JobEvent, [django_s[0].pk])
    mixed = events(job, 2)
    mixed[0].pk = 10**9 + 2  # one chosen, one not: bulk_create's affair
    insert_rows(JobEvent, mixed)
    assert JobEvent.objects.filter(pk=10**9 + 2).exists() and mixed[1].pk is not None


def test_rows_it_does_not_handle_go_through_bulk_create():
    job = f.JobFactory()
    expressed = events(job, 1)
    expressed[0].actor_label = Value("from an expression")
    insert_rows(JobEvent, expressed)
    assert JobEvent.objects.filter(actor_label="from an expression").count() == 1
    assert insert_rows(JobEvent, []) == []


def test_an_unsaved_related_row_is_refused_as_bulk_create_refuses_it():
    job = f.JobFactory.build()
    with pytest.raises(ValueError, match="unsaved related object"):
        insert_rows(JobEvent, events(job, 1))


def test_one_statement_sends_the_blocks_writes_together():
    from audit import services as audit
    from audit.context import Actor
    from config.db import one_statement

    job = f.JobFactory()
    timeline, outbox = events(job, 2), domain_events(job, 1)
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        with one_statement():
            insert_rows(JobEvent, timeline)
            copy_insert(DomainEvent, outbox)
            (event,) = audit.record_many(
                actor=Actor.system("test"),
                organization=job.organization,
                entries=[{"action": "job.submit", "target": job, "workspace": job.workspace}],
            )
            assert timeline[0].pk is None and event.seq == 0  # waiting
        assert timeline[0].pk is not None and timeline[1].pk == timeline[0].pk + 1
        assert event.seq >= 1 and len(event.hash) == 64
    (written,) = [q["sql"] for q in queries.captured_queries if q["sql"] != "BEGIN"][:1]
    assert written.startswith("WITH w0 AS (INSERT") and "audit_append" in written
    assert JobEvent.objects.filter(pk__in=[e.pk for e in timeline]).count() == 2
    assert DomainEvent.objects.filter(pk=outbox[0].pk).exists()
    assert AuditEvent.objects.get(pk=event.pk).hash == event.hash
    assert verify_chain(event.chain).ok


def test_a_read_in_the_block_sees_what_waited_and_an_error_rolls_back_everything():
    from config.db import one_statement

    job = f.JobFactory()
    with transaction.atomic(), one_statement():
        insert_rows(JobEvent, events(job, 1))
        assert JobEvent.objects.filter(job=job).count() == 1  # sent before the read
    broken = events(job, 1)
    broken[0].actor_label = "x" * 10_000  # too long for its column: refused when it is sent
    before = JobEvent.objects.count()
    with pytest.raises(DataError), transaction.atomic(), one_statement():
        insert_rows(JobEvent, events(job, 1))
        insert_rows(JobEvent, broken)
    assert JobEvent.objects.count() == before


def test_the_one_statement_is_parsed_once_per_text():
    """A job's row and three events: 60 parameters, over psycopg's own limit (50) for keeping
    what it parsed of a text."""
    from psycopg import _queries

    from config.db import one_statement

    model = f.JobFactory()
    values = {field.attname: getattr(model, field.attname) for field in Job._meta.fields}
    for round_ in range(3):
        job = Job(**{**values, "id": None, "created_at": None, "updated_at": None})
        with transaction.atomic(), one_statement():
            insert_rows(Job, [job])
            insert_rows(JobEvent, events(model, 3))
        if round_ == 0:
            before = _queries._query2pg.cache_info()
    after = _queries._query2pg.cache_info()
    assert after.hits >= before.hits + 2 and after.misses == before.misses
