"""What an attempt launches, and where: the workspace's compute target resolved (secrets
decrypted, the operator's policy attached), the launch request a launcher starts, and the plan
shown to a user before anything starts."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.conf import settings

from packages.models import URI_PREFIX as PACKAGE_URI_PREFIX
from packages.services import download_url as package_download_url
from packages.services import local_path as package_path
from packages.services import sha_of as package_sha
from workspaces.compute_targets import compute_target_secrets
from workspaces.models import ComputeTarget, ComputeTargetKind

from .launchers import launcher_for
from .launchers.base import (
    LaunchError,
    LaunchRequest,
)
from .models import Job, JobAttempt


@dataclasses.dataclass(frozen=True)
class ResolvedTarget:
    name: str
    kind: str
    config: dict[str, Any]


def resolve_target(job: Job) -> ResolvedTarget:
    """The workspace's compute target with its secret decrypted; ``local`` is built in."""
    name = job.workspace.compute_target
    target = resolve_named(job.organization_id, name)
    if target is None:
        raise LaunchError(f"compute target {name!r} does not exist in this organisation")
    return target


def resolve_named(organization_id: int, name: str) -> ResolvedTarget | None:
    """The organisation's compute target ``name`` with its secret decrypted (None when it has
    none of that name); ``local`` is built in."""
    target = ComputeTarget.objects.filter(organization_id=organization_id, name=name).first()
    if target is None:
        if name != ComputeTargetKind.LOCAL:
            return None
        return ResolvedTarget(name="local", kind="local", config=local_defaults({}))
    config = {**target.config, **compute_target_secrets(target)}
    if target.kind == ComputeTargetKind.LOCAL:
        config = local_defaults(config)
    # The operator's policy travels with the config: launchers check it at every connection.
    elif target.kind == ComputeTargetKind.RAY:
        config["allowed_networks"] = list(settings.MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS)
    elif target.kind == ComputeTargetKind.KUBERAY:
        config["in_cluster_allowed"] = settings.MANTA_KUBERAY_IN_CLUSTER
    return ResolvedTarget(name=target.name, kind=target.kind, config=config)


def local_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """A local target's config with the operator's settings; isolation is the operator's
    alone, whatever a tenant's target config holds."""
    from .local_host import sandbox_settings

    # The one isolation setting an org admin has: the networks its jobs may reach beyond the
    # public internet, checked against the operator's bounds when the target was saved.
    sandbox = {**sandbox_settings().to_config(), "egress_allow": config.get("egress_allow", [])}
    return {"work_dir": settings.MANTA_LOCAL_RAY_DIR, **config, "sandbox": sandbox}


def cluster_name_for(job: Job, number: int) -> str:
    # DNS-safe and at most 47 characters (KubeRay's limit for a RayJob name).
    base = f"manta-{job.organization.slug}-{job.workspace.slug}"[:32].rstrip("-")
    return f"{base}-{job.pk}-{number}"


def launch_request(
    attempt: JobAttempt, target: ResolvedTarget, *, sign: bool = True
) -> LaunchRequest:
    """What the launcher starts. A cluster that downloads its code itself (kuberay) gets a
    short-lived signed link to the package (``sign=False`` for a plan: no working link shown)."""
    job = attempt.job
    # The job may want to know which run it is (e.g. to resume from a checkpoint on a retry).
    runtime_env = dict(job.spec.get("runtime_env") or {})
    runtime_env["env_vars"] = {
        **(runtime_env.get("env_vars") or {}),
        "MANTA_JOB_ID": str(job.pk),
        "MANTA_ATTEMPT": str(attempt.number),
    }
    grace = job.organization.preemption_grace_seconds
    if grace:
        # Ray's stop_job sends the driver SIGTERM, then SIGKILL after this many seconds (read
        # by the job's supervisor actor, which runs with the job's runtime_env): a preempted
        # driver gets the organisation's grace period to write a checkpoint.
        runtime_env["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"] = str(grace)
    if attempt.code_package:  # fetched from the job's code source
        runtime_env["working_dir"] = f"{PACKAGE_URI_PREFIX}{attempt.code_package}"
    packages = {}
    sha256 = package_sha(runtime_env.get("working_dir"))
    if sha256 and target.kind == ComputeTargetKind.KUBERAY:
        if sign:
            runtime_env["working_dir"] = package_download_url(sha256)
    elif sha256:
        packages[runtime_env["working_dir"]] = package_path(sha256)
    return LaunchRequest(
        submission_id=attempt.submission_id,
        cluster_name=attempt.cluster_name,
        packages=packages,
        spec={**job.spec, "runtime_env": runtime_env},
        labels={
            "manta.dev/org": job.organization.slug,
            "manta.dev/workspace": job.workspace.slug,
            "manta.dev/job": str(job.pk),
            "manta.dev/attempt": str(attempt.number),
        },
        target_config=target.config,
        gpu_flavor=attempt.gpu_flavor,
    )


def _likely_flavor(job: Job, target: ResolvedTarget) -> str:
    """For a job not admitted yet, the GPU flavor its plan shows: the first it accepts, else
    the first its target declares (admission may choose another, as it fits)."""
    if not job.requested_gpu:
        return ""
    declared = sorted((target.config or {}).get("gpu_flavors") or {})
    return (job.gpu_flavors or declared or ("",))[0]


def plan_for(job: Job) -> dict[str, Any]:
    """What the job's compute target launches (for the latest attempt, or the next one)."""
    attempt = job.attempts.order_by("-number").first()
    target = resolve_target(job)
    if attempt is None:
        attempt = JobAttempt(
            job=job,
            number=1,
            cluster_name=cluster_name_for(job, 1),
            gpu_flavor=_likely_flavor(job, target),
        )
    request = launch_request(attempt, target, sign=False)
    plan = launcher_for(target.kind, target.config).plan(request)
    footprint = (plan.get("isolation") or {}).get("footprint")
    if footprint is not None:
        # Beside what the sandbox allows, what admission reserves for the job: the same.
        footprint["reserved"] = {name: job.requested[name] for name in footprint["total"]}
    return plan
