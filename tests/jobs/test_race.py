"""Approve and cancel racing on the same job, on two real database connections.

The transition function locks the job row, so the two requests serialise: whichever commits
second sees the first one's state. Either the cancel wins (the job is cancelled and the approval
is refused with 409), or the approval wins and the cancel then withdraws the queued job. Never a
lost update: the final state and the timeline always agree, and there is exactly one terminal
event."""

import threading

import pytest
from django.db import connection

from audit.context import Actor
from config.errors import DomainError
from jobs import services
from jobs.models import Job, JobEvent
from tests.conftest import build_world
from tests.jobs.conftest import counter_spec


def run_concurrently(*calls):
    barrier = threading.Barrier(len(calls))
    results = [None] * len(calls)

    def worker(index, call):
        try:
            barrier.wait()
            results[index] = ("ok", call())
        except DomainError as exc:
            results[index] = ("refused", exc.type)
        finally:
            connection.close()  # each thread has its own connection

    threads = [threading.Thread(target=worker, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.django_db(transaction=True)
def test_approve_and_cancel_race_ends_consistently():
    world = build_world()
    world.ws.approval_policy = "always"
    world.ws.save()
    admin, dev = Actor.for_user(world.users["ws_admin"]), Actor.for_user(world.users["developer"])
    template = services.template_create(
        actor=admin, workspace=world.ws, name="counter", spec=counter_spec()
    ).template
    outcomes = set()
    for _ in range(12):
        job = services.job_submit(actor=dev, workspace=world.ws, template=template)
        approve, cancel = run_concurrently(
            lambda job=job: services.job_approve(actor=admin, job=job),
            lambda job=job: services.job_cancel(actor=dev, job=job, may_cancel_any=False),
        )
        job.refresh_from_db()
        assert job.state == "cancelled"
        assert cancel[0] == "ok"
        kinds = list(JobEvent.objects.filter(job=job).values_list("kind", flat=True))
        if approve[0] == "ok":
            assert kinds == ["submitted", "approved", "cancelled"]
            outcomes.add("approve-then-cancel")
        else:
            assert approve == ("refused", "invalid_transition")
            assert kinds == ["submitted", "cancelled"]
            outcomes.add("cancel-first")
        terminal = JobEvent.objects.filter(job=job, to_state="cancelled").count()
        assert terminal == 1
    assert Job.objects.filter(state="cancelled").count() == 12
    assert outcomes  # which orders happened depends on scheduling; each was consistent
