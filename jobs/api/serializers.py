from drf_spectacular.utils import OpenApiExample, extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from config.strict import StrictSerializer
from jobs import spec as job_spec
from jobs.models import Job, JobAttempt, JobEvent, JobState, JobTemplate, JobTemplateVersion
from workspaces.models import ComputeTargetKind

COUNTER_SPEC = {
    "image": "rayproject/ray:2.60.0",
    "entrypoint": 'python -c "import ray; ray.init(); '
    "C = ray.remote(type('C', (), {'__init__': lambda s: setattr(s, 'n', 0), "
    "'inc': lambda s: setattr(s, 'n', s.n + 1) or s.n})); c = C.remote(); "
    "print('count', [ray.get(c.inc.remote()) for _ in range(10)][-1])\"",
    "runtime_env": {"env_vars": {"COUNT_TO": "10"}},
    "head": {"cpu": 0, "memory_gb": 2, "gpu": 0},
    "worker_groups": [
        {
            "name": "workers",
            "replicas": 1,
            "min_replicas": 0,
            "max_replicas": 2,
            "cpu": 1,
            "memory_gb": 1,
            "gpu": 0,
            "resources": {},
        }
    ],
    "max_runtime_seconds": 600,
    "max_retries": 0,
    "priority": 5,
    "ttl_seconds_after_finished": 300,
}


class ResourcesOutput(serializers.Serializer):
    cpu = serializers.FloatField()
    memory_gb = serializers.FloatField()
    gpu = serializers.FloatField()


@extend_schema_serializer(
    examples=[
        OpenApiExample(
            "Counter template",
            value={
                "name": "counter",
                "description": "counts with an actor",
                **COUNTER_SPEC,
                "allowed_overrides": ["entrypoint", "worker_groups", "priority"],
            },
            request_only=True,
        )
    ]
)
class TemplateCreateInput(job_spec.JobSpec):
    name = serializers.RegexField(
        r"^[a-z0-9][a-z0-9_-]{0,99}$",
        max_length=100,
        help_text="lowercase letters, digits, '-' and '_'",
    )
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    allowed_overrides = serializers.ListField(
        child=serializers.ChoiceField(choices=sorted(job_spec.OVERRIDABLE)),
        required=False,
        help_text="Spec fields a submitter may override",
    )


@extend_schema_serializer(
    examples=[
        OpenApiExample(
            "New version", value={"priority": 7, "max_runtime_seconds": 900}, request_only=True
        )
    ]
)
class TemplateUpdateInput(StrictSerializer):
    """Any spec field, plus description and allowed_overrides: the result is a new version."""

    image = serializers.CharField(required=False)
    entrypoint = serializers.CharField(required=False, trim_whitespace=False)
    runtime_env = serializers.DictField(required=False)
    head = serializers.DictField(required=False)
    worker_groups = serializers.ListField(child=serializers.DictField(), required=False)
    max_runtime_seconds = serializers.IntegerField(required=False)
    max_retries = serializers.IntegerField(required=False)
    priority = serializers.IntegerField(required=False)
    ttl_seconds_after_finished = serializers.IntegerField(required=False)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    allowed_overrides = serializers.ListField(child=serializers.CharField(), required=False)


@extend_schema_serializer(
    examples=[
        OpenApiExample(
            "Version 1",
            value={
                "version": 1,
                "spec": COUNTER_SPEC,
                "allowed_overrides": ["priority"],
                "created_by": "admin@acme.test",
                "created_at": "2026-12-02T10:00:00Z",
            },
            response_only=True,
        )
    ]
)
class TemplateVersionOutput(serializers.ModelSerializer):
    created_by = serializers.EmailField(source="created_by.email", allow_null=True)
    spec = serializers.JSONField()

    class Meta:
        model = JobTemplateVersion
        fields = ["version", "spec", "allowed_overrides", "created_by", "created_at"]


@extend_schema_serializer(
    examples=[
        OpenApiExample(
            "A template",
            value={
                "id": 1,
                "name": "counter",
                "description": "counts with an actor",
                "version": 2,
                "spec": COUNTER_SPEC,
                "allowed_overrides": ["entrypoint", "priority"],
                "created_at": "2026-12-02T10:00:00Z",
                "updated_at": "2026-12-02T11:00:00Z",
                "archived_at": None,
            },
            response_only=True,
        )
    ]
)
class TemplateOutput(serializers.ModelSerializer):
    version = serializers.IntegerField(source="latest_version")
    spec = serializers.SerializerMethodField()
    allowed_overrides = serializers.SerializerMethodField()

    class Meta:
        model = JobTemplate
        fields = [
            "id",
            "name",
            "description",
            "version",
            "spec",
            "allowed_overrides",
            "created_at",
            "updated_at",
            "archived_at",
        ]

    def _latest(self, template) -> JobTemplateVersion:
        return self.context["latest"][template.pk]

    @extend_schema_field(serializers.JSONField(help_text="The latest version's spec"))
    def get_spec(self, template):
        return self._latest(template).spec

    def get_allowed_overrides(self, template) -> list[str]:
        return self._latest(template).allowed_overrides


@extend_schema_serializer(
    examples=[
        OpenApiExample(
            "Submit with an override",
            value={"template": 1, "name": "count-to-20", "overrides": {"priority": 7}},
            request_only=True,
        )
    ]
)
class JobSubmitInput(StrictSerializer):
    template = serializers.IntegerField(
        required=False, help_text="The template's id; its latest version is used"
    )
    spec = serializers.DictField(
        required=False,
        help_text="Instead of a template, the whole spec (workspaces with adhoc_jobs only); "
        "every rule of a template applies",
    )
    name = serializers.RegexField(r"^[a-z0-9][a-z0-9_-]{0,99}$", required=False, max_length=100)
    overrides = serializers.DictField(
        required=False, default=dict, help_text="Spec fields to override (allowed_overrides only)"
    )

    def validate(self, attrs):
        if ("template" in attrs) == ("spec" in attrs):
            raise serializers.ValidationError({"template": ["give a template or a spec, not both"]})
        if "spec" in attrs and attrs["overrides"]:
            raise serializers.ValidationError(
                {"overrides": ["a job with a spec of its own has nothing to override"]}
            )
        return attrs


@extend_schema_serializer(
    examples=[
        OpenApiExample(
            "With a reason", value={"reason": "approved for the demo"}, request_only=True
        )
    ]
)
class ReasonInput(StrictSerializer):
    reason = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")


@extend_schema_serializer(
    examples=[OpenApiExample("Reject", value={"reason": "too many GPUs"}, request_only=True)]
)
class RejectInput(StrictSerializer):
    reason = serializers.CharField(max_length=1000, help_text="Why the job is rejected")


def _seconds(start, end) -> float | None:
    return round((end - start).total_seconds(), 3) if start and end else None


class AttemptOutput(serializers.ModelSerializer):
    submission_id = serializers.CharField(help_text="The Ray job's submission_id")
    compute_target = serializers.CharField(source="target_name")
    phases = serializers.SerializerMethodField(help_text="Seconds spent in each phase")

    class Meta:
        model = JobAttempt
        fields = [
            "number",
            "state",
            "submission_id",
            "compute_target",
            "target_kind",
            "cluster_name",
            "dashboard_url",
            "ray_status",
            "ray_message",
            "exit_code",
            "failure_reason",
            "isolation",
            "code_commit",
            "code_package",
            "created_at",
            "launch_started_at",
            "cluster_ready_at",
            "submitted_at",
            "running_at",
            "finished_at",
            "torn_down_at",
            "phases",
        ]

    def get_phases(self, attempt) -> dict[str, float | None]:
        return {
            "dispatch": _seconds(attempt.created_at, attempt.launch_started_at),
            "cluster_start": _seconds(attempt.launch_started_at, attempt.cluster_ready_at),
            "submit": _seconds(attempt.cluster_ready_at, attempt.submitted_at),
            "to_running": _seconds(attempt.submitted_at, attempt.running_at),
            "run": _seconds(attempt.running_at, attempt.finished_at),
            "teardown": _seconds(attempt.finished_at, attempt.torn_down_at),
        }


@extend_schema_serializer(
    examples=[
        OpenApiExample(
            "After the attempt ended",
            value={"attempt": 1, "source": "archive", "logs": "counter reached 20\n"},
            response_only=True,
        )
    ]
)
class JobLogsOutput(serializers.Serializer):
    attempt = serializers.IntegerField(allow_null=True)
    source = serializers.ChoiceField(
        choices=["live", "archive", "none"],
        help_text="live: the cluster is up (Manta's copy answers when Ray cannot); archive: "
        "the attempt ended and its log was saved",
    )
    logs = serializers.CharField(allow_blank=True)
    offset = serializers.IntegerField(
        help_text="Where this text ends in the whole log: pass it as since= to get only what "
        "comes after"
    )


@extend_schema_serializer(
    examples=[
        OpenApiExample(
            "A job waiting for approval",
            value={
                "id": 42,
                "name": "counter",
                "state": "pending_approval",
                "template": {"id": 1, "name": "counter"},
                "template_version": 2,
                "spec": COUNTER_SPEC,
                "overrides": {"priority": 7},
                "requested": {"cpu": 1.0, "memory_gb": 3.0, "gpu": 0.0},
                "priority": 7,
                "submitted_by": "dev@acme.test",
                "approval_required": True,
                "approval_reason": "the workspace requires approval for every job",
                "decided_by": None,
                "decided_at": None,
                "decision_reason": "",
                "failure_reason": "",
                "message": "",
                "created_at": "2026-12-02T10:00:00Z",
                "queued_at": None,
                "started_at": None,
                "finished_at": None,
                "updated_at": "2026-12-02T10:00:00Z",
                "attempts": [],
            },
            response_only=True,
        )
    ]
)
class JobOutput(serializers.ModelSerializer):
    requested = ResourcesOutput()
    spec = serializers.JSONField()
    overrides = serializers.JSONField()
    template = serializers.SerializerMethodField()
    template_version = serializers.IntegerField(
        source="template_version.version", allow_null=True, default=None
    )
    submitted_by = serializers.EmailField(source="submitted_by.email")
    decided_by = serializers.EmailField(source="decided_by.email", allow_null=True, default=None)
    state = serializers.ChoiceField(choices=JobState.choices)
    attempts = AttemptOutput(many=True, read_only=True)
    queue = serializers.SerializerMethodField(
        help_text="While queued: position in the organisation's queue and what it waits for"
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "state",
            "template",
            "template_version",
            "spec",
            "overrides",
            "requested",
            "priority",
            "submitted_by",
            "approval_required",
            "approval_reason",
            "decided_by",
            "decided_at",
            "decision_reason",
            "failure_reason",
            "message",
            "created_at",
            "queued_at",
            "started_at",
            "finished_at",
            "updated_at",
            "attempts",
            "queue",
        ]

    def get_queue(self, job) -> dict | None:
        from jobs.admission import explain

        return explain(job) if self.context.get("explain") else None

    def get_template(self, job) -> dict | None:
        if job.template_version is None:
            return None  # an ad-hoc job
        template = job.template_version.template
        return {"id": template.pk, "name": template.name}


@extend_schema_serializer(
    examples=[
        OpenApiExample(
            "An approval",
            value={
                "id": 7,
                "kind": "approved",
                "from_state": "pending_approval",
                "to_state": "queued",
                "actor": "admin@acme.test",
                "reason": "looks fine",
                "data": {},
                "created_at": "2026-12-02T10:05:00Z",
            },
            response_only=True,
        )
    ]
)
class JobEventOutput(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")
    data = serializers.JSONField()

    class Meta:
        model = JobEvent
        fields = ["id", "kind", "from_state", "to_state", "actor", "reason", "data", "created_at"]


class LogsQuery(StrictSerializer):
    unknown_what = "query parameter"

    tail = serializers.IntegerField(min_value=1, max_value=100_000, required=False)
    since = serializers.IntegerField(min_value=0, max_value=2**62, required=False)
    attempt = serializers.IntegerField(min_value=1, required=False)
    follow = serializers.BooleanField(required=False, default=False)

    def validate(self, attrs):
        if "tail" in attrs and "since" in attrs:
            raise serializers.ValidationError({"since": ["cannot be combined with tail"]})
        if "tail" in attrs and attrs["follow"]:
            raise serializers.ValidationError({"follow": ["cannot be combined with tail"]})
        return attrs


@extend_schema_serializer(
    examples=[
        OpenApiExample(
            "local",
            value={
                "kind": "local",
                "cluster_name": "manta-acme-ml-42-1",
                "nodes": [
                    {
                        "role": "head",
                        "group": "head",
                        "num_cpus": 0,
                        "num_gpus": 0,
                        "memory_bytes": 2147483648,
                        "resources": {},
                    },
                    {
                        "role": "worker",
                        "group": "workers",
                        "index": 0,
                        "num_cpus": 1,
                        "num_gpus": 0,
                        "memory_bytes": 1073741824,
                        "resources": {},
                    },
                ],
                "submission": {
                    "submission_id": "5d1c…",
                    "entrypoint": "python main.py",
                    "runtime_env": {},
                    "entrypoint_num_cpus": 0,
                },
            },
            response_only=True,
        )
    ]
)
class LaunchPlanOutput(serializers.Serializer):
    kind = serializers.ChoiceField(choices=ComputeTargetKind.choices)
    cluster_name = serializers.CharField(allow_null=True, required=False)
    nodes = serializers.ListField(child=serializers.DictField(), required=False)
    submission = serializers.DictField(required=False)
    manifest = serializers.DictField(required=False, help_text="kuberay: the RayJob")
    address = serializers.CharField(required=False, help_text="ray: the cluster's dashboard")
