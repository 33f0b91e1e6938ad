"""The local host's capacity binds every organisation: admission never places more on it than
it has, whatever an org's own capacity says; a job that could never fit there is refused at
submit, naming the resource; a waiting job says it waits for the host."""

import pytest

from audit.context import Actor
from jobs import admission, local_host
from jobs import services as job_services
from jobs.models import Job
from quotas import services as quota_services
from quotas.models import Reservation
from tests.conftest import SYSTEM
from tests.jobs.conftest import counter_spec
from tests.quotas.test_admission import queue_job
from workspaces import services as ws_services
from workspaces.models import ComputeTarget


@pytest.fixture
def four_gpus(settings):
    settings.MANTA_LOCAL_GPUS = ("0", "1", "2", "3")
    # The GPU inventory is what binds here, not this machine's few CPUs (each sandboxed node
    # holds at least one), its memory or its disk.
    settings.MANTA_LOCAL_CAPACITY = {"cpu": 1e6, "memory_gb": 1e6, "disk_gb": 1e6}
    local_host.gpu_inventory.cache_clear()
    yield
    local_host.gpu_inventory.cache_clear()


def gpu_template(world, workspace):
    return job_services.template_create(
        actor=SYSTEM,
        workspace=workspace,
        name="gpu",
        spec=counter_spec(worker_groups=[]),
        allowed_overrides=["worker_groups", "priority"],
    ).template


def test_capacity_is_the_hosts_less_the_reserve(settings, four_gpus):
    settings.MANTA_LOCAL_CAPACITY = {}
    settings.MANTA_LOCAL_RESERVE_CPU = 0.5
    capacity = local_host.capacity()
    assert capacity["cpu"] == (local_host.os.cpu_count() or 1) - 0.5
    assert capacity["gpu"] == 4.0
    settings.MANTA_LOCAL_CAPACITY = {"cpu": 3.0, "gpu": 2.0}
    assert local_host.capacity()["cpu"] == 3.0 and local_host.capacity()["gpu"] == 2.0
    settings.MANTA_LOCAL_GPUS = ()
    local_host.gpu_inventory.cache_clear()
    settings.MANTA_LOCAL_CAPACITY = {}
    assert local_host.capacity()["gpu"] is None  # logical GPUs only: not capped here


def test_admission_never_places_more_than_the_host_has_over_all_orgs(world, four_gpus):
    template = gpu_template(world, world.ws)
    other_ws = ws_services.workspace_create(actor=SYSTEM, organization=world.other_org, slug="lab")
    other_template = gpu_template(world, other_ws)
    a = queue_job(world, world.ws, template, 2, minutes_ago=3)
    b = queue_job(world, world.ws, template, 2, minutes_ago=2)
    assert set(admission.admit(world.org.pk)) == {a, b}
    assert set(Reservation.objects.filter(host="local").values_list("job_id", flat=True)) == {a, b}

    # Another organisation, with no org capacity of its own set, still finds the host full.
    owner = world.users["foreign"]
    job = job_services.job_submit(
        actor=Actor.for_user(owner),
        workspace=other_ws,
        template=other_template,
        overrides={"worker_groups": [{"name": "g", "replicas": 1, "cpu": 0, "gpu": 2}]},
    )
    assert admission.admit(world.other_org.pk) == []
    job.refresh_from_db()
    queue = admission.explain(job)
    assert "this host's gpu capacity 4" in queue["waiting_for"], queue
    assert "4 reserved by all organisations" in queue["waiting_for"]

    # When one of acme's jobs ends, globex's job gets the host's GPUs.
    quota_services.reservations_release([a])
    assert admission.admit(world.other_org.pk) == [job.pk]


def test_a_job_bigger_than_the_host_is_refused_at_submit(world, four_gpus):
    template = gpu_template(world, world.ws)
    response = world.client("owner").post(
        "/api/v1/orgs/acme/workspaces/ml/jobs/",
        {
            "template": template.pk,
            "overrides": {"worker_groups": [{"name": "g", "replicas": 1, "cpu": 0, "gpu": 5}]},
        },
        format="json",
    )
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert "requested.gpu" in errors
    assert "the host its workspace launches on has 4" in errors["requested.gpu"][0]
    assert not Job.objects.exists()


def test_workspaces_on_other_targets_do_not_count_against_the_host(world, four_gpus):
    ComputeTarget.objects.create(
        organization=world.org, name="shared", kind="ray", config={"address": "http://ray:8265"}
    )
    world.ws.compute_target = "shared"
    world.ws.save(update_fields=["compute_target"])
    template = gpu_template(world, world.ws)
    jobs = [queue_job(world, world.ws, template, 4, minutes_ago=m) for m in (3, 2)]
    assert set(admission.admit(world.org.pk)) == set(jobs)
    assert not Reservation.objects.filter(host="local").exists()
