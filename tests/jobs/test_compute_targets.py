"""Compute targets (secrets encrypted, never returned) and launch plans for each kind."""

from pathlib import Path

import pytest
import yaml

from jobs.launchers.kuberay import validate_rayjob
from jobs.local_host import workspaces_on_host
from tests.jobs.conftest import submit
from workspaces.models import ComputeTarget, Workspace

TARGETS = "/api/v1/orgs/acme/compute-targets/"
WS = "/api/v1/orgs/acme/workspaces/ml/"
CRD = Path(__file__).resolve().parents[3] / "shared" / "kuberay" / "ray.io_rayjobs.yaml"
KUBECONFIG = yaml.safe_dump({
    "apiVersion": "v1", "kind": "Config", "current-context": "c",
    "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"}}],
    "users": [{"name": "u", "user": {"token": "kube-secret"}}],
    "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
})  # fmt: skip


FLAVOR = {"count": 8, "node_labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
A100 = {"count": 4, "node_labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}


def kuberay_flavors(flavors) -> dict:
    return {
        "name": "x",
        "kind": "kuberay",
        "config": {"kubeconfig": KUBECONFIG, "gpu_flavors": flavors},
    }


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
        # GPU flavors: kuberay only (the local host's come from its inventory), named by the
        # rule, counted, and each on nodes of its own
        ({"name": "x", "kind": "local", "config": {"gpu_flavors": {}}}, "config.gpu_flavors"),
        (kuberay_flavors({"H100": FLAVOR}), "config.gpu_flavors.H100"),
        (kuberay_flavors({"h100": {"count": 8}}), "config.gpu_flavors.h100.node_labels"),
        (kuberay_flavors({"h100": {**FLAVOR, "count": -1}}), "config.gpu_flavors.h100.count"),
        (
            kuberay_flavors({"h100": {**FLAVOR, "node_labels": {}}}),
            "config.gpu_flavors.h100.node_labels",
        ),
        (
            kuberay_flavors({"h100": {**FLAVOR, "node_labels": {"bad key!": "x"}}}),
            "config.gpu_flavors.h100.node_labels",
        ),
        (
            kuberay_flavors({"h100": {**FLAVOR, "zone": "a"}}),
            "config.gpu_flavors.h100.zone",
        ),
        (kuberay_flavors({"h100": FLAVOR, "a100": FLAVOR}), "config.gpu_flavors.a100"),
        (kuberay_flavors(["h100"]), "config.gpu_flavors"),
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


def test_a_kuberay_targets_flavors_bind_admission_and_place_the_pods(world):
    """A workspace on a kuberay target with h100 (8) and a100 (4): a job naming a flavor the
    target lacks, or more than it has, is refused; h100 jobs share the target's 8; an admitted
    job's RayJob selects the h100 nodes."""
    from jobs import admission
    from jobs.models import Job
    from quotas.models import OrgQuota
    from tests.quotas.test_flavors import gpu_template, overrides

    body = kuberay_flavors({"h100": FLAVOR, "a100": A100})
    body["name"] = "k8s"
    assert world.client("owner").post(TARGETS, body, format="json").status_code == 201
    world.client("owner").patch(WS, {"compute_target": "k8s"}, format="json")
    world.ws.refresh_from_db()
    OrgQuota.objects.create(organization=world.org, policy="round_robin")
    template = gpu_template(world.ws)
    jobs = f"{WS}jobs/"

    def post(gpu, flavor=None):
        changes = overrides(gpu, flavor)
        changes["worker_groups"][0].update(cpu=1, memory_gb=1)  # a pod needs some
        body = {"template": template.pk, "overrides": changes}
        return world.client("developer").post(jobs, body, format="json")

    lacking = post(1, "l4")
    assert lacking.status_code == 400, lacking.content
    assert "compute target k8s has no GPU flavor l4" in lacking.json()["errors"]["gpu_flavor"][0]
    assert post(9, "h100").status_code == 400
    first, second, third = post(6, "h100"), post(4, "h100"), post(4)
    assert admission.admit(world.org.pk) == [first.json()["id"], third.json()["id"]]
    waiting = Job.objects.get(pk=second.json()["id"])
    assert admission.explain(waiting)["waiting_for"] == (
        "compute target k8s's GPU flavor h100 capacity 8: 6 reserved, this job needs 4"
    )
    # No flavor named: the target's, in name order; a100 fits.
    assert world.client("viewer").get(f"{jobs}{third.json()['id']}/").json()["gpu_flavor"] == (
        "a100"
    )
    plan = world.client("viewer").get(f"{jobs}{first.json()['id']}/launch-plan/").json()
    gpu_pod = plan["manifest"]["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]
    assert gpu_pod["spec"]["nodeSelector"] == FLAVOR["node_labels"]
    # Queued, not admitted yet: its plan shows the flavor it asks for first.
    plan = world.client("viewer").get(f"{jobs}{second.json()['id']}/launch-plan/").json()
    gpu_pod = plan["manifest"]["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]
    assert gpu_pod["spec"]["nodeSelector"] == FLAVOR["node_labels"]


def test_which_workspaces_launch_on_this_host(world):
    """The admission pass's one statement: a workspace launches here on the built-in ``local``
    target or on one of its organisation's ``local`` targets; an organisation that named a
    target of its own ``local`` takes the name from the built-in one."""
    org = world.org
    made = {
        name: Workspace.objects.create(organization=org, slug=name, name=name, compute_target=to)
        for name, to in [("box-ws", "box"), ("ray-ws", "cluster"), ("builtin-ws", "local")]
    }
    ComputeTarget.objects.create(organization=org, name="box", kind="local")
    ComputeTarget.objects.create(organization=org, name="cluster", kind="ray")
    other = Workspace.objects.create(organization=world.other_org, slug="x", name="x")
    here = {world.ws.pk, made["box-ws"].pk, made["builtin-ws"].pk}
    assert workspaces_on_host(org.pk) == here
    assert other.pk in workspaces_on_host(world.other_org.pk)

    ComputeTarget.objects.create(organization=org, name="local", kind="ray")
    assert workspaces_on_host(org.pk) == {made["box-ws"].pk}
