"""Tests for the ``kuberay`` launcher: the RayJob it renders, and how it drives the Kubernetes API.

No Kubernetes API server can run on the machines these tests run on, so the client side is
tested against ``kube_stub.KubeStub``: a small in-memory HTTP server on 127.0.0.1 that stands in
for a Kubernetes API server (just the namespace, RayJob, pod-list and pod-log endpoints the
launcher uses) and records every request. The launcher reaches it the production way, through a
kubeconfig in the target config. KubeRay itself does not run either: tests write the RayJob
``status`` that KubeRay would write and create the submitter pods it would create.

Rendered manifests are validated against KubeRay's RayJob CRD schema
(``/work/shared/kuberay/ray.io_rayjobs.yaml``); those tests skip only when that file is absent.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from jobs.launchers.base import (
    RAY_FAILED,
    RAY_PENDING,
    RAY_RUNNING,
    RAY_STOPPED,
    RAY_SUCCEEDED,
    LaunchError,
    LaunchRequest,
    RayJobState,
    launch,
)
from jobs.launchers.kuberay import (
    KubeRayLauncher,
    ray_version_from_image,
    rayjob_state,
    render_rayjob,
    validate_rayjob,
)
from tests.launchers.kube_stub import KubeStub

# The repository is /work/main; the CRD is shared data next to it (../shared from the repo root).
CRD_PATH = Path(__file__).resolve().parents[3] / "shared" / "kuberay" / "ray.io_rayjobs.yaml"
needs_crd = pytest.mark.skipif(not CRD_PATH.is_file(), reason=f"KubeRay CRD not at {CRD_PATH}")

LABELS = {
    "manta.dev/org": "acme",
    "manta.dev/workspace": "ml",
    "manta.dev/job": "42",
    "manta.dev/attempt": "1",
}
NAMESPACE = "manta-ml"  # the default namespace_pattern, "manta-{workspace}"
NAME = "manta-acme-ml-42-1"
RAYJOBS_PATH = f"/apis/ray.io/v1/namespaces/{NAMESPACE}/rayjobs"

REALISTIC_SPEC: dict[str, Any] = {
    "image": "rayproject/ray:2.60.0-py311",
    "entrypoint": "python train.py --epochs 3",
    "runtime_env": {
        "pip": ["torch==2.9.0", "requests==2.34.2"],
        "env_vars": {"WANDB_MODE": "offline", "SEED": "7"},
        "working_dir": "",
    },
    "head": {"cpu": 0, "memory_gb": 4, "gpu": 0},
    "worker_groups": [
        {
            "name": "cpu",
            "replicas": 2,
            "min_replicas": 0,
            "max_replicas": 4,
            "cpu": 4,
            "memory_gb": 16,
            "gpu": 0,
        },
        {
            "name": "gpu",
            "replicas": 1,
            "min_replicas": 1,
            "max_replicas": 2,
            "cpu": 8,
            "memory_gb": 64,
            "gpu": 2,
            "resources": {"accelerator_a100": 2, "TPU": 1},
        },
    ],
    "max_runtime_seconds": 3600,
    "max_retries": 2,
    "priority": 5,
    "ttl_seconds_after_finished": 300,
}


def make_request(
    spec: dict[str, Any] | None = None,
    *,
    target_config: dict[str, Any] | None = None,
    submission_id: str = "att-42-1",
    cluster_name: str = NAME,
    labels: dict[str, str] | None = None,
) -> LaunchRequest:
    return LaunchRequest(
        submission_id=submission_id,
        cluster_name=cluster_name,
        spec=json.loads(json.dumps(spec if spec is not None else REALISTIC_SPEC)),
        labels=dict(labels if labels is not None else LABELS),
        target_config=dict(target_config or {}),
    )


def spec_with(**changes: Any) -> dict[str, Any]:
    spec = json.loads(json.dumps(REALISTIC_SPEC))
    spec.update(changes)
    return spec


@pytest.fixture
def stub() -> Iterator[KubeStub]:
    with KubeStub() as server:
        yield server


@pytest.fixture
def target_config(stub: KubeStub) -> dict[str, Any]:
    return {"kubeconfig": stub.kubeconfig(token="t0ken"), "request_timeout_seconds": 5}


@pytest.fixture
def launcher(target_config: dict[str, Any]) -> Iterator[KubeRayLauncher]:
    instance = KubeRayLauncher(target_config)
    yield instance
    instance.close()


# ---------------------------------------------------------------------------------------------
# (1) Rendering a realistic spec
# ---------------------------------------------------------------------------------------------


def test_render_realistic_spec_key_fields() -> None:
    manifest = render_rayjob(make_request())
    meta, spec = manifest["metadata"], manifest["spec"]
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    workers = {group["groupName"]: group for group in cluster["workerGroupSpecs"]}

    assert manifest["apiVersion"] == "ray.io/v1"
    assert manifest["kind"] == "RayJob"
    assert meta["name"] == NAME
    assert meta["namespace"] == NAMESPACE
    assert LABELS.items() <= meta["labels"].items()
    assert spec["entrypoint"] == "python train.py --epochs 3"
    assert spec["jobId"] == "att-42-1"
    assert spec["submissionMode"] == "K8sJobMode"
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == 300
    assert spec["activeDeadlineSeconds"] == 3600
    assert spec["backoffLimit"] == 2
    # Only the non-empty runtime_env keys, as YAML.
    assert yaml.safe_load(spec["runtimeEnvYAML"]) == {
        "pip": ["torch==2.9.0", "requests==2.34.2"],
        "env_vars": {"WANDB_MODE": "offline", "SEED": "7"},
    }

    assert cluster["rayVersion"] == "2.60.0"
    assert head["rayStartParams"] == {"num-cpus": "0", "dashboard-host": "0.0.0.0"}
    (head_container,) = head["template"]["spec"]["containers"]
    assert head_container["name"] == "ray-head"
    assert head_container["image"] == REALISTIC_SPEC["image"]
    assert head_container["resources"]["limits"]["memory"] == "4Gi"
    assert head_container["resources"]["requests"] == head_container["resources"]["limits"]
    assert "nvidia.com/gpu" not in head_container["resources"]["limits"]

    assert workers["cpu"]["replicas"] == 2
    assert (workers["cpu"]["minReplicas"], workers["cpu"]["maxReplicas"]) == (0, 4)
    assert workers["cpu"]["rayStartParams"] == {}
    assert workers["gpu"]["replicas"] == 1
    (gpu_container,) = workers["gpu"]["template"]["spec"]["containers"]
    assert gpu_container["name"] == "ray-worker"
    assert gpu_container["resources"]["limits"] == {
        "cpu": "8",
        "memory": "64Gi",
        "nvidia.com/gpu": "2",
    }
    assert gpu_container["resources"]["requests"] == gpu_container["resources"]["limits"]
    # Shell-quoted JSON: KubeRay pastes rayStartParams into a `ray start` shell command.
    quoted = workers["gpu"]["rayStartParams"]["resources"]
    assert quoted.startswith("'") and quoted.endswith("'")
    assert json.loads(quoted[1:-1]) == {"TPU": 1, "accelerator_a100": 2}

    # Every pod template (head, workers, submitter) carries the Manta labels.
    templates = [head["template"], spec["submitterPodTemplate"]]
    templates += [group["template"] for group in cluster["workerGroupSpecs"]]
    for template in templates:
        assert LABELS.items() <= template["metadata"]["labels"].items()
    (submitter,) = spec["submitterPodTemplate"]["spec"]["containers"]
    assert submitter["image"] == REALISTIC_SPEC["image"]
    assert spec["submitterPodTemplate"]["spec"]["restartPolicy"] == "Never"


@needs_crd
def test_render_realistic_spec_validates_against_crd() -> None:
    assert validate_rayjob(render_rayjob(make_request()), CRD_PATH) == []


FLAVORS = {
    "a100": {"count": 16, "node_labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
    "h100": {
        "count": 8,
        "node_labels": {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "cloud.example.com/pool": "h100",
        },
    },
}


def flavored(flavor: str, spec: dict[str, Any] | None = None) -> LaunchRequest:
    request = make_request(spec, target_config={"gpu_flavors": FLAVORS})
    return dataclasses.replace(request, gpu_flavor=flavor)


def pod_specs(rayjob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    pods = {"head": cluster["headGroupSpec"]["template"]["spec"]}
    for group in cluster["workerGroupSpecs"]:
        pods[group["groupName"]] = group["template"]["spec"]
    return pods


def test_gpu_pods_of_a_flavor_select_its_nodes_and_never_the_others() -> None:
    spec = spec_with(head={"cpu": 2, "memory_gb": 8, "gpu": 1})
    for flavor, other in (("h100", "a100"), ("a100", "h100")):
        pods = pod_specs(render_rayjob(flavored(flavor, spec)))
        for name in ("head", "gpu"):  # the pods that request GPUs
            assert pods[name]["nodeSelector"] == FLAVORS[flavor]["node_labels"], name
            limits = pods[name]["containers"][0]["resources"]["limits"]
            assert int(limits["nvidia.com/gpu"]) >= 1
        rendered = json.dumps(render_rayjob(flavored(flavor, spec)))
        assert FLAVORS[other]["node_labels"]["nvidia.com/gpu.product"] not in rendered
        assert "nodeSelector" not in pods["cpu"]  # no GPUs: it may run on any node


def test_a_gpu_head_of_no_flavor_gets_no_selector_and_an_undeclared_flavor_is_refused() -> None:
    pods = pod_specs(render_rayjob(make_request()))
    assert all("nodeSelector" not in pod for pod in pods.values())
    with pytest.raises(LaunchError, match="declares no GPU flavor 'l4'"):
        render_rayjob(flavored("l4"))
    # A target with flavors never renders GPU pods without one: they could land on any.
    with pytest.raises(LaunchError, match="this attempt has none"):
        render_rayjob(flavored(""))


@needs_crd
def test_a_flavored_rayjob_validates_against_crd() -> None:
    assert validate_rayjob(render_rayjob(flavored("h100")), CRD_PATH) == []


# ---------------------------------------------------------------------------------------------
# (2) Other shapes of spec all validate
# ---------------------------------------------------------------------------------------------

SPEC_VARIANTS = {
    "no-workers": spec_with(worker_groups=[]),
    "fractional-cpu-and-memory": spec_with(
        head={"cpu": 0.5, "memory_gb": 1.5, "gpu": 0},
        worker_groups=[{"name": "small", "replicas": 1, "cpu": 0.25, "memory_gb": 0.5}],
    ),
    "no-runtime-env": spec_with(runtime_env={}),
    "runtime-env-all-empty": spec_with(runtime_env={"pip": [], "env_vars": {}, "working_dir": ""}),
    "head-with-cpus-and-gpu": spec_with(head={"cpu": 2, "memory_gb": 8, "gpu": 1}),
    "no-deadline-no-retries": spec_with(max_runtime_seconds=None, max_retries=0),
    "untagged-image": spec_with(image="registry.local:5000/team/ray"),
    "minimal": {"image": "rayproject/ray:2.60.0", "entrypoint": "python -c 'print(1)'"},
}


@needs_crd
@pytest.mark.parametrize("spec", SPEC_VARIANTS.values(), ids=SPEC_VARIANTS.keys())
def test_spec_variants_validate(spec: dict[str, Any]) -> None:
    manifest = render_rayjob(make_request(spec))
    assert validate_rayjob(manifest, CRD_PATH) == []


def test_spec_variant_details() -> None:
    no_workers = render_rayjob(make_request(SPEC_VARIANTS["no-workers"]))
    assert no_workers["spec"]["rayClusterSpec"]["workerGroupSpecs"] == []

    fractional = render_rayjob(make_request(SPEC_VARIANTS["fractional-cpu-and-memory"]))
    cluster = fractional["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert head["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "500m",
        "memory": "1536Mi",
    }
    assert head["rayStartParams"]["num-cpus"] == "0"  # `ray start --num-cpus` takes an int
    worker = cluster["workerGroupSpecs"][0]
    assert worker["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "250m",
        "memory": "512Mi",
    }
    assert (worker["replicas"], worker["minReplicas"], worker["maxReplicas"]) == (1, 1, 1)

    assert (
        "runtimeEnvYAML" not in render_rayjob(make_request(SPEC_VARIANTS["no-runtime-env"]))["spec"]
    )
    assert (
        "runtimeEnvYAML"
        not in render_rayjob(make_request(SPEC_VARIANTS["runtime-env-all-empty"]))["spec"]
    )

    gpu_head = render_rayjob(make_request(SPEC_VARIANTS["head-with-cpus-and-gpu"]))
    gpu_head_group = gpu_head["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert gpu_head_group["rayStartParams"]["num-cpus"] == "2"
    assert gpu_head_group["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "2",
        "memory": "8Gi",
        "nvidia.com/gpu": "1",
    }

    unlimited = render_rayjob(make_request(SPEC_VARIANTS["no-deadline-no-retries"]))["spec"]
    assert "activeDeadlineSeconds" not in unlimited  # KubeRay rejects 0
    assert unlimited["backoffLimit"] == 0

    untagged = render_rayjob(make_request(SPEC_VARIANTS["untagged-image"]))
    assert "rayVersion" not in untagged["spec"]["rayClusterSpec"]


def test_namespace_pattern_uses_org_and_workspace() -> None:
    manifest = render_rayjob(
        make_request(target_config={"namespace_pattern": "ray-{org}-{workspace}"})
    )
    assert manifest["metadata"]["namespace"] == "ray-acme-ml"


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("rayproject/ray:2.60.0-py311", "2.60.0"),
        ("rayproject/ray:2.60.0", "2.60.0"),
        ("rayproject/ray-ml:2.9.3-py310-gpu", "2.9.3"),
        ("registry.local:5000/ray:2.60.0-cu121", "2.60.0"),
        ("rayproject/ray:2.60.0@sha256:" + "a" * 64, "2.60.0"),
        ("registry.local:5000/ray", None),
        ("rayproject/ray:latest", None),
        ("rayproject/ray:nightly-py311", None),
        ("rayproject/ray@sha256:" + "a" * 64, None),
    ],
)
def test_ray_version_from_image(image: str, version: str | None) -> None:
    assert ray_version_from_image(image) == version


@pytest.mark.parametrize(
    ("request_kwargs", "message"),
    [
        ({"cluster_name": "manta-" + "x" * 45}, "longer than"),
        ({"cluster_name": "Manta_Bad"}, "DNS-1035"),
        ({"labels": {**LABELS, "manta.dev/workspace": "ML_Team"}}, "namespace"),
        ({"target_config": {"namespace_pattern": "{team}"}}, "namespace_pattern"),
        ({"spec": spec_with(head={"cpu": 0, "memory_gb": 2, "gpu": 0.5})}, "whole number"),
        (
            {"spec": spec_with(worker_groups=[{"name": "w", "replicas": 5, "max_replicas": 2}])},
            "min_replicas <= replicas <= max_replicas",
        ),
        ({"spec": spec_with(worker_groups=[{"name": "w", "memory_gb": 0}])}, "positive"),
        ({"spec": spec_with(entrypoint="  ")}, "entrypoint"),
        ({"spec": spec_with(max_retries=-1)}, "max_retries"),
    ],
)
def test_render_rejects_what_kubernetes_or_kuberay_would(
    request_kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(LaunchError, match=message):
        render_rayjob(make_request(**request_kwargs))


@needs_crd
def test_validate_rayjob_reports_problems() -> None:
    """The validator is not vacuous: it catches schema, pruning, int32 and metadata errors."""
    manifest = render_rayjob(make_request())
    head = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]
    head["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = 0.5  # not int/str
    head["rayStartParams"]["num-cpus"] = 0  # must be a string
    manifest["spec"]["backoffLimit"] = 2**31  # int32
    manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replica"] = 3  # typo: pruned
    manifest["metadata"]["name"] = "x" * 48

    problems = "\n".join(validate_rayjob(manifest, CRD_PATH))

    assert "containers[0].resources.limits.cpu" in problems
    assert "rayStartParams.num-cpus" in problems
    assert "spec.backoffLimit" in problems
    assert "workerGroupSpecs[0].replica: unknown field" in problems
    assert "metadata.name" in problems


# ---------------------------------------------------------------------------------------------
# (3) launch
# ---------------------------------------------------------------------------------------------


def test_plan_renders_without_touching_the_cluster(
    stub: KubeStub, launcher: KubeRayLauncher
) -> None:
    request = make_request()
    assert launcher.plan(request) == {"kind": "kuberay", "manifest": render_rayjob(request)}
    assert stub.requests == []


def test_start_cluster_creates_namespace_and_rayjob_and_submit_only_checks_it(
    stub: KubeStub, launcher: KubeRayLauncher
) -> None:
    request = make_request()

    handle = launcher.start_cluster(request)

    assert handle == {"namespace": NAMESPACE, "name": NAME, "submission_id": "att-42-1"}
    (ns_post,) = stub.requests_to("POST", "/api/v1/namespaces")
    assert ns_post.body["metadata"]["name"] == NAMESPACE
    assert ns_post.body["metadata"]["labels"]["manta.dev/workspace"] == "ml"
    (create,) = stub.requests_to("POST", RAYJOBS_PATH)
    assert create.body == render_rayjob(request)
    assert create.headers["authorization"] == "Bearer t0ken"  # the kubeconfig's credentials
    assert set(stub.rayjobs) == {(NAMESPACE, NAME)}
    assert [r.method for r in stub.requests] == ["POST", "POST"]
    # The RayJob is the submission too: submit() sends nothing, it reads the RayJob back.
    assert launcher.submit(handle, request) == handle
    assert launcher.submit(handle, request) == handle
    assert [r.method for r in stub.requests] == ["POST", "POST", "GET", "GET"]
    assert len(stub.rayjobs) == 1


def test_submit_refuses_a_rayjob_that_is_gone_or_another_submissions(
    stub: KubeStub, launcher: KubeRayLauncher
) -> None:
    handle = launcher.start_cluster(make_request())
    with pytest.raises(LaunchError, match="already exists for submission 'att-42-1'"):
        launcher.submit(handle, make_request(submission_id="att-other"))
    with stub.lock:
        del stub.rayjobs[(NAMESPACE, NAME)]
    with pytest.raises(LaunchError, match="no longer exists"):
        launcher.submit(handle, make_request())


def test_launch_twice_adopts_the_existing_rayjob(stub: KubeStub, launcher: KubeRayLauncher) -> None:
    request = make_request()
    first = launch(launcher, request)
    uid = stub.rayjobs[(NAMESPACE, NAME)]["metadata"]["uid"]
    reads = len(stub.requests_to("GET", f"{RAYJOBS_PATH}/{NAME}"))

    # A different launcher instance, as when another Celery worker takes over the attempt.
    second = KubeRayLauncher({"kubeconfig": stub.kubeconfig()}).start_cluster(request)

    assert second == first
    assert len(stub.requests_to("POST", RAYJOBS_PATH)) == 2  # the second got 409...
    assert len(stub.requests_to("GET", f"{RAYJOBS_PATH}/{NAME}")) == reads + 1  # ...and read it
    assert stub.rayjobs[(NAMESPACE, NAME)]["metadata"]["uid"] == uid  # nothing replaced
    assert len(stub.rayjobs) == 1


def test_launch_refuses_to_adopt_another_submissions_rayjob(
    stub: KubeStub, launcher: KubeRayLauncher
) -> None:
    launch(launcher, make_request(submission_id="att-other"))
    with pytest.raises(LaunchError, match="already exists for submission 'att-other'"):
        launch(launcher, make_request())


def test_launch_into_a_preprovisioned_namespace_without_namespace_rights(
    stub: KubeStub, launcher: KubeRayLauncher
) -> None:
    stub.namespaces[NAMESPACE] = {"metadata": {"name": NAMESPACE}}
    stub.inject_error("POST", r"^/api/v1/namespaces$", 403)

    assert launch(launcher, make_request())["name"] == NAME
    assert (NAMESPACE, NAME) in stub.rayjobs


def test_launch_reports_api_errors(stub: KubeStub, launcher: KubeRayLauncher) -> None:
    stub.inject_error("POST", r"/rayjobs$", 422)
    with pytest.raises(LaunchError, match=r"create RayJob manta-ml/manta-acme-ml-42-1 .*422"):
        launch(launcher, make_request())


# ---------------------------------------------------------------------------------------------
# (4) status
# ---------------------------------------------------------------------------------------------

STATUS_CASES = {
    "no-status-yet": (None, RayJobState(RAY_PENDING, "")),
    "initializing": (
        {"jobDeploymentStatus": "Initializing"},
        RayJobState(RAY_PENDING, "Initializing"),
    ),
    "ray-pending": (
        {"jobStatus": "PENDING", "jobDeploymentStatus": "Running", "message": "queued"},
        RayJobState(RAY_PENDING, "queued"),
    ),
    "running": (
        {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"},
        RayJobState(RAY_RUNNING, ""),
    ),
    "succeeded": (
        {"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete", "message": "done"},
        RayJobState(RAY_SUCCEEDED, "done"),
    ),
    "stopped": (
        {"jobStatus": "STOPPED", "jobDeploymentStatus": "Complete"},
        RayJobState(RAY_STOPPED, ""),
    ),
    "app-failed": (
        {
            "jobStatus": "FAILED",
            "jobDeploymentStatus": "Failed",
            "reason": "AppFailed",
            "message": "Job entrypoint command failed with exit code 1",
        },
        RayJobState(RAY_FAILED, "AppFailed: Job entrypoint command failed with exit code 1"),
    ),
    "deadline-exceeded-while-running": (
        {
            "jobStatus": "RUNNING",
            "jobDeploymentStatus": "Failed",
            "reason": "DeadlineExceeded",
            "message": "The RayJob has passed the activeDeadlineSeconds.",
        },
        RayJobState(
            RAY_FAILED, "DeadlineExceeded: The RayJob has passed the activeDeadlineSeconds."
        ),
    ),
    "validation-failed": (
        {
            "jobDeploymentStatus": "ValidationFailed",
            "reason": "ValidationFailed",
            "message": "bad spec",
        },
        RayJobState(RAY_FAILED, "ValidationFailed: bad spec"),
    ),
    # Ray says FAILED but KubeRay retries (backoffLimit): not over yet.
    "retrying": (
        {"jobStatus": "FAILED", "jobDeploymentStatus": "Retrying", "failed": 1},
        RayJobState(RAY_PENDING, "KubeRay is retrying the job after 1 failure(s)"),
    ),
    # Ray is done but the submitter has not exited yet, so KubeRay has not decided.
    "terminal-before-kuberay-agrees": (
        {"jobStatus": "FAILED", "jobDeploymentStatus": "Running"},
        RayJobState(RAY_RUNNING, "Ray reports FAILED; waiting for KubeRay to finish the RayJob"),
    ),
    "suspended": ({"jobDeploymentStatus": "Suspended"}, RayJobState(RAY_PENDING, "Suspended")),
}


@pytest.mark.parametrize(
    ("status", "expected"), STATUS_CASES.values(), ids=list(STATUS_CASES.keys())
)
def test_status_maps_rayjob_status(
    stub: KubeStub,
    launcher: KubeRayLauncher,
    status: dict[str, Any] | None,
    expected: RayJobState,
) -> None:
    handle = launch(launcher, make_request())
    stub.set_rayjob_status(NAMESPACE, NAME, status)

    assert launcher.status(handle) == expected
    assert stub.requests[-1].method == "GET"
    assert stub.requests[-1].path == f"{RAYJOBS_PATH}/{NAME}"


def test_status_of_a_rayjob_being_deleted_is_stopped() -> None:
    rayjob = {
        "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"},
    }
    assert rayjob_state(rayjob).status == RAY_STOPPED


def test_status_of_a_vanished_rayjob_is_failed(launcher: KubeRayLauncher) -> None:
    state = launcher.status({"namespace": NAMESPACE, "name": "gone", "submission_id": "x"})
    assert state.status == RAY_FAILED
    assert "no longer exists" in state.message


def test_status_raises_launch_error_on_server_errors(
    stub: KubeStub, launcher: KubeRayLauncher
) -> None:
    handle = launch(launcher, make_request())
    stub.inject_error("GET", r"/rayjobs/", 503)
    with pytest.raises(LaunchError, match="503"):
        launcher.status(handle)


def test_status_raises_launch_error_when_unreachable() -> None:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with KubeStub() as stub:
        kubeconfig = stub.kubeconfig().replace(stub.url, f"http://127.0.0.1:{port}")
    launcher = KubeRayLauncher({"kubeconfig": kubeconfig, "request_timeout_seconds": 2})
    with pytest.raises(LaunchError, match="unreachable"):
        launcher.status({"namespace": NAMESPACE, "name": NAME, "submission_id": "x"})


# ---------------------------------------------------------------------------------------------
# (5) stop
# ---------------------------------------------------------------------------------------------


def test_stop_deletes_in_foreground_and_is_idempotent(
    stub: KubeStub, launcher: KubeRayLauncher
) -> None:
    handle = launch(launcher, make_request())

    launcher.stop(handle)

    assert (NAMESPACE, NAME) not in stub.rayjobs
    (delete,) = stub.requests_to("DELETE", f"{RAYJOBS_PATH}/{NAME}")
    assert delete.query.get("propagationPolicy") == "Foreground"
    assert delete.body["propagationPolicy"] == "Foreground"

    launcher.stop(handle)  # 404 now: already gone is fine

    assert len(stub.requests_to("DELETE", f"{RAYJOBS_PATH}/{NAME}")) == 2


def test_stop_raises_on_other_errors(stub: KubeStub, launcher: KubeRayLauncher) -> None:
    handle = launch(launcher, make_request())
    stub.inject_error("DELETE", r"/rayjobs/", 500)
    with pytest.raises(LaunchError, match="delete RayJob"):
        launcher.stop(handle)


# ---------------------------------------------------------------------------------------------
# (6) logs
# ---------------------------------------------------------------------------------------------


def add_submitter_pod(stub: KubeStub, name: str, minute: int, text: str) -> None:
    stub.add_pod(
        NAMESPACE,
        name,
        # What the Job controller puts on a Job's pods, plus the template's labels.
        labels={"job-name": NAME, "batch.kubernetes.io/job-name": NAME, **LABELS},
        created=datetime.datetime(2026, 1, 1, 12, minute, tzinfo=datetime.UTC),
        logs={"ray-job-submitter": text},
    )


def test_logs_returns_the_newest_submitter_pods_log(
    stub: KubeStub, launcher: KubeRayLauncher
) -> None:
    handle = launch(launcher, make_request())
    assert launcher.logs(handle) == ""  # no submitter pod yet

    add_submitter_pod(stub, f"{NAME}-aaaaa", 0, "first try\nsubmit failed\n")
    add_submitter_pod(stub, f"{NAME}-bbbbb", 5, "line 1\nline 2\nline 3\n")
    stub.add_pod(  # the head pod has the Manta labels too, but no job-name
        NAMESPACE,
        f"{NAME}-head-xyz",
        labels={"ray.io/node-type": "head", **LABELS},
        created=datetime.datetime(2026, 1, 1, 12, 9, tzinfo=datetime.UTC),
        logs={"ray-head": "head log\n"},
    )

    assert launcher.logs(handle) == "line 1\nline 2\nline 3\n"
    assert launcher.logs(handle, tail=2) == "line 2\nline 3\n"

    listing = stub.requests_to("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")[-1]
    assert listing.query["labelSelector"] == f"job-name={NAME}"
    read = stub.requests_to("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{NAME}-bbbbb/log")[-1]
    assert read.query == {"container": "ray-job-submitter", "tailLines": "2"}


def test_logs_are_returned_verbatim(stub: KubeStub, launcher: KubeRayLauncher) -> None:
    """A log that happens to be JSON stays text (the client would otherwise json-decode it)."""
    handle = launch(launcher, make_request())
    add_submitter_pod(stub, f"{NAME}-aaaaa", 0, '{"loss": 0.25, "ok": true}\n')
    assert launcher.logs(handle) == '{"loss": 0.25, "ok": true}\n'


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


def test_a_kubeconfig_that_would_run_code_or_read_files_is_refused_before_loading(
    stub: KubeStub, tmp_path: Path
) -> None:
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(stub.kubeconfig(token="from-file"))
    marker = tmp_path / "ran"
    hostile = yaml.safe_load(stub.kubeconfig())
    hostile["users"][0]["user"] = {
        "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "touch",
                 "args": [str(marker)]},
    }  # fmt: skip
    reads = yaml.safe_load(stub.kubeconfig())
    reads["users"][0]["user"] = {"tokenFile": "/etc/shadow"}
    for config, message in (
        ({"kubeconfig": str(path)}, "paths on the worker's host are refused"),
        ({"kubeconfig": hostile}, "users[0].user.exec"),
        ({"kubeconfig": yaml.safe_dump(reads)}, "users[0].user.tokenFile"),
        ({"in_cluster": True}, "MANTA_KUBERAY_IN_CLUSTER"),
    ):
        with pytest.raises(LaunchError, match=re.escape(message)):
            launch(KubeRayLauncher(config), make_request())
    assert not marker.exists()
    assert stub.requests == []


def test_kubeconfig_mapping_and_context(stub: KubeStub) -> None:
    config = yaml.safe_load(stub.kubeconfig(token="mapped"))
    config["contexts"].append({"name": "other", "context": {"cluster": "nowhere", "user": "x"}})
    config["current-context"] = "other"
    launcher = KubeRayLauncher({"kubeconfig": config, "context": "stub"})

    launch(launcher, make_request())

    assert stub.requests[-1].headers["authorization"] == "Bearer mapped"


def test_does_not_touch_the_default_configuration(launcher: KubeRayLauncher) -> None:
    before = k8s.Configuration.get_default_copy().host
    launcher.status({"namespace": NAMESPACE, "name": NAME, "submission_id": "x"})
    assert k8s.Configuration.get_default_copy().host == before


@pytest.mark.parametrize(
    "target_config",
    [
        {},
        {"kubeconfig": "/nonexistent/kubeconfig"},
        {"kubeconfig": "apiVersion: v1\nkind: Config\nclusters: []\n"},
        {"in_cluster": True},  # not running in a pod here
    ],
    ids=["nothing", "missing-file", "empty-kubeconfig", "in-cluster-outside-a-pod"],
)
def test_unusable_config_raises_launch_error(
    target_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    launcher = KubeRayLauncher(target_config)
    assert launcher.plan(make_request())["kind"] == "kuberay"  # plan needs no cluster
    with pytest.raises(LaunchError):
        launcher.status({"namespace": NAMESPACE, "name": NAME, "submission_id": "x"})


@needs_crd
def test_a_rayjob_on_a_warm_raycluster_selects_it_and_carries_no_cluster_spec():
    request = make_request(spec_with(max_retries=0))
    manifest = render_rayjob(request, ray_cluster="manta-warm-7")
    assert manifest["spec"]["clusterSelector"] == {"ray.io/cluster": "manta-warm-7"}
    assert "rayClusterSpec" not in manifest["spec"]
    assert validate_rayjob(manifest, CRD_PATH) == []
    # the rest is the cold RayJob's
    cold = render_rayjob(request)
    del cold["spec"]["rayClusterSpec"]
    del manifest["spec"]["clusterSelector"]
    assert manifest == cold


def test_kuberay_retries_no_job_on_a_cluster_it_did_not_create():
    with pytest.raises(LaunchError, match="max_retries"):
        render_rayjob(make_request(), ray_cluster="manta-warm-7")  # max_retries 2
