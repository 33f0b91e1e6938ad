"""Every write to templates and jobs."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.utils import timezone
from rest_framework import serializers

from audit import services as audit
from audit.context import Actor
from config.db import insert_rows, one_statement
from config.errors import Conflict, Forbidden, InvalidInput, invalid_from_serializer
from outbox.services import event_emit
from packages.services import download_urls_available as package_download_available
from packages.services import package_require
from packages.services import sha_of as package_sha
from packages.sources import source_require
from workspaces.archive import require_active
from workspaces.models import ApprovalPolicy, ComputeTargetKind, Workspace

from . import selectors
from . import spec as job_spec
from .admission import admit_inline
from .local_host import capacity as host_capacity
from .local_host import compute_target_of, local_target_config, sandbox_footprint
from .models import Job, JobState, JobTemplate, JobTemplateVersion
from .selectors import LATEST_JOIN
from .state import record_event, run_state_hooks, transition
from .submission import check_submission


class SelfApprovalForbidden(Forbidden):
    type = "self_approval_forbidden"


def _validate_overrides_list(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput.on("allowed_overrides", "must be a list of field names")
    unknown = sorted(set(value) - job_spec.OVERRIDABLE)
    if unknown:
        raise InvalidInput.on(
            "allowed_overrides",
            f"unknown field(s) {', '.join(unknown)}; overridable: "
            f"{', '.join(sorted(job_spec.OVERRIDABLE))}",
        )
    return sorted(set(value))


# --- templates ---------------------------------------------------------------------------------


def _template_snapshot(version: JobTemplateVersion) -> dict[str, Any]:
    return {
        "version": version.version,
        "spec": version.spec,
        "allowed_overrides": version.allowed_overrides,
    }


@transaction.atomic
def template_create(
    *,
    actor: Actor,
    workspace: Workspace,
    name: str,
    spec: dict[str, Any],
    allowed_overrides: list[str] | None = None,
    description: str = "",
) -> JobTemplateVersion:
    try:
        clean = job_spec.validate_spec(spec, organization=workspace.organization)
    except serializers.ValidationError as exc:
        raise invalid_from_serializer(exc) from exc
    overrides = _validate_overrides_list(allowed_overrides or [])
    require_active(workspace)
    if JobTemplate.objects.filter(workspace=workspace, name=name).exists():
        raise Conflict(f"a template named {name!r} exists", errors={"name": ["already taken"]})
    template = JobTemplate.objects.create(
        organization=workspace.organization,
        workspace=workspace,
        name=name,
        description=description,
        latest_version=1,
        created_by=actor.user,
    )
    version = JobTemplateVersion.objects.create(
        template=template,
        version=1,
        spec=clean,
        allowed_overrides=overrides,
        created_by=actor.user,
    )
    audit.record(
        actor=actor,
        action="template.create",
        target=template,
        workspace=workspace,
        changes={"version": [None, 1]},
        metadata=_template_snapshot(version),
    )
    event_emit(
        type="template.version_created",
        organization=workspace.organization,
        workspace=workspace,
        payload={"template": {"id": template.pk, "name": name, "version": 1}},
    )
    return version


@transaction.atomic
def template_update(
    *,
    actor: Actor,
    template: JobTemplate,
    spec_changes: dict[str, Any],
    allowed_overrides: list[str] | None = None,
    description: str | None = None,
) -> JobTemplateVersion:
    """Append a version: the latest spec with ``spec_changes`` applied (top-level fields)."""
    template = (
        JobTemplate.objects.select_for_update()
        .select_related("workspace__organization")
        .get(pk=template.pk)
    )
    require_active(template.workspace)
    if template.archived_at is not None:
        raise Conflict("the template is archived")
    latest = template.versions.get(version=template.latest_version)
    merged = {**latest.spec, **spec_changes}
    try:
        clean = job_spec.validate_spec(merged, organization=template.workspace.organization)
    except serializers.ValidationError as exc:
        raise invalid_from_serializer(exc) from exc
    overrides = (
        _validate_overrides_list(allowed_overrides)
        if allowed_overrides is not None
        else latest.allowed_overrides
    )
    if description is not None:
        template.description = description
    if clean == latest.spec and overrides == latest.allowed_overrides:
        template.save(update_fields=["description", "updated_at"])
        return latest  # nothing to version
    template.latest_version += 1
    template.save(update_fields=["latest_version", "description", "updated_at"])
    version = JobTemplateVersion.objects.create(
        template=template,
        version=template.latest_version,
        spec=clean,
        allowed_overrides=overrides,
        created_by=actor.user,
    )
    changes = {
        k: [latest.spec.get(k), clean.get(k)] for k in clean if latest.spec.get(k) != clean[k]
    }
    if overrides != latest.allowed_overrides:
        changes["allowed_overrides"] = [latest.allowed_overrides, overrides]
    changes["version"] = [latest.version, version.version]
    audit.record(
        actor=actor,
        action="template.update",
        target=template,
        workspace=template.workspace,
        changes=changes,
    )
    event_emit(
        type="template.version_created",
        organization=template.organization,
        workspace=template.workspace,
        payload={
            "template": {"id": template.pk, "name": template.name, "version": version.version}
        },
    )
    return version


@transaction.atomic
def template_archive(*, actor: Actor, template: JobTemplate) -> JobTemplate:
    template = (
        JobTemplate.objects.select_for_update().select_related("workspace").get(pk=template.pk)
    )
    require_active(template.workspace)
    if template.archived_at is None:
        template.archived_at = timezone.now()
        template.save(update_fields=["archived_at", "updated_at"])
        audit.record(
            actor=actor,
            action="template.archive",
            target=template,
            workspace=template.workspace,
            changes={"archived_at": [None, template.archived_at]},
        )
    return template


# --- jobs --------------------------------------------------------------------------------------


def latest_version(template: JobTemplate) -> JobTemplateVersion:
    """The template's latest version: the one read with it (``selectors.templates_with_latest``)
    when it was, else read now."""
    version = getattr(template, LATEST_JOIN, None)
    if version is None or version.version != template.latest_version:
        version = template.versions.get(version=template.latest_version)
    version.template = template
    return version


def resolve_spec(version: JobTemplateVersion, overrides: dict[str, Any], organization) -> dict:
    """The template version's spec with the submitter's overrides, validated as a whole."""
    if not isinstance(overrides, dict):
        raise InvalidInput.on("overrides", "must be an object of spec fields")
    refused = sorted(set(overrides) - set(version.allowed_overrides))
    if refused:
        allowed = ", ".join(version.allowed_overrides) or "nothing"
        raise InvalidInput(
            f"overrides.{refused[0]}: this template does not allow overriding it "
            f"(allowed: {allowed})",
            errors={
                f"overrides.{name}": [f"not overridable (allowed: {allowed})"] for name in refused
            },
        )
    try:
        return job_spec.validate_spec({**version.spec, **overrides}, organization=organization)
    except serializers.ValidationError as exc:
        raise invalid_from_serializer(exc, prefix="overrides") from exc


def adhoc_spec(workspace: Workspace, spec: Any) -> dict:
    """An ad-hoc job's spec, validated as a template's would be (image policy, limits)."""
    if not workspace.adhoc_jobs:
        raise InvalidInput.on(
            "spec", "this workspace runs jobs from templates only (its adhoc_jobs is off)"
        )
    try:
        return job_spec.validate_spec(spec, organization=workspace.organization)
    except serializers.ValidationError as exc:
        raise invalid_from_serializer(exc, prefix="spec") from exc


def check_code(workspace: Workspace, spec: dict) -> None:
    """The code a spec runs must be this workspace's (an uploaded package or a code source), on
    a target that can receive it. A code source's ref defaults to the source's, fixed now."""
    code = spec.get("code")
    if code:
        source = source_require(workspace, code.get("source"), field="code.source")
        code["ref"] = code.get("ref") or source.default_ref
    working_dir = (spec.get("runtime_env") or {}).get("working_dir") or ""
    if not (code or package_sha(working_dir)):
        return
    field = "code" if code else "runtime_env.working_dir"
    target = compute_target_of(workspace)
    if (
        target is not None
        and target.kind == ComputeTargetKind.KUBERAY
        and not package_download_available()
    ):
        raise InvalidInput.on(
            field,
            "a kuberay cluster downloads its code itself, and this deployment cannot hand it a "
            "link (MANTA_PUBLIC_URL is unset and packages are not in object storage): use a "
            "remote URI",
        )
    if not code:
        package_require(workspace, working_dir, field=field)


def approval_needed(workspace: Workspace, spec: dict, requested: dict[str, float]) -> str:
    """Why this job needs approval under the workspace's policy ('' when it does not)."""
    if workspace.approval_policy == ApprovalPolicy.ALWAYS:
        return "the workspace requires approval for every job"
    if workspace.approval_policy == ApprovalPolicy.THRESHOLD:
        values = {**requested, "max_runtime_seconds": spec["max_runtime_seconds"]}
        for key, limit in sorted(workspace.approval_thresholds.items()):
            if values.get(key, 0) > limit:
                return f"{key} {values[key]:g} is above the approval threshold {limit:g}"
    return ""


def requested_for(workspace: Workspace, spec: dict) -> tuple[dict[str, float], bool]:
    """What admission reserves for a job of ``spec`` in ``workspace``, and whether it launches
    on the local host. On the host's sandboxes, exactly what they allow: each node's CPUs (at
    least MANTA_LOCAL_MIN_NODE_CPU), its memory with its object store and Ray's overhead, its
    disk. Elsewhere (and unsandboxed), what the spec asks: head + Σ replicas × node."""
    requested = job_spec.requested_resources(spec)
    config = local_target_config(workspace)
    enforced = sandbox_footprint(spec, config) if config is not None else None
    return {**requested, **(enforced or {})}, config is not None


def job_prepare(
    *,
    actor: Actor,
    workspace: Workspace,
    template: JobTemplate | None,
    spec: dict[str, Any] | None = None,
    name: str = "",
    overrides: dict[str, Any] | None = None,
) -> Job:
    """The job a submission would create, validated as :func:`job_submit` validates it, and
    not saved: what a dry run answers about (``jobs.prediction``)."""
    overrides = overrides or {}
    require_active(workspace)
    if template is None:
        version, spec = None, adhoc_spec(workspace, spec)
        name = name or "adhoc"
    else:
        if template.archived_at is not None:
            raise InvalidInput.on("template", "the template is archived")
        version = latest_version(template)
        spec = resolve_spec(version, overrides, workspace.organization)
        name = name or template.name
    check_code(workspace, spec)
    requested, on_host = requested_for(workspace, spec)
    check_submission(workspace, requested, spec, host_capacity() if on_host else None)
    reason = approval_needed(workspace, spec, requested)
    return Job(
        organization=workspace.organization,
        workspace=workspace,
        template_version=version,
        name=name,
        state=JobState.PENDING_APPROVAL if reason else JobState.QUEUED,
        spec=spec,
        overrides=overrides,
        requested_cpu=requested["cpu"],
        requested_memory_gb=requested["memory_gb"],
        requested_gpu=requested["gpu"],
        requested_disk_gb=requested["disk_gb"],
        priority=spec["priority"],
        submitted_by=actor.user,
        approval_required=bool(reason),
        approval_reason=reason,
        queued_at=None if reason else timezone.now(),
    )


@transaction.atomic
def job_submit(
    *,
    actor: Actor,
    workspace: Workspace,
    template: JobTemplate | None,
    spec: dict[str, Any] | None = None,
    name: str = "",
    overrides: dict[str, Any] | None = None,
) -> Job:
    """Submit a job from the template's latest version, or (``template=None``) with a ``spec``
    of its own where the workspace allows ad-hoc jobs. (A retried request is answered by the
    API's ``Idempotency-Key`` handling before it gets here.)"""
    job = job_prepare(
        actor=actor,
        workspace=workspace,
        template=template,
        spec=spec,
        name=name,
        overrides=overrides,
    )
    # Its id is known before it is written, so its four rows (the job, its timeline entry, its
    # audit event, its outbox event) go to the database as one statement. Its workspace,
    # organisation and submitter are at hand: no re-read.
    job.pk = _new_job_id(template)
    version, reason = job.template_version, job.approval_reason
    with one_statement():
        insert_rows(Job, [job])
        # A job queued at once: admitted in this process once this commits (one hop to its
        # launch task), before the outbox's wake-up of the dispatcher that record_event
        # registers.
        run_state_hooks(job, admit_here=admit_inline)
        record_event(
            job,
            from_state="",
            kind="submitted",
            actor=actor,
            reason=reason,
            data={"template": template.name, "template_version": version.version}
            if template
            else {"template": None},
            audit_action="job.submit",
            changes={"state": [None, job.state]},
        )
    return job


def _new_job_id(template: JobTemplate | None) -> int | None:
    """A new job's id: the one drawn with its template (``selectors.template_for_submission``),
    else the next of the table's sequence; None where the database makes it on insert (not
    PostgreSQL)."""
    drawn = getattr(template, selectors.NEW_JOB_ID, None)
    if drawn is not None or connection.vendor != "postgresql":
        return drawn
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {selectors.DRAW_JOB_ID}")
        return cursor.fetchone()[0]


def _decide(actor: Actor, job: Job, to_state: str, **kwargs) -> Job:
    """Approve or reject: never by the submitter; records who decided, when and why."""
    if job.submitted_by_id == actor.user_id:
        raise SelfApprovalForbidden("a submitter cannot decide on their own job")
    now, reason = timezone.now(), kwargs.get("reason", "")

    def decide(locked: Job) -> None:
        locked.decided_by, locked.decided_at, locked.decision_reason = actor.user, now, reason

    return transition(job.pk, to_state, actor=actor, mutate=decide, **kwargs)


def job_approve(*, actor: Actor, job: Job, reason: str = "") -> Job:
    require_active(job.workspace)  # rejecting and cancelling stay possible: they stop work
    return _decide(
        actor,
        job,
        JobState.QUEUED,
        kind="approved",
        reason=reason,
        audit_action="job.approve",
        expect_from=frozenset({JobState.PENDING_APPROVAL}),
        admit_here=admit_inline,  # admitted in this process: one hop to its launch task
    )


def job_reject(*, actor: Actor, job: Job, reason: str) -> Job:
    if not reason.strip():
        raise InvalidInput.on("reason", "a rejection needs a reason")
    return _decide(
        actor, job, JobState.REJECTED, kind="rejected", reason=reason, audit_action="job.reject"
    )


def job_cancel(*, actor: Actor, job: Job, may_cancel_any: bool, reason: str = "") -> Job:
    if not may_cancel_any and job.submitted_by_id != actor.user_id:
        raise Forbidden("developers may cancel only their own jobs")
    return transition(
        job.pk,
        JobState.CANCELLED,
        actor=actor,
        kind="cancelled",
        reason=reason or f"cancelled by {actor.label}",
        audit_action="job.cancel",
    )
