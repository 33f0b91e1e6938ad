"""Compute targets (secrets encrypted, never returned) and launch plans for each kind."""

from pathlib import Path

import pytest
import yaml

from jobs.launchers.kuberay import validate_rayjob
from tests.jobs.conftest import submit
from workspaces.models import ComputeTarget

TARGETS = "/api/v1/orgs/acme/compute-targets/"
WS = "/api/v1/orgs/acme/workspaces/ml/"
CRD = Path(__file__).resolve().parents[3] / "shared" / "kuberay" / "ray.io_rayjobs.yaml"
KUBECONFIG = yaml.safe_dump({
    "apiVersion": "v1", "kind": "Config", "current-context": "c",
    "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"}}],
    "users": [{"name": "u", "user": {"token": "kube-secret"}}],
    "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
})  # fmt: skip


@pytest.fixture(autouse=True)
def loopback_ray(settings):
    # These tests point ray targets at this host; the operator allows its loopback.
    settings.MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS = ["127.0.0.0/8"]


def test_ray_target_token_is_encrypted_and_never_returned(world):
    body = {"name": "shared", "kind": "ray",
            "config": {"address": "http://127.0.0.1:8265", "token": "s3cret-token"}}  # fmt: skip
    response = world.client("org_admin").post(TARGETS, body, format="json")
    assert response.status_code == 201, response.content
    assert "s3cret-token" not in response.content.decode()
    assert response.json()["secrets"] == ["token"]
    stored = ComputeTarget.objects.get(name="shared")
    assert "s3cret-token" not in stored.secret_encrypted and "token" not in stored.config
    listed = world.client("developer").get(TARGETS).content.decode()
    assert "s3cret-token" not in listed


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "kind": "slurm"}, "kind"),
        ({"name": "x", "kind": "ray", "config": {}}, "config.address"),
        ({"name": "x", "kind": "ray", "config": {"address": "not a url"}}, "config.address"),
        ({"name": "x", "kind": "kuberay", "config": {}}, "config.kubeconfig"),
        ({"name": "x", "kind": "local", "config": {"work_dir": "/etc"}}, "config.work_dir"),
        ({"name": "Bad Name", "kind": "local"}, "name"),
        # egress: the metadata service, loopback, everything, and beyond the operator's bounds
        (
            {"name": "x", "kind": "local", "config": {"egress_allow": ["169.254.169.254"]}},
            "config.egress_allow",
        ),
        (
            {"name": "x", "kind": "local", "config": {"egress_allow": ["127.0.0.1/32"]}},
            "config.egress_allow",
        ),
        (
            {"name": "x", "kind": "local", "config": {"egress_allow": ["0.0.0.0/0"]}},
            "config.egress_allow",
        ),
        (
            {"name": "x", "kind": "local", "config": {"egress_allow": ["8.8.8.0/24"]}},
            "config.egress_allow",
        ),
        (
            {"name": "x", "kind": "local", "config": {"egress_allow": ["mirror.corp"]}},
            "config.egress_allow",
        ),
        (
            {"name": "x", "kind": "local", "config": {"egress_allow": "10.0.0.0/8"}},
            "config.egress_allow",
        ),
    ],
)
def test_target_rules(world, body, field):
    response = world.client("owner").post(TARGETS, body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert not ComputeTarget.objects.exists()


def test_an_egress_allow_list_reaches_the_launch_plan_and_the_sandbox(world, template):
    body = {"name": "local", "kind": "local", "config": {"egress_allow": ["10.213.0.0/24"]}}
    response = world.client("org_admin").post(TARGETS, body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["config"]["egress_allow"] == ["10.213.0.0/24"]
    job = submit(world, template)
    plan = world.client("developer").get(f"{WS}jobs/{job.pk}/launch-plan/").json()
    assert plan["isolation"]["egress_allow"] == ["10.213.0.0/24"]


def test_only_org_admins_manage_targets(world):
    body = {"name": "x", "kind": "local"}
    assert world.client("ws_admin").post(TARGETS, body, format="json").status_code == 403
    assert world.client("foreign").get(TARGETS).status_code == 404


def test_workspace_must_name_an_existing_target(world):
    client = world.client("ws_admin")
    bad = client.patch(WS, {"compute_target": "nowhere"}, format="json")
    assert bad.status_code == 400 and "compute_target" in bad.json()["errors"]
    world.client("owner").post(TARGETS, {"name": "nowhere", "kind": "local"}, format="json")
    assert client.patch(WS, {"compute_target": "nowhere"}, format="json").status_code == 200
    in_use = world.client("owner").delete(TARGETS + f"{ComputeTarget.objects.get().pk}/")
    assert in_use.status_code == 409


def test_local_launch_plan_lists_nodes(world, template):
    job = submit(world, template)
    plan = world.client("viewer").get(f"{WS}jobs/{job.pk}/launch-plan/").json()
    assert plan["kind"] == "local"
    head, worker = plan["nodes"]
    assert head["role"] == "head" and worker["role"] == "worker"
    assert plan["submission"]["entrypoint"] == job.spec["entrypoint"]


def test_ray_launch_plan_is_the_submission(world, template):
    world.client("owner").post(TARGETS, {"name": "shared", "kind": "ray", "config": {
        "address": "http://127.0.0.1:8265", "token": "t"}}, format="json")  # fmt: skip
    world.client("owner").patch(WS, {"compute_target": "shared"}, format="json")
    world.ws.refresh_from_db()
    job = submit(world, template)
    plan = world.client("viewer").get(f"{WS}jobs/{job.pk}/launch-plan/").json()
    assert plan["kind"] == "ray" and plan["address"] == "http://127.0.0.1:8265"
    assert "t" not in plan.get("submission", {}).values()


def test_kuberay_launch_plan_is_a_valid_rayjob(world, template):
    world.client("owner").post(
        TARGETS,
        {"name": "k8s", "kind": "kuberay", "config": {"kubeconfig": KUBECONFIG}},
        format="json",
    )
    world.client("owner").patch(WS, {"compute_target": "k8s"}, format="json")
    world.ws.refresh_from_db()
    job = submit(world, template)
    response = world.client("viewer").get(f"{WS}jobs/{job.pk}/launch-plan/")
    assert response.status_code == 200, response.content
    manifest = response.json()["manifest"]
    assert manifest["kind"] == "RayJob" and manifest["metadata"]["namespace"] == "manta-ml"
    assert manifest["spec"]["entrypoint"] == job.spec["entrypoint"]
    assert "kube-secret" not in response.content.decode()
    if CRD.exists():
        assert validate_rayjob(manifest, str(CRD)) == []
