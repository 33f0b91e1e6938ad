"""The RayJob as an object: rendering the ``ray.io/v1`` manifest for a request, and reading the
job's state back from its ``status``. Pure: no I/O.

The manifest: KubeRay creates a RayCluster from ``spec.rayClusterSpec``, runs ``ray job submit``
in a submitter Kubernetes Job (``K8sJobMode``) with ``spec.jobId`` as the submission id, tears
the cluster down after the job finishes, and retries up to ``spec.backoffLimit`` times.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Mapping
from typing import Any

import yaml

from ..base import (
    RAY_FAILED,
    RAY_PENDING,
    RAY_RUNNING,
    RAY_STOPPED,
    RAY_TERMINAL,
    LaunchError,
    LaunchRequest,
    RayJobState,
)
from .flavors import node_selector, place_gpu_pods

GROUP = "ray.io"
VERSION = "v1"
PLURAL = "rayjobs"
CLUSTER_PLURAL = "rayclusters"
# KubeRay reads the RayCluster's name from this key of a RayJob's clusterSelector.
CLUSTER_SELECTOR_KEY = "ray.io/cluster"

DEFAULT_NAMESPACE_PATTERN = "manta-{workspace}"
LABEL_ORG = "manta.dev/org"
LABEL_WORKSPACE = "manta.dev/workspace"
MANAGED_BY = {"app.kubernetes.io/managed-by": "manta"}
# On a warm RayCluster: its pool and its row (jobs.models.WarmPool / WarmCluster ids).
LABEL_POOL = "manta.dev/warm-pool"
LABEL_WARM = "manta.dev/warm-cluster"

HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
# KubeRay's own name for the submitter container; the submitter Job (named after the RayJob) runs
# its pod from our submitterPodTemplate, and KubeRay fills in the `ray job submit` command.
SUBMITTER_CONTAINER = "ray-job-submitter"
# The Job controller labels every pod of a Job with `job-name=<job name>` (all Kubernetes
# versions; 1.27+ also sets batch.kubernetes.io/job-name), and KubeRay names the submitter Job
# exactly like the RayJob.
SUBMITTER_POD_SELECTOR = "job-name={name}"

# `ray job submit` plus `ray job logs --follow` is one small Python process.
SUBMITTER_RESOURCES = {
    "requests": {"cpu": "200m", "memory": "256Mi"},
    "limits": {"cpu": "1", "memory": "1Gi"},
}
HEAD_PORTS = [
    {"containerPort": 6379, "name": "gcs-server"},
    {"containerPort": 8265, "name": "dashboard"},
    {"containerPort": 10001, "name": "client"},
]

# KubeRay appends 6 characters to the RayJob name for the RayCluster name and caps RayCluster
# names at 53 so that its longest Service name still fits 63 (utils.MaxRayJobNameLength = 47);
# a longer name fails KubeRay's validation after the API server has accepted the object.
MAX_RAYJOB_NAME_LENGTH = 47
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_RAY_VERSION_TAG = re.compile(r"^v?(\d+\.\d+\.\d+)(?:[-_.+].*)?$")

_INT32 = (-(2**31), 2**31 - 1)


def render_rayjob(request: LaunchRequest, *, ray_cluster: str | None = None) -> dict[str, Any]:
    """Render the ``ray.io/v1`` RayJob manifest for ``request``, as a JSON-able dict.

    With ``ray_cluster`` (a warm RayCluster already running in the request's namespace) the
    RayJob names it in ``spec.clusterSelector`` and carries no ``rayClusterSpec``: KubeRay
    submits to that cluster and neither creates nor deletes it (the caller deletes it after the
    attempt). KubeRay refuses ``backoffLimit`` > 0 in that mode, so a job that asks for retries
    cannot run on one.

    Pure: no I/O. Raises :class:`LaunchError` when the request cannot become a RayJob the API
    server and KubeRay would accept (a bad name or namespace, an invalid label, a resource amount
    Kubernetes cannot express, inconsistent replica counts).
    """
    spec = request.spec
    name = request.cluster_name
    _check_rayjob_name(name)
    namespace = namespace_for(request)
    labels = _object_labels(request.labels)
    image = _image(spec)
    entrypoint = spec.get("entrypoint")
    if not isinstance(entrypoint, str) or not entrypoint.strip():
        raise LaunchError("spec.entrypoint is required")
    # Rendered even for a warm cluster: the request must be one a cold start would accept.
    cluster_spec = render_cluster_spec(request)

    job_spec: dict[str, Any] = {"entrypoint": entrypoint}
    runtime_env = {k: v for k, v in (spec.get("runtime_env") or {}).items() if v}
    if runtime_env:
        # KubeRay turns this YAML into `--runtime-env-json` for `ray job submit`.
        job_spec["runtimeEnvYAML"] = yaml.safe_dump(runtime_env, sort_keys=False)
    job_spec["submissionMode"] = "K8sJobMode"
    job_spec["submitterPodTemplate"] = {
        "metadata": {"labels": dict(labels)},
        "spec": {
            # A Job's pods must not restart in place; the Job's own backoff retries the submitter.
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": SUBMITTER_CONTAINER,
                    "image": image,
                    "resources": copy.deepcopy(SUBMITTER_RESOURCES),
                }
            ],
        },
    }
    job_spec["shutdownAfterJobFinishes"] = True
    job_spec["ttlSecondsAfterFinished"] = _int(
        spec.get("ttl_seconds_after_finished") or 0, "ttl_seconds_after_finished", minimum=0
    )
    max_runtime = spec.get("max_runtime_seconds")
    if max_runtime:
        # KubeRay rejects activeDeadlineSeconds <= 0, so "no limit" means leaving it out.
        job_spec["activeDeadlineSeconds"] = _int(max_runtime, "max_runtime_seconds", minimum=1)
    job_spec["backoffLimit"] = _int(spec.get("max_retries") or 0, "max_retries", minimum=0)
    job_spec["jobId"] = request.submission_id
    if ray_cluster is None:
        job_spec["rayClusterSpec"] = cluster_spec
    elif job_spec["backoffLimit"]:
        raise LaunchError("max_retries: KubeRay retries no job on a cluster it did not create")
    else:
        job_spec["clusterSelector"] = {CLUSTER_SELECTOR_KEY: ray_cluster}

    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": job_spec,
    }


def render_cluster_spec(request: LaunchRequest) -> dict[str, Any]:
    """The RayCluster spec a RayJob of ``request`` has KubeRay create: the image, the head and
    worker groups (requests == limits), the GPU pods on their flavor's nodes. Pure."""
    spec = request.spec
    image = _image(spec)
    labels = _object_labels(request.labels)
    cluster_spec: dict[str, Any] = {}
    ray_version = ray_version_from_image(image)
    if ray_version:
        cluster_spec["rayVersion"] = ray_version
    cluster_spec["headGroupSpec"] = _head_group(
        spec.get("head") or {}, image, labels, request.target_config
    )
    cluster_spec["workerGroupSpecs"] = _worker_groups(
        spec.get("worker_groups") or [], image, labels
    )
    place_gpu_pods(cluster_spec, node_selector(request))
    return cluster_spec


def render_raycluster(request: LaunchRequest) -> dict[str, Any]:
    """A warm RayCluster (``ray.io/v1``) of ``request``'s shape, named ``request.cluster_name``
    and labelled with ``request.labels`` (its pool's).

    It is started before its tenant is known and waits in the namespace, so it has Ray's token
    authentication on (``authOptions.mode: token``, KubeRay 1.5.1+ and Ray 2.52+): KubeRay
    generates a Secret with a random token for this RayCluster alone, gives it to the
    cluster's containers and to the submitter of the RayJob that selects it, and deletes it
    with the cluster. No token is shared between clusters, and none passes through Manta.
    An older KubeRay prunes the field (its CRD has no ``authOptions``); an older Ray ignores it.
    """
    _check_rayjob_name(request.cluster_name)
    labels = _object_labels(request.labels)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RayCluster",
        "metadata": {
            "name": request.cluster_name,
            "namespace": namespace_for(request),
            "labels": labels,
        },
        "spec": {**render_cluster_spec(request), "authOptions": {"mode": "token"}},
    }


def cluster_shape(request: LaunchRequest) -> dict[str, Any]:
    """What a warm RayCluster must be to serve ``request``: its namespace and the RayCluster
    spec a cold start would create, pod labels left out (they name the job, or the pool)."""
    cluster_spec = render_cluster_spec(request)
    groups = [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]
    for group in groups:
        group["template"]["metadata"].pop("labels", None)
    return {"namespace": namespace_for(request), "spec": cluster_spec}


def _image(spec: Mapping[str, Any]) -> str:
    image = spec.get("image")
    if not isinstance(image, str) or not image:
        raise LaunchError("spec.image is required")
    return image


def namespace_for(request: LaunchRequest) -> str:
    """The namespace the request's RayJob lives in: ``namespace_pattern`` formatted with the org
    and workspace slugs from the request labels. Raises LaunchError unless it is a valid
    Kubernetes namespace name."""
    pattern = request.target_config.get("namespace_pattern") or DEFAULT_NAMESPACE_PATTERN
    slugs = {
        "org": request.labels.get(LABEL_ORG, ""),
        "workspace": request.labels.get(LABEL_WORKSPACE, ""),
    }
    try:
        namespace = str(pattern).format_map(slugs)
    except (KeyError, IndexError, ValueError) as exc:
        raise LaunchError(
            f"namespace_pattern {pattern!r} is invalid: only {{org}} and {{workspace}} are known"
        ) from exc
    if len(namespace) > 63 or not DNS1123_LABEL.match(namespace):
        raise LaunchError(
            f"namespace {namespace!r} (from namespace_pattern {pattern!r}) is not a valid "
            "Kubernetes namespace name (lowercase letters, digits and '-', at most 63 characters)"
        )
    return namespace


def ray_version_from_image(image: str) -> str | None:
    """The Ray version an image tag names (``rayproject/ray:2.60.0-py311`` -> ``"2.60.0"``), or
    None when the tag names none (``latest``, ``nightly``, no tag, digest only)."""
    reference = image.split("@", 1)[0]
    _, colon, tag = reference.rpartition(":")
    if not colon or "/" in tag:  # no tag, or the colon was a registry port
        return None
    match = _RAY_VERSION_TAG.match(tag)
    return match.group(1) if match else None


def _head_group(
    head: Mapping[str, Any], image: str, labels: dict[str, str], target: Mapping[str, Any]
) -> dict[str, Any]:
    ray_cpus = _number(head.get("cpu") or 0, "head.cpu")
    # Ray's logical CPUs on the head (`--num-cpus`, an integer) are 0 by default so that tasks
    # and actors go to workers and the head only runs GCS, the dashboard and the driver; those
    # still need real CPU, so the container gets head_pod_cpu then.
    pod_cpu = ray_cpus if ray_cpus > 0 else _number(target.get("head_pod_cpu", 1), "head_pod_cpu")
    params = {"num-cpus": str(int(ray_cpus)), "dashboard-host": "0.0.0.0"}
    custom = head.get("resources") or {}
    if custom:
        params["resources"] = _custom_resources_param(custom, "head.resources")
    container = {
        "name": HEAD_CONTAINER,
        "image": image,
        "ports": [dict(port) for port in HEAD_PORTS],
        "resources": _resources(pod_cpu, head.get("memory_gb", 2), head.get("gpu") or 0, "head"),
    }
    return {
        "rayStartParams": params,
        "template": {"metadata": {"labels": dict(labels)}, "spec": {"containers": [container]}},
    }


def _worker_groups(
    groups: list[Mapping[str, Any]], image: str, labels: dict[str, str]
) -> list[dict[str, Any]]:
    rendered = []
    seen: set[str] = set()
    for index, group in enumerate(groups):
        where = f"worker_groups[{index}]"
        group_name = str(group.get("name") or f"workers-{index}")
        # KubeRay puts the group name in the `ray.io/group` pod label and in pod names.
        if len(group_name) > 63 or not DNS1123_LABEL.match(group_name):
            raise LaunchError(f"{where}.name {group_name!r} must be a DNS-1123 label")
        if group_name in seen:
            raise LaunchError(f"{where}.name {group_name!r} is used twice")
        seen.add(group_name)
        replicas = _int(group.get("replicas", 1), f"{where}.replicas", minimum=0)
        min_replicas = _int(group.get("min_replicas", replicas), f"{where}.min_replicas", minimum=0)
        max_replicas = _int(
            group.get("max_replicas", max(replicas, min_replicas)), f"{where}.max_replicas"
        )
        if not min_replicas <= replicas <= max_replicas:
            raise LaunchError(
                f"{where}: need min_replicas <= replicas <= max_replicas, got "
                f"{min_replicas} <= {replicas} <= {max_replicas}"
            )
        params: dict[str, str] = {}
        custom = group.get("resources") or {}
        if custom:
            params["resources"] = _custom_resources_param(custom, f"{where}.resources")
        container = {
            "name": WORKER_CONTAINER,
            "image": image,
            "resources": _resources(
                _number(group.get("cpu", 1), f"{where}.cpu"),
                group.get("memory_gb", 1),
                group.get("gpu") or 0,
                where,
            ),
        }
        rendered.append(
            {
                "groupName": group_name,
                "replicas": replicas,
                "minReplicas": min_replicas,
                "maxReplicas": max_replicas,
                "rayStartParams": params,
                "template": {
                    "metadata": {"labels": dict(labels)},
                    # A worker node whose Ray processes die restarts in place and joins
                    # the head again (KubeRay recreates a pod that is deleted or evicted).
                    "spec": {"restartPolicy": "Always", "containers": [container]},
                },
            }
        )
    return rendered


def _resources(cpu: float, memory_gb: Any, gpu: Any, where: str) -> dict[str, dict[str, str]]:
    """requests == limits (Guaranteed QoS: Ray sizes its object store and scheduling from what
    the pod may use, so a pod that can be throttled or evicted below that is a liability)."""
    amounts = {
        "cpu": _cpu_quantity(cpu, f"{where}.cpu"),
        "memory": _memory_quantity(_number(memory_gb, f"{where}.memory_gb"), f"{where}.memory_gb"),
    }
    gpus = _number(gpu, f"{where}.gpu")
    if gpus:
        if gpus < 0 or gpus != int(gpus):
            raise LaunchError(f"{where}.gpu must be a whole number of GPUs, got {gpu!r}")
        amounts["nvidia.com/gpu"] = str(int(gpus))
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _cpu_quantity(cpu: float, where: str) -> str:
    """A Kubernetes CPU quantity: whole cores as ``"2"``, fractions as millicores (``"500m"``)."""
    if cpu <= 0:
        raise LaunchError(f"{where} must be positive, got {cpu!r}")
    millis = max(1, round(cpu * 1000))
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def _memory_quantity(gib: float, where: str) -> str:
    """A Kubernetes memory quantity: whole GiB as ``"4Gi"``, otherwise MiB (``"1536Mi"``)."""
    if gib <= 0:
        raise LaunchError(f"{where} must be positive, got {gib!r}")
    if gib == int(gib):
        return f"{int(gib)}Gi"
    return f"{max(1, round(gib * 1024))}Mi"


def _custom_resources_param(resources: Mapping[str, Any], where: str) -> str:
    """The ``resources`` rayStartParam: JSON, shell-quoted.

    KubeRay pastes rayStartParams into a shell command (``ray start --resources=<value>``), so
    bare JSON would lose its quotes; KubeRay strips the outer quotes when it reads the value back
    (for the autoscaler), so single-quoted JSON works on both paths.
    """
    amounts = {str(k): _number(v, f"{where}.{k}") for k, v in resources.items()}
    return shlex.quote(json.dumps(amounts, separators=(",", ":"), sort_keys=True))


def _object_labels(labels: Mapping[str, str]) -> dict[str, str]:
    merged = {**MANAGED_BY, **{str(k): str(v) for k, v in labels.items()}}
    problems = label_problems(merged)
    if problems:
        raise LaunchError("invalid labels: " + "; ".join(problems))
    return merged


def label_problems(labels: Mapping[str, Any]) -> list[str]:
    problems = []
    for key, value in labels.items():
        prefix, slash, name = str(key).rpartition("/")
        if (
            len(name) > 63
            or not _LABEL_NAME.match(name)
            or (slash and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)))
        ):
            problems.append(f"label key {key!r} is not a valid Kubernetes label key")
        if (
            not isinstance(value, str)
            or len(value) > 63
            or (value and not _LABEL_NAME.match(value))
        ):
            problems.append(f"label {key!r} value {value!r} is not a valid Kubernetes label value")
    return problems


def _check_rayjob_name(name: str) -> None:
    problems = rayjob_name_problems(name)
    if problems:
        raise LaunchError("; ".join(problems))


def rayjob_name_problems(name: Any) -> list[str]:
    if not isinstance(name, str) or not _DNS1035_LABEL.match(name):
        return [
            f"RayJob name {name!r} must be a DNS-1035 label (lowercase letters, digits and '-', "
            "starting with a letter)"
        ]
    if len(name) > MAX_RAYJOB_NAME_LENGTH:
        return [
            f"RayJob name {name!r} is longer than KubeRay's {MAX_RAYJOB_NAME_LENGTH} characters"
        ]
    return []


def _number(value: Any, where: str) -> float:
    # bool is an int subclass; `gpu: true` is a spec bug, not 1 GPU.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LaunchError(f"{where} must be a number, got {value!r}")
    return value


def _int(value: Any, where: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise LaunchError(f"{where} must be a whole number, got {value!r}")
    result = int(value)
    if minimum is not None and result < minimum:
        raise LaunchError(f"{where} must be at least {minimum}, got {result}")
    if not _INT32[0] <= result <= _INT32[1]:
        raise LaunchError(f"{where} does not fit the CRD's int32, got {result}")
    return result


def rayjob_state(rayjob: Mapping[str, Any]) -> RayJobState:
    """Map a RayJob object (as returned by the API) to a :class:`RayJobState`.

    ``status.jobStatus`` is Ray's view of the job; ``status.jobDeploymentStatus`` is KubeRay's
    view of the whole RayJob. A terminal Ray status is only reported once KubeRay agrees the
    RayJob is over (``Complete``/``Failed``): before that KubeRay may still retry the job
    (``backoffLimit``: ``Failed`` becomes ``Retrying``) or wait for the submitter to exit, so
    reporting FAILED early would end an attempt that is about to run again.
    """
    status = rayjob.get("status") or {}
    job_status = str(status.get("jobStatus") or "")
    deployment = str(status.get("jobDeploymentStatus") or "")
    message = str(status.get("message") or "")
    reason = str(status.get("reason") or "")
    deleting = bool((rayjob.get("metadata") or {}).get("deletionTimestamp"))

    if deployment in ("Failed", "ValidationFailed"):
        detail = ": ".join(part for part in (reason or deployment, message) if part)
        return RayJobState(RAY_FAILED, detail)
    if deployment == "Complete":
        if job_status in RAY_TERMINAL:
            return RayJobState(job_status, message)
        return RayJobState(
            RAY_FAILED, f"KubeRay reports the RayJob Complete with job status {job_status!r}"
        )
    if deleting:
        return RayJobState(RAY_STOPPED, "the RayJob is being deleted")
    if deployment == "Retrying":
        failures = status.get("failed") or 0
        return RayJobState(RAY_PENDING, f"KubeRay is retrying the job after {failures} failure(s)")
    if job_status in RAY_TERMINAL:
        return RayJobState(
            RAY_RUNNING, f"Ray reports {job_status}; waiting for KubeRay to finish the RayJob"
        )
    if job_status in (RAY_PENDING, RAY_RUNNING):
        return RayJobState(job_status, message)
    # "" / Initializing / Waiting / Suspending / Suspended: the cluster is not up yet.
    return RayJobState(RAY_PENDING, deployment or message)
