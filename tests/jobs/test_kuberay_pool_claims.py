"""Claims of a kuberay pool's warm RayClusters racing on real PostgreSQL connections (threads):
each RayCluster is handed to one attempt at most, and every RayJob created selects its own.

Its own module: the rows must be committed before the threads look, which a module that shares
a world built in a transaction cannot give. The Kubernetes API server is a truly external
system: ``KubeStub`` (``tests/launchers/kube_stub.py``) stands in for it on 127.0.0.1."""

from __future__ import annotations

import pytest

from config import secrets as secrets_box
from jobs import pool_upkeep, pools
from jobs.launch_requests import launch_request, resolve_target
from jobs.launchers.kuberay.manifest import CLUSTER_SELECTOR_KEY
from jobs.models import JobAttempt, WarmPool
from tests import factories as f
from tests.conftest import SYSTEM
from tests.jobs.conftest import counter_spec
from tests.jobs.test_pool_claims import at_once
from tests.launchers.kube_stub import KubeStub


@pytest.fixture
def stub():
    with KubeStub() as server:
        yield server


def shape():
    spec = counter_spec()
    return {key: spec[key] for key in ("image", "head", "worker_groups")}


@pytest.mark.django_db(transaction=True)
def test_two_attempts_claiming_at_once_never_get_the_same_raycluster(stub):
    org = f.OrganizationFactory()
    ws = f.WorkspaceFactory(organization=org, compute_target="k8s")
    f.ComputeTargetFactory(
        organization=org,
        name="k8s",
        kind="kuberay",
        config={},
        secret_encrypted=secrets_box.encrypt_json({"kubeconfig": stub.kubeconfig()}),
    )
    pool = pools.pool_create(
        actor=SYSTEM,
        organization=org,
        target_name="k8s",
        spec=shape(),
        size=0,
        workspace=ws.slug,
    )
    WarmPool.objects.filter(pk=pool.pk).update(size=3)
    assert pool_upkeep.pool_fill(pool.pk) == 3
    attempts = [
        f.JobAttemptFactory(
            job__workspace=ws,
            job__spec=counter_spec(),
            state="launching",
            target_kind="kuberay",
            target_name="k8s",
        )
        for _ in range(6)
    ]

    loaded = JobAttempt.objects.select_related("job__workspace").in_bulk([a.pk for a in attempts])
    requests = {pk: launch_request(a, resolve_target(a.job)) for pk, a in loaded.items()}

    def take(attempt: JobAttempt) -> str | None:  # only the take races: the rest is done
        taken = pool_upkeep.warm_take(loaded[attempt.pk], requests[attempt.pk], "kuberay")
        return taken and taken[0]["ray_cluster"]

    got = at_once(attempts, take)
    taken = [name for name in got.values() if name]
    assert len(taken) == 3 and len(set(taken)) == 3  # each RayCluster once, none twice
    selectors = [
        job["spec"]["clusterSelector"][CLUSTER_SELECTOR_KEY] for job in stub.rayjobs.values()
    ]
    assert sorted(selectors) == sorted(taken)
    pool.refresh_from_db()
    assert (pool.hits, pool.misses) == (3, 3)
