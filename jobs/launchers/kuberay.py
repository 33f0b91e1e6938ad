"""The ``kuberay`` launcher: one KubeRay ``RayJob`` (ray.io/v1) per attempt, on Kubernetes.

KubeRay does the heavy lifting: it creates a RayCluster from ``spec.rayClusterSpec``, runs
``ray job submit`` in a submitter Kubernetes Job (``K8sJobMode``) with ``spec.jobId`` as the
submission id, tears the cluster down after the job finishes, and retries up to
``spec.backoffLimit`` times. This module only renders the manifest (:func:`render_rayjob`, pure)
and talks to the Kubernetes API (:class:`KubeRayLauncher`).

Target config keys (all optional except a way to reach the cluster):

* ``kubeconfig``: the kubeconfig's YAML text or the parsed mapping (no exec or auth-provider
  plugins, no file references; a path on this host is refused);
* ``context``: the kubeconfig context to use (default: its current-context);
* ``in_cluster``: ``true`` to use the pod's service account instead of a kubeconfig, only with
  ``in_cluster_allowed`` (the operator's MANTA_KUBERAY_IN_CLUSTER);
* ``namespace_pattern``: default ``"manta-{workspace}"``; ``{org}`` and ``{workspace}`` are the
  slugs from the request labels;
* ``head_pod_cpu``: the head container's CPU when the spec gives the head 0 Ray CPUs (default 1);
* ``request_timeout_seconds``: per Kubernetes API call (default 30).
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
import os
import re
import shlex
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from workspaces import kubeconfig as tenant_kubeconfig

from .base import (
    RAY_FAILED,
    RAY_PENDING,
    RAY_RUNNING,
    RAY_STOPPED,
    RAY_TERMINAL,
    LaunchError,
    LaunchRequest,
    RayJobState,
)

__all__ = [
    "DEFAULT_NAMESPACE_PATTERN",
    "KubeRayLauncher",
    "build_api_client",
    "namespace_for",
    "ray_version_from_image",
    "rayjob_state",
    "render_rayjob",
    "validate_rayjob",
]

GROUP = "ray.io"
VERSION = "v1"
PLURAL = "rayjobs"

DEFAULT_NAMESPACE_PATTERN = "manta-{workspace}"
LABEL_ORG = "manta.dev/org"
LABEL_WORKSPACE = "manta.dev/workspace"
MANAGED_BY = {"app.kubernetes.io/managed-by": "manta"}

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
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_RAY_VERSION_TAG = re.compile(r"^v?(\d+\.\d+\.\d+)(?:[-_.+].*)?$")

_INT32 = (-(2**31), 2**31 - 1)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Rendering (pure)
# ---------------------------------------------------------------------------------------------


def render_rayjob(request: LaunchRequest) -> dict[str, Any]:
    """Render the ``ray.io/v1`` RayJob manifest for ``request``, as a JSON-able dict.

    Pure: no I/O. Raises :class:`LaunchError` when the request cannot become a RayJob the API
    server and KubeRay would accept (a bad name or namespace, an invalid label, a resource amount
    Kubernetes cannot express, inconsistent replica counts).
    """
    spec = request.spec
    target = request.target_config
    name = request.cluster_name
    _check_rayjob_name(name)
    namespace = namespace_for(request)
    labels = _object_labels(request.labels)

    image = spec.get("image")
    if not isinstance(image, str) or not image:
        raise LaunchError("spec.image is required")
    entrypoint = spec.get("entrypoint")
    if not isinstance(entrypoint, str) or not entrypoint.strip():
        raise LaunchError("spec.entrypoint is required")

    cluster_spec: dict[str, Any] = {}
    ray_version = ray_version_from_image(image)
    if ray_version:
        cluster_spec["rayVersion"] = ray_version
    cluster_spec["headGroupSpec"] = _head_group(spec.get("head") or {}, image, labels, target)
    cluster_spec["workerGroupSpecs"] = _worker_groups(
        spec.get("worker_groups") or [], image, labels
    )

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
    job_spec["rayClusterSpec"] = cluster_spec

    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": job_spec,
    }


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
    if len(namespace) > 63 or not _DNS1123_LABEL.match(namespace):
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
        if len(group_name) > 63 or not _DNS1123_LABEL.match(group_name):
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
    problems = _label_problems(merged)
    if problems:
        raise LaunchError("invalid labels: " + "; ".join(problems))
    return merged


def _label_problems(labels: Mapping[str, Any]) -> list[str]:
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
    problems = _rayjob_name_problems(name)
    if problems:
        raise LaunchError("; ".join(problems))


def _rayjob_name_problems(name: Any) -> list[str]:
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


# ---------------------------------------------------------------------------------------------
# Validation against the CRD (tests and tooling; never needed at runtime)
# ---------------------------------------------------------------------------------------------


def validate_rayjob(manifest: Mapping[str, Any], crd_path: str | os.PathLike[str]) -> list[str]:
    """Check ``manifest`` the way the API server and KubeRay would; return the problems found
    (empty when it would be accepted as is).

    Checks, in order: the CRD's ``v1`` OpenAPI schema (via jsonschema; ``int-or-string`` fields
    are ``anyOf: [integer, string]`` plus a ``pattern`` that only constrains strings, which is
    what the API server does too; ``int32``/``int64`` formats are range-checked); fields the
    schema does not declare (the API server would silently prune them, losing them); and the
    object metadata rules the CRD schema leaves to the API server and KubeRay (name, namespace,
    labels). Raises OSError if ``crd_path`` cannot be read.
    """
    import jsonschema  # only tests and tooling validate, so the launcher never needs it

    schema = _crd_schema(str(Path(crd_path).resolve()))
    checker = jsonschema.FormatChecker()
    checker.checks("int32")(functools.partial(_fits, bits=32))
    checker.checks("int64")(functools.partial(_fits, bits=64))
    validator = jsonschema.Draft7Validator(schema, format_checker=checker)
    problems = [
        f"{_json_path(error.absolute_path)}: {error.message}"
        for error in sorted(
            validator.iter_errors(manifest), key=lambda e: [str(part) for part in e.absolute_path]
        )
    ]
    problems += _unknown_fields(manifest, schema, "")

    if manifest.get("apiVersion") != f"{GROUP}/{VERSION}":
        problems.append(f"apiVersion: expected {GROUP}/{VERSION}")
    if manifest.get("kind") != "RayJob":
        problems.append("kind: expected RayJob")
    metadata = manifest.get("metadata") or {}
    problems += [f"metadata.name: {p}" for p in _rayjob_name_problems(metadata.get("name"))]
    namespace = metadata.get("namespace")
    if not isinstance(namespace, str) or not _DNS1123_LABEL.match(namespace) or len(namespace) > 63:
        problems.append(f"metadata.namespace: {namespace!r} is not a valid namespace name")
    problems += [f"metadata.labels: {p}" for p in _label_problems(metadata.get("labels") or {})]
    return problems


@functools.lru_cache(maxsize=4)
def _crd_schema(crd_path: str) -> dict[str, Any]:
    # The CRD is ~25k lines: libyaml's loader takes well under a second where pure Python
    # takes many.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(crd_path, encoding="utf-8") as stream:
        crd = yaml.load(stream, Loader=loader)  # both candidates are safe loaders
    for version in crd["spec"]["versions"]:
        if version["name"] == VERSION:
            return version["schema"]["openAPIV3Schema"]
    raise ValueError(f"{crd_path} has no {VERSION} version")


def _fits(value: Any, *, bits: int) -> bool:
    if isinstance(value, bool) or not isinstance(value, int):
        return True  # formats only constrain integers; `type` catches the rest
    return -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)


def _unknown_fields(value: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    """Fields a structural schema would prune: object keys outside ``properties`` where neither
    ``additionalProperties`` nor ``x-kubernetes-preserve-unknown-fields`` allows them."""
    problems = []
    if isinstance(value, Mapping):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if properties is not None and key in properties:
                problems += _unknown_fields(item, properties[key], where)
            elif isinstance(additional, Mapping):
                problems += _unknown_fields(item, additional, where)
            elif properties is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                problems.append(f"{where}: unknown field (the API server would drop it)")
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            problems += _unknown_fields(item, schema["items"], f"{path}[{index}]")
    return problems


def _json_path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<root>"


# ---------------------------------------------------------------------------------------------
# Status mapping (pure)
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------------------------


class KubeRayLauncher:
    """Runs each attempt as a KubeRay RayJob. See the module docstring for the target config.

    Holds its own Kubernetes ``ApiClient`` (created on first use, never the process-wide default
    configuration), so launchers for different clusters can live in one process.
    """

    kind = "kuberay"

    def __init__(
        self, target_config: Mapping[str, Any], *, api_client: k8s.ApiClient | None = None
    ) -> None:
        """``target_config`` says how to reach the cluster; ``api_client`` overrides it."""
        self._target_config = dict(target_config)
        self._api_client = api_client
        self._timeout = float(self._target_config.get("request_timeout_seconds", 30))

    # -- Launcher protocol ----------------------------------------------------------------------

    def plan(self, request: LaunchRequest) -> dict[str, Any]:
        """The RayJob manifest launch() would create; touches no cluster."""
        return {"kind": self.kind, "manifest": render_rayjob(request)}

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        """Create the namespace (if needed) and the RayJob; return the handle.

        Idempotent: if a RayJob with this name already exists and carries the same
        ``spec.jobId`` it is adopted (KubeRay submits with that id, so Ray never runs the
        entrypoint twice); one with another job id raises LaunchError instead.
        """
        manifest = render_rayjob(request)
        namespace = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        self._ensure_namespace(namespace, request.labels)
        try:
            self._call(
                f"create RayJob {namespace}/{name}",
                self._custom().create_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                manifest,
            )
        except ApiException as exc:
            if exc.status != 409:
                raise _api_error(f"create RayJob {namespace}/{name}", exc) from exc
            self._adopt(namespace, name, request.submission_id)
        return {"namespace": namespace, "name": name, "submission_id": request.submission_id}

    def status(self, handle: dict[str, Any]) -> RayJobState:
        """The job's state from the RayJob's status (see :func:`rayjob_state`). A RayJob that no
        longer exists is FAILED; an unreachable or erroring API server raises LaunchError."""
        namespace, name = handle["namespace"], handle["name"]
        try:
            rayjob = self._get(namespace, name)
        except ApiException as exc:
            if exc.status == 404:
                return RayJobState(RAY_FAILED, f"RayJob {namespace}/{name} no longer exists")
            raise _api_error(f"get RayJob {namespace}/{name}", exc) from exc
        return rayjob_state(rayjob)

    def logs(self, handle: dict[str, Any], *, tail: int | None = None) -> str:
        """The driver log: in K8sJobMode the submitter pod follows the Ray job's logs, so its
        log is the driver's. Empty until the submitter pod has started. Uses the newest pod when
        the submitter Job retried."""
        namespace, name = handle["namespace"], handle["name"]
        core = k8s.CoreV1Api(self._client())
        try:
            pods = self._call(
                f"list submitter pods of {namespace}/{name}",
                core.list_namespaced_pod,
                namespace,
                label_selector=SUBMITTER_POD_SELECTOR.format(name=name),
            )
        except ApiException as exc:
            if exc.status == 404:
                return ""
            raise _api_error(f"list submitter pods of {namespace}/{name}", exc) from exc
        if not pods.items:
            return ""
        pod = max(pods.items, key=_pod_age_key)
        kwargs: dict[str, Any] = {"container": SUBMITTER_CONTAINER}
        if tail is not None:
            kwargs["tail_lines"] = tail
        try:
            # Raw bytes: with preloading, the client json-decodes the body and str()s the result,
            # which turns a log that happens to be JSON into a Python repr.
            response = self._call(
                f"read log of pod {namespace}/{pod.metadata.name}",
                core.read_namespaced_pod_log,
                pod.metadata.name,
                namespace,
                _preload_content=False,
                **kwargs,
            )
        except ApiException as exc:
            # 400: the container has not started yet; 404: the pod went away meanwhile.
            if exc.status in (400, 404):
                return ""
            raise _api_error(f"read log of pod {namespace}/{pod.metadata.name}", exc) from exc
        try:
            return response.data.decode("utf-8", errors="replace")
        finally:
            response.release_conn()

    def follow_logs(self, handle: dict[str, Any]) -> Iterator[str]:
        """The submitter pod's log, polled once a second (Kubernetes streams it too, but the
        pod of a retried submitter changes under a stream)."""
        sent = 0
        while True:
            text = self.logs(handle)
            if len(text) > sent:
                yield text[sent:]
                sent = len(text)
            if self.status(handle).status in RAY_TERMINAL:
                return
            time.sleep(1.0)

    def heal(self, handle: dict[str, Any], *, max_restarts: int) -> list[dict[str, Any]]:
        # KubeRay heals worker nodes itself: their pods restart in place (restartPolicy
        # Always, see _worker_groups) and the RayCluster controller recreates a deleted one.
        return []

    def stop(self, handle: dict[str, Any]) -> None:
        """Delete the RayJob with foreground propagation (KubeRay's finalizer stops the Ray job,
        then its RayCluster and submitter Job go). Already gone (404) is fine."""
        namespace, name = handle["namespace"], handle["name"]
        try:
            self._call(
                f"delete RayJob {namespace}/{name}",
                self._custom().delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                propagation_policy="Foreground",
                body=k8s.V1DeleteOptions(propagation_policy="Foreground"),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise _api_error(f"delete RayJob {namespace}/{name}", exc) from exc

    # -- helpers --------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the HTTP connection pool (safe to call more than once)."""
        if self._api_client is not None:
            self._api_client.close()
            self._api_client = None

    def _client(self) -> k8s.ApiClient:
        if self._api_client is None:
            self._api_client = build_api_client(self._target_config)
        return self._api_client

    def _custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self._client())

    def _get(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(
            f"get RayJob {namespace}/{name}",
            self._custom().get_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
        )

    def _ensure_namespace(self, namespace: str, labels: Mapping[str, str]) -> None:
        body = k8s.V1Namespace(
            metadata=k8s.V1ObjectMeta(
                name=namespace,
                labels={
                    **MANAGED_BY,
                    **{k: v for k, v in labels.items() if k in (LABEL_ORG, LABEL_WORKSPACE)},
                },
            )
        )
        try:
            self._call(
                f"create namespace {namespace}",
                k8s.CoreV1Api(self._client()).create_namespace,
                body,
            )
        except ApiException as exc:
            # 409: it exists. 403: this service account may not create namespaces, which is how
            # clusters with pre-provisioned namespaces are set up; if it is actually missing, the
            # RayJob create fails next with a NotFound that names it.
            if exc.status not in (403, 409):
                raise _api_error(f"create namespace {namespace}", exc) from exc

    def _adopt(self, namespace: str, name: str, submission_id: str) -> None:
        try:
            existing = self._get(namespace, name)
        except ApiException as exc:
            raise _api_error(f"get existing RayJob {namespace}/{name}", exc) from exc
        job_id = (existing.get("spec") or {}).get("jobId")
        if job_id != submission_id:
            raise LaunchError(
                f"RayJob {namespace}/{name} already exists for submission {job_id!r}, "
                f"not {submission_id!r}"
            )
        if (existing.get("metadata") or {}).get("deletionTimestamp"):
            raise LaunchError(f"RayJob {namespace}/{name} exists but is being deleted")

    def _call(self, what: str, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call the API; connection-level failures become LaunchError, HTTP errors stay
        ApiException for the caller to interpret."""
        try:
            return method(*args, _request_timeout=self._timeout, **kwargs)
        except ApiException as exc:
            if exc.status == 0:  # the client's wrapping of TLS errors
                raise LaunchError(f"{what}: Kubernetes API unreachable: {exc.reason}") from exc
            raise
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise LaunchError(f"{what}: Kubernetes API unreachable: {exc}") from exc


def build_api_client(target_config: Mapping[str, Any]) -> k8s.ApiClient:
    """A new ApiClient for ``target_config`` (``in_cluster`` or ``kubeconfig`` as a path, YAML
    text or mapping, with an optional ``context``). Never touches the global default
    configuration nor writes the kubeconfig back. Raises LaunchError when the config is
    missing or unusable."""
    configuration = k8s.Configuration()
    context = target_config.get("context")
    try:
        if target_config.get("in_cluster"):
            if not target_config.get("in_cluster_allowed"):
                raise LaunchError(
                    "in_cluster would use the platform's own service account; this deployment "
                    "does not allow it (MANTA_KUBERAY_IN_CLUSTER)"
                )
            k8s_config.load_incluster_config(client_configuration=configuration)
        elif target_config.get("kubeconfig"):
            # A tenant's kubeconfig: checked at save, and again here, before anything in it
            # can run a command or read a file in this process.
            try:
                kubeconfig = dict(tenant_kubeconfig.load(target_config["kubeconfig"]))
            except ValueError as exc:
                raise LaunchError(f"kubeconfig {exc}") from exc
            refused = tenant_kubeconfig.problems(kubeconfig)
            if refused:
                raise LaunchError("kubeconfig refused: " + "; ".join(refused))
            k8s_config.load_kube_config_from_dict(
                kubeconfig,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            raise LaunchError("the kuberay target needs `kubeconfig` or `in_cluster: true`")
    except (ConfigException, yaml.YAMLError, OSError, KeyError, TypeError, ValueError) as exc:
        raise LaunchError(f"cannot load the Kubernetes config: {exc}") from exc
    return k8s.ApiClient(configuration=configuration)


def _pod_age_key(pod: k8s.V1Pod) -> tuple[datetime.datetime, str]:
    """Sorts pods oldest first (name breaks ties, and pods without a timestamp come first)."""
    created = pod.metadata.creation_timestamp or _EPOCH
    return created, pod.metadata.name or ""


def _api_error(what: str, exc: ApiException) -> LaunchError:
    """A LaunchError naming the operation and the API server's own message."""
    detail = exc.reason or ""
    try:
        body = json.loads(exc.body or "")
        if isinstance(body, dict) and body.get("message"):
            detail = body["message"]
    except (TypeError, ValueError):
        pass
    return LaunchError(f"{what} failed: HTTP {exc.status}: {detail}")
