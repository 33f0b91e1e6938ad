"""Many submitters and admitters at once on PostgreSQL: never a reservation beyond a limit, and
every job admitted exactly once."""

import threading

import pytest
from django.db import connection
from django.db.models import Sum

from audit.context import Actor
from jobs import admission, local_host
from jobs import services as job_services
from jobs.models import Job, JobAttempt
from quotas.models import OrgQuota, QuotaGroup, Reservation, WorkspaceQuota
from tests.conftest import build_world
from tests.factories import WorkspaceFactory, WorkspaceMembershipFactory
from tests.jobs.conftest import counter_spec
from tests.quotas.test_group_flavors import typed_inventory


def race(world, submissions) -> list[Exception]:
    """Submitters and admitters at once: a thread per ``(workspace, template, count)`` of
    ``submissions`` submitting ``count`` jobs as the developer, against four admitters (two
    wait for the organisation's lock, two take the single-flight path the task takes) that
    run until the submitters are done, then one pass each. Returns what any thread raised."""
    developer = Actor.for_user(world.users["developer"])
    errors, done = [], threading.Event()

    def submitter(ws, template, count):
        try:
            for _ in range(count):
                job_services.job_submit(actor=developer, workspace=ws, template=template)
        except Exception as exc:  # surfaced by the caller's assertion
            errors.append(exc)
        finally:
            connection.close()

    def admitter(admit):
        try:
            while not done.is_set():
                admit(world.org.pk)
            admission.admit(world.org.pk)
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    submitters = [threading.Thread(target=submitter, args=args) for args in submissions]
    kinds = [admission.admit, admission.admit_single_flight] * 2
    admitters = [threading.Thread(target=admitter, args=(kind,)) for kind in kinds]
    for thread in admitters + submitters:
        thread.start()
    for thread in submitters:
        thread.join()
    done.set()
    for thread in admitters:
        thread.join()
    return errors


@pytest.mark.django_db(transaction=True)
def test_200_submissions_against_a_quota_that_fits_10():
    world = build_world()
    OrgQuota.objects.create(organization=world.org, cpu=10, policy="round_robin")
    WorkspaceQuota.objects.create(workspace=world.ws, limit_cpu=10)
    template = job_services.template_create(
        actor=Actor.for_user(world.users["owner"]), workspace=world.ws, name="one-cpu",
        spec=counter_spec(head={"cpu": 1, "memory_gb": 1}, worker_groups=[]),  # 1 CPU in all
    ).template  # fmt: skip
    errors = race(world, [(world.ws, template, 50)] * 4)
    assert errors == []
    assert Job.objects.count() == 200
    launching = Job.objects.filter(state="launching")
    assert launching.count() == 10
    assert Job.objects.filter(state="queued").count() == 190
    active = Reservation.objects.filter(released_at__isnull=True)
    assert active.count() == 10
    assert active.aggregate(total=Sum("cpu"))["total"] == 10
    assert set(active.values_list("job_id", flat=True)) == set(
        launching.values_list("id", flat=True)
    )
    # admitted exactly once: one attempt per admitted job, none for the others
    assert JobAttempt.objects.count() == 10
    assert set(JobAttempt.objects.values_list("job_id", flat=True)) == set(
        launching.values_list("id", flat=True)
    )


@pytest.mark.django_db(transaction=True)
def test_concurrent_admission_never_takes_a_group_over_its_limit():
    """Three levels (org → division → team → workspace, and a second workspace directly under
    the division), submitters in both workspaces and admitters racing: the division's limit of
    6 CPUs holds (the workspaces' own limits would allow 7, the organisation 10), the team's 4
    too, whatever the interleaving."""
    world = build_world()
    other = WorkspaceFactory(organization=world.org, slug="other")
    WorkspaceMembershipFactory(workspace=other, user=world.users["developer"], role="developer")
    OrgQuota.objects.create(organization=world.org, cpu=10, policy="round_robin")
    division = QuotaGroup.objects.create(organization=world.org, name="div", limit_cpu=6)
    team = QuotaGroup.objects.create(
        organization=world.org, name="team", parent=division, limit_cpu=4
    )
    WorkspaceQuota.objects.create(workspace=world.ws, group=team)
    WorkspaceQuota.objects.create(workspace=other, group=division, limit_cpu=3)
    owner = Actor.for_user(world.users["owner"])
    spec = counter_spec(head={"cpu": 1, "memory_gb": 1}, worker_groups=[])
    templates = {
        ws.pk: job_services.template_create(
            actor=owner, workspace=ws, name="one-cpu", spec=spec
        ).template
        for ws in (world.ws, other)
    }
    errors = race(world, [(ws, templates[ws.pk], 25) for ws in (world.ws, other) * 2])
    assert errors == []
    active = Reservation.objects.filter(released_at__isnull=True)
    in_team = active.filter(workspace=world.ws).aggregate(total=Sum("cpu"))["total"]
    in_other = active.filter(workspace=other).aggregate(total=Sum("cpu"))["total"]
    in_division = active.aggregate(total=Sum("cpu"))["total"]
    # full, and not one CPU beyond: the division at 6, the team within its 4 (how much of the
    # division each workspace got depends on the interleaving)
    assert in_division == 6 and in_team <= 4 and in_other <= 3
    assert JobAttempt.objects.count() == active.count() == 6
    assert Job.objects.filter(state="launching").count() == 6


@pytest.mark.django_db(transaction=True)
def test_concurrent_admission_never_takes_a_group_over_its_h100_limit(settings):
    """As the totals' race above: a division whose h100 limit is 3 (its workspaces' own flavor
    limits would allow 4, the organisation 8), a team under it with 2, submitters in a
    workspace of each and admitters racing: neither flavor limit is ever passed, whatever the
    interleaving."""
    typed_inventory(settings)
    try:
        _race_for_h100()
    finally:
        local_host.gpu_inventory.cache_clear()


def _race_for_h100():
    world = build_world()
    other = WorkspaceFactory(organization=world.org, slug="other")
    WorkspaceMembershipFactory(workspace=other, user=world.users["developer"], role="developer")
    OrgQuota.objects.create(organization=world.org, gpu_flavors={"h100": 8}, policy="round_robin")
    division = QuotaGroup.objects.create(
        organization=world.org, name="div", gpu_flavors={"h100": {"limit": 3}}
    )
    team = QuotaGroup.objects.create(
        organization=world.org, name="team", parent=division, gpu_flavors={"h100": {"limit": 2}}
    )
    WorkspaceQuota.objects.create(workspace=world.ws, group=team)
    WorkspaceQuota.objects.create(
        workspace=other, group=division, gpu_flavors={"h100": {"limit": 2}}
    )
    owner = Actor.for_user(world.users["owner"])
    spec = counter_spec(head={"cpu": 0, "memory_gb": 0, "gpu": 1}, worker_groups=[],
                        gpu_flavor="h100")  # fmt: skip
    templates = {
        ws.pk: job_services.template_create(
            actor=owner, workspace=ws, name="one-h100", spec=spec
        ).template
        for ws in (world.ws, other)
    }
    errors = race(world, [(ws, templates[ws.pk], 15) for ws in (world.ws, other) * 2])
    assert errors == []
    active = Reservation.objects.filter(released_at__isnull=True)
    assert set(active.values_list("gpu_flavor", flat=True)) == {"h100"}
    in_team = active.filter(workspace=world.ws).aggregate(total=Sum("gpu"))["total"] or 0
    in_other = active.filter(workspace=other).aggregate(total=Sum("gpu"))["total"] or 0
    in_division = active.aggregate(total=Sum("gpu"))["total"]
    # full, and not one h100 beyond: the division at 3, the team within its 2
    assert in_division == 3 and in_team <= 2 and in_other <= 2
    assert JobAttempt.objects.count() == active.count() == 3
    assert Job.objects.filter(state="launching").count() == 3
