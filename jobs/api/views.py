"""Template and job endpoints. Views only translate: parse, call one service, render."""

import django_filters
from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import exceptions, status
from rest_framework.decorators import action
from rest_framework.response import Response

from config.filters import UtcDateTimeFilter
from config.pagination import CursorPagination
from config.throttles import SubmitUserThrottle, SubmitWorkspaceThrottle, ThrottledViewMixin
from jobs import launch_requests, prediction, selectors, services
from jobs import logs as driver_logs
from jobs.launchers.base import LaunchError
from jobs.models import Job, JobState, JobTemplate
from jobs.spec import SPEC_FIELDS
from workspaces import roles
from workspaces.api.idempotency import IDEMPOTENCY_KEY, idempotent
from workspaces.api.tenancy import WorkspaceViewSet

from . import serializers as s


class TemplateViewSet(WorkspaceViewSet):
    """Versioned job templates of a workspace."""

    queryset = JobTemplate.objects.none()
    workspace_field = "workspace"
    not_found_message = "No such template."
    serializer_class = s.TemplateOutput
    permission_map = {
        "list": roles.WS_VIEW,
        "retrieve": roles.WS_VIEW,
        "versions": roles.WS_VIEW,
        "create": roles.WS_MANAGE_TEMPLATES,
        "partial_update": roles.WS_MANAGE_TEMPLATES,
        "destroy": roles.WS_MANAGE_TEMPLATES,
    }

    def base_queryset(self):
        include = self.request.query_params.get("include_archived") in ("1", "true")
        if self.action != "list":
            include = True
        return selectors.templates_of(self.workspace, include_archived=include)

    def _render(self, templates, many=False):
        items = templates if many else [templates]
        context = {"latest": selectors.latest_versions(items)}
        return s.TemplateOutput(templates, many=many, context=context).data

    @extend_schema(
        operation_id="templates_list",
        parameters=[OpenApiParameter("include_archived", bool, description="Also archived ones")],
    )
    def list(self, request, org=None, ws=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(self._render(page, many=True))

    @extend_schema(
        operation_id="templates_create",
        parameters=[IDEMPOTENCY_KEY],
        request=s.TemplateCreateInput,
        responses={201: s.TemplateOutput},
    )
    @idempotent
    def create(self, request, org=None, ws=None):
        data = s.TemplateCreateInput(data=request.data, context={"organization": self.organization})
        data.is_valid(raise_exception=True)
        values = data.validated_data
        version = services.template_create(
            actor=self.actor,
            workspace=self.workspace,
            name=values["name"],
            spec={key: values[key] for key in SPEC_FIELDS if key in values},
            allowed_overrides=values.get("allowed_overrides", []),
            description=values.get("description", ""),
        )
        return Response(self._render(version.template), status=status.HTTP_201_CREATED)

    @extend_schema(operation_id="template_retrieve")
    def retrieve(self, request, org=None, ws=None, pk=None):
        return Response(self._render(self.get_object()))

    @extend_schema(
        operation_id="template_update",
        request=s.TemplateUpdateInput,
        responses=s.TemplateOutput,
        description="Edits make a new immutable version; jobs keep the version they used.",
    )
    def partial_update(self, request, org=None, ws=None, pk=None):
        data = s.TemplateUpdateInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        version = services.template_update(
            actor=self.actor,
            template=self.get_object(),
            spec_changes={key: request.data[key] for key in SPEC_FIELDS if key in values},
            allowed_overrides=values.get("allowed_overrides"),
            description=values.get("description"),
        )
        return Response(self._render(version.template))

    @extend_schema(operation_id="template_archive", responses={204: None})
    def destroy(self, request, org=None, ws=None, pk=None):
        services.template_archive(actor=self.actor, template=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        operation_id="template_versions_list", responses=s.TemplateVersionOutput(many=True)
    )
    @action(detail=True)
    def versions(self, request, org=None, ws=None, pk=None):
        versions = selectors.template_versions(self.get_object())
        page = self.paginate_queryset(versions)
        return self.get_paginated_response(s.TemplateVersionOutput(page, many=True).data)


class JobFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices)
    template = django_filters.NumberFilter(field_name="template_version__template_id")
    submitter = django_filters.CharFilter(field_name="submitted_by__email", lookup_expr="iexact")
    created_after = UtcDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Job
        fields = []


class JobViewSet(ThrottledViewMixin, WorkspaceViewSet):
    """Jobs of a workspace: submit, follow, approve, reject, cancel."""

    queryset = Job.objects.none()
    workspace_field = "workspace"
    not_found_message = "No such job."
    serializer_class = s.JobOutput
    filterset_class = JobFilter
    pagination_class = CursorPagination  # the jobs and a job's events: long lists
    throttle_map = {"create": [SubmitUserThrottle, SubmitWorkspaceThrottle]}
    permission_map = {
        "list": roles.WS_VIEW,
        "retrieve": roles.WS_VIEW,
        "events": roles.WS_VIEW,
        "logs": roles.WS_VIEW,
        "launch_plan": roles.WS_VIEW,
        "create": roles.WS_SUBMIT_JOB,
        "approve": roles.WS_APPROVE_JOB,
        "reject": roles.WS_APPROVE_JOB,
        "cancel": roles.WS_CANCEL_OWN_JOB,
    }

    def base_queryset(self):
        return selectors.jobs_of(self.workspace)

    def workspace_queryset(self):
        workspaces = super().workspace_queryset()
        if self.action == "create":  # the quotas and target a submission checks, in one read
            return selectors.submission_workspaces(workspaces)
        return workspaces

    def _render(self, job: Job) -> dict:
        # Read again through the view's queryset: the output needs its joins.
        return s.JobOutput(self.get_queryset().get(pk=job.pk), context={"explain": True}).data

    @extend_schema(operation_id="jobs_list")
    def list(self, request, org=None, ws=None):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response(s.JobOutput(page, many=True).data)

    @extend_schema(
        operation_id="jobs_submit",
        request=s.JobSubmitInput,
        responses={
            201: s.JobOutput,
            200: PolymorphicProxySerializer(
                component_name="JobSubmitAnswer",
                serializers=[s.JobOutput, s.DryRunOutput],
                resource_type_field_name=None,
            ),
        },
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                description="A retried POST with the same key returns the same job (200)",
            ),
            OpenApiParameter(
                "include",
                str,
                enum=["position"],
                description="`position`: also answer the new job's `queue` (its place in the "
                "organisation's queue, what it waits for, its predicted start), as its detail "
                "does. Without it `queue` is null: working it out reads the queue, a cost that "
                "grows with its length, which a submission does not pay unless asked.",
            ),
            OpenApiParameter(
                "dry_run",
                bool,
                description="Create nothing: answer (200) whether the job would be admitted "
                "now, its place in the queue, what it would wait for and its predicted start. "
                "Bad input is refused as a submission would be.",
            ),
        ],
    )
    def create(self, request, org=None, ws=None):
        query = s.SubmitQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        if query.validated_data["dry_run"]:
            job = services.job_prepare(actor=self.actor, **self._submission(request))
            return Response(s.DryRunOutput(prediction.dry_run(job)).data)
        return self._submit(request, explain="position" in query.validated_data["include"])

    def _submission(self, request, *, draw_job_id: bool = False) -> dict:
        """The submission's arguments, parsed from the body (``draw_job_id``: see
        ``selectors.template_for_submission``)."""
        data = s.JobSubmitInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        template = None
        if "template" in values:
            template = selectors.template_for_submission(
                self.workspace, values["template"], draw_job_id=draw_job_id
            )
            if template is None:
                missing = {"template": ["no such template in this workspace"]}
                raise exceptions.ValidationError(missing)
        return {
            "workspace": self.workspace,
            "template": template,
            "spec": values.get("spec"),
            "name": values.get("name", ""),
            "overrides": values["overrides"],
        }

    @idempotent(replay_status=status.HTTP_200_OK)
    def _submit(self, request, *, explain: bool):
        job = services.job_submit(actor=self.actor, **self._submission(request, draw_job_id=True))
        # Rendered from the rows the submission holds (a new job has no attempts), without
        # reading it back; its place in the queue only when asked for (a count over the queue).
        selectors.known_to_have_no_attempts(job)
        body = s.JobOutput(job, context={"explain": explain}).data
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(operation_id="job_retrieve")
    def retrieve(self, request, org=None, ws=None, pk=None):
        return Response(s.JobOutput(self.get_object(), context={"explain": True}).data)

    @extend_schema(operation_id="job_approve", request=s.ReasonInput, responses=s.JobOutput)
    @action(detail=True, methods=["post"])
    def approve(self, request, org=None, ws=None, pk=None):
        data = s.ReasonInput(data=request.data)
        data.is_valid(raise_exception=True)
        job = services.job_approve(actor=self.actor, job=self.get_object(), **data.validated_data)
        return Response(self._render(job))

    @extend_schema(operation_id="job_reject", request=s.RejectInput, responses=s.JobOutput)
    @action(detail=True, methods=["post"])
    def reject(self, request, org=None, ws=None, pk=None):
        data = s.RejectInput(data=request.data)
        data.is_valid(raise_exception=True)
        job = services.job_reject(actor=self.actor, job=self.get_object(), **data.validated_data)
        return Response(self._render(job))

    @extend_schema(operation_id="job_cancel", request=s.ReasonInput, responses=s.JobOutput)
    @action(detail=True, methods=["post"])
    def cancel(self, request, org=None, ws=None, pk=None):
        data = s.ReasonInput(data=request.data)
        data.is_valid(raise_exception=True)
        job = services.job_cancel(
            actor=self.actor,
            job=self.get_object(),
            reason=data.validated_data["reason"],
            may_cancel_any=self.has_perm(roles.WS_CANCEL_ANY_JOB),
        )
        return Response(self._render(job))

    @extend_schema(
        operation_id="job_events_list", responses=s.JobEventOutput(many=True), filters=False
    )
    @action(detail=True)
    def events(self, request, org=None, ws=None, pk=None):
        events = selectors.job_events(self.get_object())
        page = self.paginate_queryset(events)
        return self.get_paginated_response(s.JobEventOutput(page, many=True).data)

    @extend_schema(
        operation_id="job_logs",
        parameters=[
            OpenApiParameter("tail", int, description="Only the last N lines"),
            OpenApiParameter(
                "since",
                int,
                description="Only the text after this offset (the offset of a previous answer)",
            ),
            OpenApiParameter("attempt", int, description="Attempt number (default: latest)"),
            OpenApiParameter(
                "follow",
                bool,
                description="Stream the log as text/plain while it grows, until the attempt "
                "ends (from since= when given)",
            ),
        ],
        responses=s.JobLogsOutput,
    )
    @action(detail=True)
    def logs(self, request, org=None, ws=None, pk=None):
        params = s.LogsQuery(data=request.query_params)
        params.is_valid(raise_exception=True)
        job = self.get_object()
        query = params.validated_data
        if query["follow"]:
            stream = driver_logs.job_log_stream(
                job, number=query.get("attempt"), since=query.get("since") or 0
            )
            return StreamingHttpResponse(stream, content_type="text/plain; charset=utf-8")
        body = driver_logs.job_logs(
            job, number=query.get("attempt"), tail=query.get("tail"), since=query.get("since")
        )
        return Response(s.JobLogsOutput(body).data)

    @extend_schema(
        operation_id="job_launch_plan",
        responses=s.LaunchPlanOutput,
        description="What the job's compute target launches: the RayJob manifest (kuberay), "
        "the nodes and their logical resources (local), or the submission (ray).",
    )
    @action(detail=True, url_path="launch-plan")
    def launch_plan(self, request, org=None, ws=None, pk=None):
        job = self.get_object()
        try:
            plan = launch_requests.plan_for(job)
        except LaunchError as exc:
            raise exceptions.ValidationError({"compute_target": [str(exc)]}) from exc
        return Response(plan)
