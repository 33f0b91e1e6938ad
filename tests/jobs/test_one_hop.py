"""One-hop dispatch on PostgreSQL: a request that queues a job (an approval, or a submission that
needs none) runs the organisation's single-flight admission pass itself once it commits, so the
job's launch task is the only task between the request and the launch. It is the same pass (the
same lock, the same plan), so it never admits past a job ahead under ``fifo`` and never
over-commits when approvals race; what it cannot do at once it hands to the admit task.

What the lifecycle sends is recorded at ``jobs/dispatch.py`` (the one seam every task goes
through) and still sent, to the test's Redis broker."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.db.models import Sum

from audit.context import Actor
from jobs import admission, dispatch
from jobs import services as job_services
from jobs import tasks as job_tasks
from jobs.models import Job, JobAttempt
from quotas.models import AdmissionRequests, OrgQuota, Reservation, WorkspaceQuota
from tests.conftest import build_world
from tests.jobs.conftest import counter_spec
from tests.quotas.test_single_flight import hold_the_lock, plain_connection

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = "/api/v1/orgs/acme/workspaces/ml/jobs/"


@pytest.fixture
def sent(monkeypatch):
    """Every task the lifecycle sends, as (name, args), sent all the same."""
    calls: list[tuple[str, tuple]] = []
    real_send, real_send_each = dispatch.send, dispatch.send_each

    def send(name, *args, countdown=None):
        calls.append((name, args))
        real_send(name, *args, countdown=countdown)

    def send_each(name, many):
        many = list(many)
        calls.extend((name, args) for args in many)
        real_send_each(name, many)

    monkeypatch.setattr(dispatch, "send", send)
    monkeypatch.setattr(dispatch, "send_each", send_each)
    return calls


def one_cpu_template(world, **spec):
    return job_services.template_create(
        actor=Actor.for_user(world.users["owner"]), workspace=world.ws, name="one-cpu",
        spec=counter_spec(head={"cpu": 1, "memory_gb": 1}, worker_groups=[], **spec),
        allowed_overrides=["head"],
    ).template  # fmt: skip


def needs_approval(world) -> None:
    world.ws.approval_policy = "always"
    world.ws.save(update_fields=["approval_policy"])


def names(calls) -> list[str]:
    return [name for name, _ in calls]


def test_an_approval_admits_the_job_and_sends_its_launch_task_and_nothing_else(sent):
    world = build_world()
    OrgQuota.objects.create(organization=world.org, cpu=4)
    needs_approval(world)
    template = one_cpu_template(world)
    job = world.client("developer").post(JOBS, {"template": template.pk}, format="json").json()
    assert job["state"] == "pending_approval" and sent == []

    approved = world.client("owner").post(f"{JOBS}{job['id']}/approve/", {}, format="json")

    assert approved.status_code == 200, approved.content
    row = Job.objects.get(pk=job["id"])
    assert row.state == "launching"
    attempt = JobAttempt.objects.get(job=row)
    # one hop: the launch task, sent by the approving request; no admit task before it
    assert sent == [(dispatch.LAUNCH, (str(attempt.pk),))]
    requests = AdmissionRequests.objects.get(organization=world.org)
    assert requests.requested == requests.served == 1
    assert Reservation.objects.get(job=row, released_at__isnull=True).cpu == 1


def test_a_submission_that_needs_no_approval_is_admitted_by_its_own_request(sent):
    world = build_world()
    OrgQuota.objects.create(organization=world.org, cpu=4)
    template = one_cpu_template(world)

    response = world.client("developer").post(JOBS, {"template": template.pk}, format="json")

    assert response.status_code == 201, response.content
    attempt = JobAttempt.objects.get(job_id=response.json()["id"])
    assert attempt.job.state == "launching"
    assert sent == [(dispatch.LAUNCH, (str(attempt.pk),))]


@pytest.mark.parametrize(
    ("policy", "admitted"), [("fifo", False), ("balanced", True), ("round_robin", True)]
)
def test_the_one_hop_pass_keeps_the_policys_order(sent, policy, admitted):
    """Two CPUs free, a three-CPU job at the head of the queue: under fifo a one-CPU job
    approved after it waits behind it; where the policy lets a blocked head be overtaken, the
    same one-hop pass admits it."""
    world = build_world()
    OrgQuota.objects.create(organization=world.org, cpu=4, policy=policy)
    template = one_cpu_template(world)
    developer, owner = (
        Actor.for_user(world.users["developer"]),
        Actor.for_user(world.users["owner"]),
    )
    running = job_services.job_submit(
        actor=developer, workspace=world.ws, template=template,
        overrides={"head": {"cpu": 2, "memory_gb": 1}},
    )  # fmt: skip
    assert Job.objects.get(pk=running.pk).state == "launching"
    big = job_services.job_submit(
        actor=developer, workspace=world.ws, template=template,
        overrides={"head": {"cpu": 3, "memory_gb": 1}},
    )  # fmt: skip
    assert Job.objects.get(pk=big.pk).state == "queued"  # does not fit: it heads the queue
    needs_approval(world)
    small = job_services.job_submit(actor=developer, workspace=world.ws, template=template)
    del sent[:]

    job_services.job_approve(actor=owner, job=small)

    assert Job.objects.get(pk=big.pk).state == "queued"
    state = Job.objects.get(pk=small.pk).state
    assert state == ("launching" if admitted else "queued")
    assert names(sent) == ([dispatch.LAUNCH] if admitted else [])  # the pass ran here, whole
    held = Reservation.objects.filter(released_at__isnull=True).aggregate(cpu=Sum("cpu"))
    assert held["cpu"] == (3 if admitted else 2)


def test_a_long_queue_is_left_to_the_admit_task(sent, settings):
    world = build_world()
    OrgQuota.objects.create(organization=world.org, cpu=100)
    template = one_cpu_template(world)
    developer, owner = (
        Actor.for_user(world.users["developer"]),
        Actor.for_user(world.users["owner"]),
    )
    settings.MANTA_INLINE_ADMISSION_MAX_QUEUED = 2
    with plain_connection() as holder:  # a pass is running: these three only ask for one
        hold_the_lock(holder, world)
        queued = [
            job_services.job_submit(actor=developer, workspace=world.ws, template=template).pk
            for _ in range(3)
        ]
        holder.rollback()
    # the first two asked the pass in progress; the third found the queue past the bound
    assert sent == [(dispatch.ADMIT, ())]
    assert Job.objects.filter(state="queued").count() == 3
    del sent[:]
    needs_approval(world)
    fourth = job_services.job_submit(actor=developer, workspace=world.ws, template=template)

    job_services.job_approve(actor=owner, job=fourth)

    # four queued, more than a request's pass takes on: the worker's pass admits them. The
    # admit task sent for the third has not started, so it is not sent again: that pass, once
    # it runs, reads the fourth too (config/wakeup.py)
    assert Job.objects.get(pk=fourth.pk).state == "queued"
    assert sent == []
    requests = AdmissionRequests.objects.get(organization=world.org)
    assert (requests.requested, requests.served) == (2, 0)  # nor asked the pass
    assert job_tasks.admit() == {
        world.org.pk: [*queued, fourth.pk]
    }  # the task, as a worker runs it


def test_concurrent_approvals_never_over_commit(sent, monkeypatch):
    """40 approvals from four threads against room for 10 one-CPU jobs, each request running
    its one-hop pass: exactly 10 admitted, once each, and the room never exceeded. Requests
    that found a pass running were served by it or handed to the admit task (run here as the
    worker would, once the approvals are done)."""
    world = build_world()
    OrgQuota.objects.create(organization=world.org, cpu=10, policy="round_robin")
    WorkspaceQuota.objects.create(workspace=world.ws, limit_cpu=10)
    needs_approval(world)
    template = one_cpu_template(world)
    developer = Actor.for_user(world.users["developer"])
    pending = [
        job_services.job_submit(actor=developer, workspace=world.ws, template=template)
        for _ in range(40)
    ]
    inline: list[list[int]] = []
    real_inline = job_services.admit_inline

    def counted(organization_id):
        admitted = real_inline(organization_id)
        inline.append(admitted)
        return admitted

    monkeypatch.setattr(job_services, "admit_inline", counted)
    errors = []

    def approver(jobs):
        try:
            for job in jobs:
                job_services.job_approve(actor=Actor.for_user(world.users["owner"]), job=job)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=approver, args=(pending[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(inline) == 40  # every approval ran its one-hop pass
    assert any(inline)  # and some of them admitted
    if dispatch.ADMIT in names(sent):
        admission.admit_all()  # what the admit task does on a worker

    launching = set(Job.objects.filter(state="launching").values_list("id", flat=True))
    assert len(launching) == 10
    assert Job.objects.filter(state="queued").count() == 30
    assert {pk for admitted in inline for pk in admitted} <= launching
    active = Reservation.objects.filter(released_at__isnull=True)
    assert active.aggregate(total=Sum("cpu"))["total"] == 10
    assert set(active.values_list("job_id", flat=True)) == launching
    assert sorted(JobAttempt.objects.values_list("job_id", flat=True)) == sorted(launching)
    launched = [args[0] for name, args in sent if name == dispatch.LAUNCH]
    assert sorted(launched) == sorted(
        str(pk) for pk in JobAttempt.objects.values_list("pk", flat=True)
    )
