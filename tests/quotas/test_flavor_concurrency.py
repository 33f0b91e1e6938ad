"""Concurrent admission against a quota group's per-flavor limit on PostgreSQL (its own module:
it needs a committed database)."""

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


@pytest.mark.django_db(transaction=True)
def test_concurrent_admission_never_takes_a_group_over_its_h100_limit(settings):
    """As the totals' race (tests/quotas/test_concurrency.py): a division whose h100 limit is 3
    (its workspaces' own flavor limits would allow 4, the organisation 8), a team under it with
    2, submitters in a workspace of each and admitters racing: neither flavor limit is ever
    passed, whatever the interleaving."""
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
    developer = Actor.for_user(world.users["developer"])
    errors, done = [], threading.Event()

    def submitter(ws, count):
        try:
            for _ in range(count):
                job_services.job_submit(actor=developer, workspace=ws, template=templates[ws.pk])
        except Exception as exc:  # surfaced by the assertion below
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

    submitters = [threading.Thread(target=submitter, args=(ws, 15)) for ws in (world.ws, other) * 2]
    kinds = [admission.admit, admission.admit_single_flight] * 2
    admitters = [threading.Thread(target=admitter, args=(kind,)) for kind in kinds]
    for thread in admitters + submitters:
        thread.start()
    for thread in submitters:
        thread.join()
    done.set()
    for thread in admitters:
        thread.join()
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
