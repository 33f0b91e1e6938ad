"""Reads of templates and jobs, scoped to one workspace (the tenant view resolved it)."""

from django.db.models import QuerySet

from packages.models import CodePackage

from .models import TERMINAL_STATES, Job, JobEvent, JobTemplate, JobTemplateVersion


def templates_of(workspace, *, include_archived: bool = False) -> QuerySet[JobTemplate]:
    qs = JobTemplate.objects.filter(workspace=workspace)
    if not include_archived:
        qs = qs.filter(archived_at__isnull=True)
    return qs.order_by("id")


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
