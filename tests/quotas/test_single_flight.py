"""Single-flight admission on PostgreSQL: a trigger that finds a pass running returns at once,
and the running pass goes round again for it, so no request is lost and passes never pile up."""

import threading

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from jobs import admission
from jobs.models import Job
from quotas.models import AdmissionRequests, OrgQuota
from tests.conftest import build_world
from tests.jobs.conftest import counter_spec
from tests.quotas.test_admission import queue_job

pytestmark = pytest.mark.django_db(transaction=True)


def template_for(world):
    from audit.context import Actor
    from jobs import services as job_services

    return job_services.template_create(
        actor=Actor.for_user(world.users["owner"]), workspace=world.ws, name="t",
        spec=counter_spec(worker_groups=[]), allowed_overrides=["worker_groups", "priority"],
    ).template  # fmt: skip


def plain_connection():
    db = settings.DATABASES["default"]
    return psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=False
    )


def hold_the_lock(holder, world) -> None:
    holder.execute(
        "SELECT pg_advisory_xact_lock(%s, %s)", [admission.ADVISORY_NAMESPACE, world.org.pk]
    )


def test_a_trigger_returns_at_once_while_a_pass_holds_the_lock():
    world = build_world()
    OrgQuota.objects.create(organization=world.org, gpu=4)
    template = template_for(world)
    with plain_connection() as holder:
        hold_the_lock(holder, world)
        # the submission's own one-hop trigger finds the pass running: it only asks
        job = queue_job(world, world.ws, template, 1, minutes_ago=1)
        assert admission.admit_single_flight(world.org.pk) == []  # did not wait
        assert admission.admit_inline(world.org.pk) == []  # nor does the one-hop trigger
        requests = AdmissionRequests.objects.get(organization=world.org)
        assert (requests.requested, requests.served) == (3, 0)
        holder.rollback()
    assert admission.admit_single_flight(world.org.pk) == [job]
    requests.refresh_from_db()
    assert (requests.requested, requests.served) == (4, 4)


def test_the_running_pass_serves_a_request_made_during_it(monkeypatch):
    world = build_world()
    OrgQuota.objects.create(organization=world.org, gpu=4)
    template = template_for(world)
    with plain_connection() as holder:  # queued, not admitted by its own one-hop trigger
        hold_the_lock(holder, world)
        first = queue_job(world, world.ws, template, 1, minutes_ago=2)
        holder.rollback()
    inside, release = threading.Event(), threading.Event()
    real_plan = admission.plan
    results, rounds = {}, []

    def slow_plan(*args, **kwargs):
        chosen = real_plan(*args, **kwargs)
        if threading.current_thread().name == "pass":
            rounds.append([job.pk for job in chosen])
            if not inside.is_set():  # the first round has read the queue: hold it here
                inside.set()
                release.wait(30)
        return chosen

    monkeypatch.setattr(admission, "plan", slow_plan)

    def run_pass():
        try:
            results["pass"] = admission.admit_single_flight(world.org.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=run_pass, name="pass")
    thread.start()
    assert inside.wait(30)
    # a job queued (its one-hop trigger fired, and another) while the pass is in its plan
    second = queue_job(world, world.ws, template, 1, minutes_ago=1)
    assert Job.objects.get(pk=second).state == "queued"
    assert admission.admit_single_flight(world.org.pk) == []
    release.set()
    thread.join(30)
    # the first round admitted what it had read; a second round, the job queued meanwhile
    assert rounds == [[first], [second]]
    assert results["pass"] == [first, second]
    requests = AdmissionRequests.objects.get(organization=world.org)
    assert requests.requested == requests.served == 4
