"""The job spec: its shape, its rules, and the resources it requests.

A spec is what a template version holds and what a job resolves to (template + overrides)::

    {"image", "entrypoint", "runtime_env": {"pip", "env_vars", "working_dir"},
     "head": {"cpu", "memory_gb", "gpu", "disk_gb"},
     "worker_groups": [{"name", "replicas", "min_replicas", "max_replicas",
                        "cpu", "memory_gb", "gpu", "disk_gb", "resources"}],
     "max_runtime_seconds", "min_runtime_seconds", "max_retries", "priority",
     "ttl_seconds_after_finished",
     "code": {"source", "ref"},
     "gpu_flavor": ["h100", "a100"]}

``gpu_flavor`` (one GPU flavor or a list, in order of preference; stored as a list, absent when
not given) says which types of GPU the job's GPUs may be: see ``quotas/flavors.py``.

Validation is a DRF serializer so every error names its field (``worker_groups.1.name``). The
image policy needs the organisation: pass it as ``context={"organization": org}``. A node's
``disk_gb`` (its writable storage) is filled in with ``MANTA_DEFAULT_NODE_DISK_GB`` when absent,
so a job keeps the size it was admitted with.
"""

from __future__ import annotations

import functools
import json
import re
import types
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from packaging.requirements import InvalidRequirement, Requirement
from rest_framework import serializers

from config.gpu_flavors import flavor_problem
from config.strict import StrictSerializer
from packages.models import GIT_REF, GIT_REF_RULE, MAX_REF

MAX_CPU = 512
MAX_MEMORY_GB = 4096
MAX_GPU = 64
# A node's writable storage, GB. Below the minimum Ray cannot keep its session and logs; the
# default (MANTA_DEFAULT_NODE_DISK_GB) is checked against both bounds at start.
MIN_DISK_GB = 0.1
MAX_DISK_GB = 16384
MAX_REPLICAS = 1000
MAX_WORKER_GROUPS = 16
MAX_ENTRYPOINT = 4096
MAX_RUNTIME_SECONDS = 7 * 24 * 3600
MIN_RAY_VERSION = (2, 6)
MAX_GPU_FLAVORS = 8

SPEC_FIELDS = (
    "image",
    "entrypoint",
    "runtime_env",
    "head",
    "worker_groups",
    "max_runtime_seconds",
    "min_runtime_seconds",
    "max_retries",
    "priority",
    "ttl_seconds_after_finished",
    "code",
    "gpu_flavor",
)
OVERRIDABLE = frozenset(SPEC_FIELDS)

DEFAULTS: dict[str, Any] = {
    "runtime_env": {},
    "head": {"cpu": 0, "memory_gb": 2, "gpu": 0},
    "worker_groups": [],
    "max_runtime_seconds": 3600,
    "max_retries": 0,
    "priority": 5,
    "ttl_seconds_after_finished": 300,
}

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,30}[a-z0-9])?$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESOURCE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")
RESERVED_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
RAY_TAG_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:[-.].*)?$")
# Code reaches a job from a place Ray fetches itself, never from the worker's filesystem: Ray's
# client zips a local working_dir where it runs, which would ship the worker's files.
WORKING_DIR = re.compile(r"^(https|s3|gs)://[^\s/]+/\S*$")
PACKAGE_URI = re.compile(r"^manta://packages/[0-9a-f]{64}$")  # see packages/
# Variables that change how the runtime itself behaves (which binaries and libraries load,
# where Python and pip look, Ray's own settings, the devices a node was given).
RUNTIME_ENV_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "SHELL",
        "TMPDIR",
        "VIRTUAL_ENV",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "NEURON_RT_VISIBLE_CORES",
        "TPU_VISIBLE_CHIPS",
    }
)
RUNTIME_ENV_PREFIXES = ("LD_", "DYLD_", "PYTHON", "RAY_", "PIP_", "CONDA_", "UV_", "MANTA_")
PIP_URL_SCHEMES = frozenset({"https", "git+https"})


def _resource_number(max_value: float, *, integer: bool = False):
    if integer:
        return serializers.IntegerField(min_value=0, max_value=int(max_value), default=0)
    return serializers.FloatField(min_value=0, max_value=max_value, default=0)


class NodeSpec(StrictSerializer):
    cpu = _resource_number(MAX_CPU)
    memory_gb = _resource_number(MAX_MEMORY_GB)
    gpu = _resource_number(MAX_GPU, integer=True)
    disk_gb = serializers.FloatField(
        min_value=MIN_DISK_GB,
        max_value=MAX_DISK_GB,
        required=False,
        help_text="Writable storage of the node, GB (default: the deployment's, 10 unless set)",
    )


class HeadSpec(NodeSpec):
    pass


class WorkerGroupSpec(NodeSpec):
    name = serializers.CharField(max_length=32, help_text="DNS-safe, unique within the job")
    replicas = serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS)
    min_replicas = serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS, required=False)
    max_replicas = serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS, required=False)
    resources = serializers.DictField(
        child=serializers.FloatField(min_value=0, max_value=1_000_000), required=False, default=dict
    )

    def validate_name(self, value: str) -> str:
        if not DNS_LABEL.match(value):
            raise serializers.ValidationError(
                "must be DNS-safe: lowercase letters, digits and '-', starting with a letter"
            )
        return value

    def validate_resources(self, value: dict[str, float]) -> dict[str, float]:
        for name in value:
            if name in RESERVED_RESOURCES:
                raise serializers.ValidationError(f"{name!r} is set by cpu/gpu/memory_gb instead")
            if not RESOURCE_NAME.match(name):
                raise serializers.ValidationError(f"{name!r} is not a valid resource name")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs.setdefault("min_replicas", attrs["replicas"])
        attrs.setdefault("max_replicas", max(attrs["replicas"], attrs["min_replicas"]))
        if not attrs["min_replicas"] <= attrs["replicas"] <= attrs["max_replicas"]:
            raise serializers.ValidationError(
                {"replicas": ["must be within min_replicas..max_replicas"]}
            )
        return attrs


class RuntimeEnvSpec(StrictSerializer):
    pip = serializers.ListField(
        child=serializers.CharField(max_length=200), required=False, max_length=100
    )
    env_vars = serializers.DictField(
        child=serializers.CharField(max_length=4096, allow_blank=True), required=False
    )
    working_dir = serializers.CharField(max_length=1000, required=False)

    def validate_pip(self, value: list[str]) -> list[str]:
        for entry in value:
            text = entry.strip()
            if text.startswith("-"):
                raise serializers.ValidationError(
                    f"{entry!r}: pip options are not allowed (only requirement specifiers)"
                )
            if text.startswith(("/", ".", "~", "file:")) or "\\" in text:
                raise serializers.ValidationError(
                    f"{entry!r}: paths are not allowed (only requirement specifiers)"
                )
            try:
                requirement = Requirement(text)
            except InvalidRequirement as exc:
                raise serializers.ValidationError(
                    f"{entry!r} is not a requirement specifier (e.g. 'requests==2.32.3'): {exc}"
                ) from exc
            scheme = (requirement.url or "").partition("://")[0].lower()
            if requirement.url and scheme not in PIP_URL_SCHEMES:
                raise serializers.ValidationError(
                    f"{entry!r}: a direct reference must be an https:// or git+https:// URL"
                )
        return value

    def validate_env_vars(self, value: dict[str, str]) -> dict[str, str]:
        bad = [name for name in value if not ENV_NAME.match(name)]
        if bad:
            raise serializers.ValidationError(
                f"invalid environment variable name(s): {', '.join(bad)}"
            )
        runtime = sorted(
            name
            for name in value
            if name.upper() in RUNTIME_ENV_NAMES or name.upper().startswith(RUNTIME_ENV_PREFIXES)
        )
        if runtime:
            raise serializers.ValidationError(
                f"{', '.join(runtime)}: may not be set; PATH, HOME, LD_*, PYTHON*, RAY_*, PIP_*, "
                "MANTA_* and device visibility variables change the runtime itself"
            )
        return value

    def validate_working_dir(self, value: str) -> str:
        if not (WORKING_DIR.match(value) or PACKAGE_URI.match(value)):
            raise serializers.ValidationError(
                "must be a package uploaded to this workspace (manta://packages/<sha256>) or a "
                "remote URI (https://, s3:// or gs://) of a zip Ray downloads itself; paths on "
                "the worker's host are refused"
            )
        return value


def ray_version_of(image: str) -> tuple[int, int] | None:
    """The Ray version an image tag names (``rayproject/ray:2.9.3-py310`` → (2, 9)), if any."""
    tag = image.rsplit("/", 1)[-1].partition(":")[2].partition("@")[0]
    match = RAY_TAG_VERSION.match(tag)
    return (int(match.group(1)), int(match.group(2))) if match else None


class CodeSpec(StrictSerializer):
    """Code from a git code source of the workspace (instead of runtime_env.working_dir)."""

    source = serializers.SlugField(max_length=63, help_text="The code source's name")
    ref = serializers.CharField(
        max_length=MAX_REF,
        required=False,
        help_text="A branch, tag or commit sha (default: the source's default_ref)",
    )

    def validate_ref(self, value: str) -> str:
        if not GIT_REF.match(value):
            raise serializers.ValidationError(GIT_REF_RULE)
        return value


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "example": "h100"},
            {"type": "array", "items": {"type": "string"}, "maxItems": MAX_GPU_FLAVORS},
        ]
    }
)
class GpuFlavorField(serializers.Field):
    """One GPU flavor (``"h100"``) or a list of acceptable ones in order of preference
    (``["h100", "a100"]``), held as a list."""

    default_error_messages = {
        "shape": 'must be a GPU flavor or a list of them, e.g. "h100" or ["h100", "a100"]'
    }

    def to_internal_value(self, data: Any) -> list[str]:
        names = [data] if isinstance(data, str) else data
        if not isinstance(names, list) or not names:
            self.fail("shape")
        if len(names) > MAX_GPU_FLAVORS:
            raise serializers.ValidationError(f"at most {MAX_GPU_FLAVORS} flavors")
        for name in names:
            if problem := flavor_problem(name):
                raise serializers.ValidationError(problem)
        if len(set(names)) != len(names):
            raise serializers.ValidationError("each flavor at most once")
        return list(names)

    def to_representation(self, value: Any) -> Any:
        return value


class JobSpec(StrictSerializer):
    image = serializers.CharField(max_length=300)
    entrypoint = serializers.CharField(max_length=MAX_ENTRYPOINT, trim_whitespace=False)
    runtime_env = RuntimeEnvSpec(required=False)
    head = HeadSpec(required=False)
    worker_groups = WorkerGroupSpec(many=True, required=False, max_length=MAX_WORKER_GROUPS)
    max_runtime_seconds = serializers.IntegerField(
        min_value=1, max_value=MAX_RUNTIME_SECONDS, required=False
    )
    min_runtime_seconds = serializers.IntegerField(
        min_value=0,
        max_value=MAX_RUNTIME_SECONDS,
        required=False,
        help_text="Once running, the job is not preempted before it has run this long (at most "
        "the organisation's max_min_runtime_seconds; default 0)",
    )
    max_retries = serializers.IntegerField(min_value=0, max_value=10, required=False)
    priority = serializers.IntegerField(
        min_value=1, max_value=9, required=False, help_text="1-9, 9 highest"
    )
    ttl_seconds_after_finished = serializers.IntegerField(
        min_value=0, max_value=MAX_RUNTIME_SECONDS, required=False
    )
    code = CodeSpec(required=False)
    gpu_flavor = GpuFlavorField(
        required=False,
        help_text="The GPU flavor(s) the job's GPUs may be, in order of preference, e.g. "
        '"h100" or ["h100", "a100"]; absent: any flavor its compute target offers',
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("gpu_flavor") and not _asks_for_gpus(attrs):
            raise serializers.ValidationError(
                {"gpu_flavor": ["the job asks for no GPUs: give its head or workers a gpu count"]}
            )
        if attrs.get("code") and (attrs.get("runtime_env") or {}).get("working_dir"):
            raise serializers.ValidationError(
                {
                    "code": [
                        "a job takes its code from a code source or from "
                        "runtime_env.working_dir, not both"
                    ]
                }
            )
        return attrs

    def validate_entrypoint(self, value: str) -> str:
        if "\n" in value or "\r" in value:
            raise serializers.ValidationError(
                "must be a single line; join several commands with '&&'"
            )
        if not value.strip():
            raise serializers.ValidationError("must not be blank")
        return value.strip()

    def validate_image(self, value: str) -> str:
        value = value.strip()
        if not value or any(c.isspace() for c in value):
            raise serializers.ValidationError("must be an image reference without spaces")
        org = self.context.get("organization")
        prefixes = list(org.allowed_image_prefixes) if org is not None else []
        if org is not None and not any(value.startswith(p) for p in prefixes):
            allowed = ", ".join(prefixes) or "none (the organisation allows no images)"
            raise serializers.ValidationError(
                f"not allowed by the organisation's image policy; allowed prefixes: {allowed}"
            )
        version = ray_version_of(value)
        if version is not None and version < MIN_RAY_VERSION:
            raise serializers.ValidationError(
                f"Ray {version[0]}.{version[1]} is too old; Manta needs Ray >= 2.6"
            )
        return value

    def validate_min_runtime_seconds(self, value: int) -> int:
        org = self.context.get("organization")
        cap = getattr(org, "max_min_runtime_seconds", None)
        if cap is not None and value > cap:
            raise serializers.ValidationError(
                f"must be at most {cap}, the organisation's max_min_runtime_seconds"
            )
        return value

    def validate_worker_groups(self, value: list[dict]) -> list[dict]:
        names = [group["name"] for group in value]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise serializers.ValidationError(
                f"worker group names must be unique: {', '.join(duplicates)}"
            )
        org = self.context.get("organization")
        limit = getattr(org, "max_nodes_per_job", None)
        nodes = 1 + sum(max(g["replicas"], g.get("max_replicas") or 0) for g in value)
        if limit is not None and nodes > limit:
            raise serializers.ValidationError(
                f"this job asks for {nodes} Ray nodes (the head and every worker replica, "
                f"max_replicas included); the organisation allows {limit} per job "
                "(max_nodes_per_job)"
            )
        return value

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict):
            heads = data.get("head")
            if isinstance(heads, list):
                raise serializers.ValidationError(
                    {"head": ["exactly one head: an object, not a list"]}
                )
        value = super().to_internal_value(data)
        for key, default in DEFAULTS.items():
            value.setdefault(key, default)
        value["head"] = _with_disk(value["head"])
        value["worker_groups"] = [_with_disk(group) for group in value["worker_groups"]]
        value["runtime_env"] = {k: v for k, v in value["runtime_env"].items() if v not in ({}, [])}
        return value


def _asks_for_gpus(attrs: dict[str, Any]) -> bool:
    nodes = [attrs.get("head") or {}, *(attrs.get("worker_groups") or [])]
    return any(node.get("gpu") for node in nodes)


def _with_disk(node: dict[str, Any]) -> dict[str, Any]:
    return {**node, "disk_gb": node_disk_gb(node)}


def node_disk_gb(node: dict[str, Any]) -> float:
    """A node's writable storage: its spec's, or the default (specs stored before disk_gb was a
    field name none)."""
    return float(node.get("disk_gb") or settings.MANTA_DEFAULT_NODE_DISK_GB)


def validate_spec(data: Any, *, organization: Any) -> dict[str, Any]:
    """A complete, normalised spec, or a ValidationError naming each bad field.

    A spec validated before, with the same organisation policy and settings, is not validated
    again: every job of a template is, with the same spec (the serialisers cost about a
    millisecond of CPU a submission). The answer is a fresh copy each time; what fails
    validation is never kept, nor a spec longer than :data:`MEMO_MAX_CHARS` as JSON (the 256
    kept stay within a few MB per process, whatever tenants submit)."""
    policy = _policy(organization)
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError):  # not JSON: the serialisers say what is wrong with it
        return _validate(data, policy)
    if len(text) > MEMO_MAX_CHARS:
        return _validate(json.loads(text), policy)
    return json.loads(_validated(text, policy))


MEMO_MAX_CHARS = 8192


# What validation reads of the organisation (None: no organisation) and of the settings.
_Policy = tuple[tuple[str, ...], int | None, int | None, float] | None


def _policy(organization: Any) -> _Policy:
    if organization is None:
        return None
    return (
        tuple(organization.allowed_image_prefixes),
        getattr(organization, "max_min_runtime_seconds", None),
        getattr(organization, "max_nodes_per_job", None),
        settings.MANTA_DEFAULT_NODE_DISK_GB,
    )


@functools.lru_cache(maxsize=256)
def _validated(text: str, policy: _Policy) -> str:
    return json.dumps(_validate(json.loads(text), policy))


def _validate(data: Any, policy: _Policy) -> dict[str, Any]:
    organization = None
    if policy is not None:
        prefixes, min_runtime_cap, max_nodes, _ = policy
        organization = types.SimpleNamespace(
            allowed_image_prefixes=list(prefixes),
            max_min_runtime_seconds=min_runtime_cap,
            max_nodes_per_job=max_nodes,
        )
    serializer = JobSpec(data=data, context={"organization": organization})
    serializer.is_valid(raise_exception=True)
    return _plain(serializer.validated_data)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def requested_resources(spec: dict[str, Any]) -> dict[str, float]:
    """What the job asks for: the head plus replicas × node spec of every worker group (where
    its sandboxes enforce more, admission counts that instead: jobs.services.requested_for)."""
    total = dict.fromkeys(("cpu", "memory_gb", "gpu", "disk_gb"), 0.0)
    for replicas, node in [(1, spec["head"]), *((g["replicas"], g) for g in spec["worker_groups"])]:
        for key in ("cpu", "memory_gb", "gpu"):
            total[key] += replicas * float(node.get(key, 0))
        total["disk_gb"] += replicas * node_disk_gb(node)
    return {key: round(value, 3) for key, value in total.items()}
