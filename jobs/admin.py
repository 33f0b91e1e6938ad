"""Templates and jobs in the admin panel, which is the org admins' console: an overview of each
organisation they administer (jobs/console.py), an approvals inbox, and a page per job with its
attempts, phases, log and timeline. Everything is scoped to the orgs the user administers (a
job or an organisation of another is a 404), and every decision goes through the same services
as the API (jobs/services.py), which validate it and write its audit row.

Tenant data (job names, reasons, log lines) reaches the pages only through Django's
autoescaping; nothing here marks a tenant's string safe."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse

from audit.context import Actor
from config.errors import DomainError
from workspaces.admin import ReadOnlyAdmin, ReadOnlyInline, administered_org_ids
from workspaces.models import Organization

from . import console, services
from .admission import explain
from .launchers import ray_jobs
from .logs import job_logs
from .models import TERMINAL_STATES, Job, JobState, JobTemplate, JobTemplateVersion
from .prediction import cached_prediction

LOG_LINES = 50  # the end of the log a job page shows


class VersionInline(ReadOnlyInline):
    model = JobTemplateVersion
    fields = ["version", "spec", "allowed_overrides", "created_by", "created_at"]


@admin.register(JobTemplate)
class JobTemplateAdmin(ReadOnlyAdmin):
    list_display = ["name", "workspace", "latest_version", "updated_at", "archived_at"]
    list_select_related = ["workspace"]
    search_fields = ["name"]
    inlines = [VersionInline]


class InboxForm(forms.Form):
    """Approve or reject one job or many; a rejection carries the reason the admin typed."""

    jobs = forms.ModelMultipleChoiceField(
        queryset=Job.objects.none(),
        widget=forms.CheckboxSelectMultiple,
        error_messages={
            "required": "choose at least one job",
            "invalid_choice": "job %(value)s is not waiting for your approval",
        },
    )
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    reason = forms.CharField(required=False, max_length=1000, widget=forms.Textarea)

    def __init__(self, *args, pending, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["jobs"].queryset = pending

    def clean(self):
        data = super().clean()
        if data.get("decision") == "reject" and not data.get("reason", "").strip():
            self.add_error("reason", "a rejection needs a reason: type why the job is refused")
        return data


class JobActionForm(forms.Form):
    """A decision on one job from its page: approve, reject (with a typed reason) or cancel."""

    action = forms.ChoiceField(
        choices=[("approve", "Approve"), ("reject", "Reject"), ("cancel", "Cancel")]
    )
    reason = forms.CharField(required=False, max_length=1000, widget=forms.Textarea)

    def clean(self):
        data = super().clean()
        if data.get("action") == "reject" and not data.get("reason", "").strip():
            self.add_error("reason", "a rejection needs a reason: type why the job is refused")
        return data


def decide(actor: Actor, job: Job, action: str, reason: str) -> Job:
    """One decision through the services (they check the transition and write the audit row).
    An org admin acts as admin in every workspace of the org, so may cancel anyone's job."""
    if action == "approve":
        return services.job_approve(actor=actor, job=job, reason=reason)
    if action == "reject":
        return services.job_reject(actor=actor, job=job, reason=reason)
    return services.job_cancel(actor=actor, job=job, may_cancel_any=True, reason=reason)


def dashboard_path(job: Job) -> str:
    """The job's Ray Dashboard through Manta's proxy (the API checks who may open it)."""
    return (
        f"/api/v1/orgs/{job.organization.slug}/workspaces/{job.workspace.slug}"
        f"/jobs/{job.pk}/dashboard/"
    )


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "name",
        "workspace",
        "state",
        "submitted_by",
        "requested_cpu",
        "requested_gpu",
        "created_at",
    ]
    list_filter = ["state", "approval_required"]
    list_select_related = ["workspace", "submitted_by"]
    search_fields = ["name", "submitted_by__email"]
    change_list_template = "console/job_changelist.html"
    # Approving many from the list needs no reason; rejecting does, so it is done in the inbox
    # or on the job's page, where the reason is typed.
    actions = ["approve"]

    @admin.action(description="Approve selected jobs")
    def approve(self, request, queryset):
        self._decide_each(request, queryset, "approve", "")

    def has_change_permission(self, request, obj=None):
        # Rows are never changed here; the list needs "change" for its action to show.
        return obj is None and self._allowed(request)

    # --- URLs ----------------------------------------------------------------------------

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("overview/", view(self.overview_index), name="jobs_overview_index"),
            path("overview/<slug:org>/", view(self.overview_view), name="jobs_overview"),
            path("inbox/", view(self.inbox_view), name="jobs_inbox"),
            path("<path:object_id>/decide/", view(self.decide_view), name="jobs_job_decide"),
            *super().get_urls(),
        ]

    def _console_allowed(self, request) -> None:
        if not self._allowed(request):
            raise Http404("no organisation you administer")

    def _organizations(self, request):
        orgs = Organization.objects.order_by("slug")
        if request.user.is_superuser:
            return orgs
        return orgs.filter(pk__in=administered_org_ids(request.user))

    def _context(self, request, title: str, **extra):
        return {**self.admin_site.each_context(request), "title": title, "opts": self.opts, **extra}

    # --- overview ------------------------------------------------------------------------

    def overview_index(self, request):
        self._console_allowed(request)
        orgs = list(self._organizations(request))
        if len(orgs) == 1:
            return HttpResponseRedirect(reverse("admin:jobs_overview", args=[orgs[0].slug]))
        context = self._context(request, "Overview", organizations=orgs)
        return TemplateResponse(request, "console/overview_index.html", context)

    def overview_view(self, request, org: str):
        self._console_allowed(request)
        organization = get_object_or_404(self._organizations(request), slug=org)
        overview = console.org_overview(organization)
        context = self._context(request, f"{organization.name}: overview", **overview)
        return TemplateResponse(request, "console/overview.html", context)

    # --- approvals inbox -----------------------------------------------------------------

    def _pending(self, request):
        return (
            self.get_queryset(request)
            .filter(state=JobState.PENDING_APPROVAL)
            .select_related("workspace", "organization", "submitted_by")
            .order_by("created_at", "id")
        )

    def inbox_view(self, request):
        self._console_allowed(request)
        pending = self._pending(request)
        status = 200
        if request.method == "POST":
            form = InboxForm(request.POST, pending=pending)
            if form.is_valid():
                data = form.cleaned_data
                self._decide_each(request, data["jobs"], data["decision"], data["reason"].strip())
                return HttpResponseRedirect(reverse("admin:jobs_inbox"))
            status = 400
            for field, errors in form.errors.items():
                for error in errors:
                    self.message_user(request, f"{field}: {error}", level=messages.ERROR)
        else:
            form = InboxForm(pending=pending)
        context = self._context(request, "Approvals inbox", form=form, pending=list(pending))
        return TemplateResponse(request, "console/inbox.html", context, status=status)

    def _decide_each(self, request, jobs, decision: str, reason: str) -> None:
        """Each job on its own: one refused (e.g. the admin's own job) does not stop the rest."""
        actor = Actor.for_user(request.user)
        done = []
        for job in jobs:
            try:
                decide(actor, job, decision, reason)
                done.append(str(job.pk))
            except DomainError as exc:
                self.message_user(request, f"job {job.pk}: {exc.detail}", level=messages.ERROR)
        if done:
            verb = "approved" if decision == "approve" else "rejected"
            self.message_user(request, f"{verb} job(s) {', '.join(done)}", level=messages.SUCCESS)

    # --- the job page --------------------------------------------------------------------

    def _job(self, request, object_id) -> Job:
        job = self.get_object(request, unquote(object_id))
        if job is None:
            raise Http404("no such job among the organisations you administer")
        return job

    def change_view(self, request, object_id, form_url="", extra_context=None):
        self._console_allowed(request)
        return self._job_page(request, self._job(request, object_id), JobActionForm())

    def _job_page(self, request, job: Job, form: JobActionForm, status: int = 200):
        attempts = list(job.attempts.order_by("number"))
        for attempt in attempts:
            attempt.phases = console.attempt_phases(attempt)
        try:
            log = job_logs(job, tail=LOG_LINES)
            log_text, log_error = log["logs"], ""
        except Exception as exc:  # a page must render whatever the cluster answers
            log_text, log_error = "", f"the log could not be read ({type(exc).__name__})"
        running = any(a.state == "running" for a in attempts)
        context = self._context(
            request,
            f"Job {job.pk}",
            job=job,
            original=job,
            attempts=attempts,
            events=list(job.events.order_by("id").select_related("actor")),
            waiting=explain(job) if job.state == JobState.QUEUED else None,
            predicted=cached_prediction(job) if job.state == JobState.QUEUED else None,
            log_text=ray_jobs.tail_lines(log_text, LOG_LINES) if log_text else "",
            log_error=log_error,
            form=form,
            can_decide=job.state == JobState.PENDING_APPROVAL,
            can_cancel=job.state not in TERMINAL_STATES,
            dashboard=dashboard_path(job) if running else "",
            ended=job.state in TERMINAL_STATES,
        )
        return TemplateResponse(request, "console/job.html", context, status=status)

    def decide_view(self, request, object_id):
        self._console_allowed(request)
        job = self._job(request, object_id)
        if request.method != "POST":
            return HttpResponseRedirect(reverse("admin:jobs_job_change", args=[job.pk]))
        form = JobActionForm(request.POST)
        if not form.is_valid():
            for field, errors in form.errors.items():
                for error in errors:
                    self.message_user(request, f"{field}: {error}", level=messages.ERROR)
            return self._job_page(request, job, form, status=400)
        action, reason = form.cleaned_data["action"], form.cleaned_data["reason"].strip()
        try:
            decide(Actor.for_user(request.user), job, action, reason)
        except DomainError as exc:
            self.message_user(request, f"job {job.pk}: {exc.detail}", level=messages.ERROR)
            return self._job_page(request, job, form, status=exc.status_code)
        done = {"approve": "approved", "reject": "rejected", "cancel": "cancelled"}[action]
        self.message_user(request, f"job {job.pk} {done}", level=messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:jobs_job_change", args=[job.pk]))


from . import admin_pools  # noqa: E402, F401  (registers the warm pools' pages)
