"""Reads of templates and jobs, scoped to one workspace (the tenant view resolved it)."""

from django.db import connection
from django.db.models import F, FilteredRelation, Q, QuerySet, Value
from django.db.models.expressions import RawSQL

from config.prepared import PreparedRead
from packages.models import CodePackage

from .local_host import TARGET_JOIN, TARGET_READ
from .models import TERMINAL_STATES, Job, JobAttempt, JobEvent, JobTemplate, JobTemplateVersion

# The alias under which a template is read with its latest version (templates_with_latest).
LATEST_JOIN = "joined_latest_version"


def templates_of(workspace, *, include_archived: bool = False) -> QuerySet[JobTemplate]:
    qs = JobTemplate.objects.filter(workspace=workspace)
    if not include_archived:
        qs = qs.filter(archived_at__isnull=True)
    return qs.order_by("id")


def templates_with_latest(workspace) -> QuerySet[JobTemplate]:
    """The workspace's templates, each read with its latest version in the same statement
    (``services.latest_version`` finds it there): what a submission needs of a template."""
    latest = FilteredRelation("versions", condition=Q(versions__version=F("latest_version")))
    return templates_of(workspace).annotate(**{LATEST_JOIN: latest}).select_related(LATEST_JOIN)


# A submission's template with its latest version, compiled once per connection
# (config/prepared.py): every job POST reads it. A submission also draws its job's id from the
# table's sequence in the same statement (``NEW_JOB_ID``): its rows are written in one
# statement, and the timeline, audit and outbox rows name the job.
NEW_JOB_ID = "new_job_id"
# The next value of the job table's id sequence, as SQL: drawn with the template, or alone.
DRAW_JOB_ID = f"nextval(pg_get_serial_sequence('{Job._meta.db_table}', 'id'))"


def _read(draw_id: bool):
    def build(workspace_id: int, template_id: int) -> QuerySet[JobTemplate]:
        found = templates_with_latest(workspace_id).filter(pk=template_id)
        if draw_id:
            found = found.annotate(**{NEW_JOB_ID: RawSQL(DRAW_JOB_ID, ())})
        return found.order_by("pk")[:1]

    return PreparedRead(build, int, int)


_SUBMITTED_TEMPLATE, _SUBMITTED_TEMPLATE_AND_ID = _read(False), _read(True)


def template_for_submission(
    workspace, template_id: int, *, draw_job_id: bool = False
) -> JobTemplate | None:
    """The workspace's (unarchived) template ``template_id`` with its latest version, or None;
    with ``draw_job_id`` (on PostgreSQL), a new job's id drawn in the same read, as
    ``NEW_JOB_ID`` (``services.job_submit`` takes it)."""
    if draw_job_id and connection.vendor == "postgresql":
        return _SUBMITTED_TEMPLATE_AND_ID.first(workspace.pk, template_id)
    return _SUBMITTED_TEMPLATE.first(workspace.pk, template_id)


def submission_workspaces(queryset):
    """``queryset`` (of workspaces) with what a submission checks read in the same statement:
    the organisation's and the workspace's quotas and the compute target the workspace names.
    The services use these rows when they came with the workspace, and read them otherwise."""
    target = FilteredRelation(
        "organization__compute_targets",
        condition=Q(organization__compute_targets__name=F("compute_target")),
    )
    return queryset.annotate(**{TARGET_JOIN: target, TARGET_READ: Value(True)}).select_related(
        "quota", "organization__quota", TARGET_JOIN
    )


def template_versions(template: JobTemplate) -> QuerySet[JobTemplateVersion]:
    return template.versions.select_related("created_by").order_by("version")


def latest_versions(templates) -> dict[int, JobTemplateVersion]:
    """One query for the latest version of each template on a page."""
    pairs = [(t.pk, t.latest_version) for t in templates]
    if not pairs:
        return {}
    versions = JobTemplateVersion.objects.filter(
        template_id__in=[pk for pk, _ in pairs], version__in={v for _, v in pairs}
    ).select_related("created_by")
    wanted = set(pairs)
    return {v.template_id: v for v in versions if (v.template_id, v.version) in wanted}


def jobs_of(workspace) -> QuerySet[Job]:
    return (
        Job.objects.filter(workspace=workspace)
        .select_related(
            "submitted_by", "decided_by", "template_version__template", "workspace__organization"
        )
        .prefetch_related("attempts")
        .order_by("-id")
    )


def known_to_have_no_attempts(job: Job) -> Job:
    """Mark ``job`` (just created) as having no attempts, so ``job.attempts.all()`` is empty
    without a query: what ``prefetch_related_objects`` with an empty queryset leaves, without
    building the prefetch's filtered query first (a tenth of a submission's rendering)."""
    none = JobAttempt.objects.none()
    # Filled as prefetch_related_objects fills what it prefetched: iterating ``none()`` itself
    # would still compile its SQL (ordering, joins) before finding it empty.
    none._result_cache, none._prefetch_done = [], True
    cache = job.__dict__.setdefault("_prefetched_objects_cache", {})
    cache[Job.attempts.field.remote_field.cache_name] = none
    return job


def job_events(job: Job) -> QuerySet[JobEvent]:
    return job.events.order_by("id")


def package_in_use(package: CodePackage) -> bool:
    """Whether a job that has not ended runs the package (so its retention must wait)."""
    return (
        Job.objects.filter(
            workspace_id=package.workspace_id, spec__runtime_env__working_dir=package.uri
        )
        .exclude(state__in=TERMINAL_STATES)
        .exists()
    )
