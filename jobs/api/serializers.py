from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from config.serializers import FieldsBuiltOnceMixin
from config.strict import StrictSerializer
from jobs import spec as job_spec
from jobs.api import dashboard, examples
from jobs.metrics_snapshot import REASONS
from jobs.models import Job, JobAttempt, JobEvent, JobState, JobTemplate, JobTemplateVersion
from jobs.waiting import QUEUE_REASONS
from workspaces.models import ComputeTargetKind


class ResourcesOutput(serializers.Serializer):
    """What admission holds for the job (on the local host's sandboxes: what they allow)."""

    cpu = serializers.FloatField()
    memory_gb = serializers.FloatField()
    gpu = serializers.FloatField()
    disk_gb = serializers.FloatField()


@extend_schema_serializer(examples=examples.TEMPLATE_CREATE_INPUT)
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


@extend_schema_serializer(examples=examples.TEMPLATE_UPDATE_INPUT)
class TemplateUpdateInput(StrictSerializer):
    """Any spec field, plus description and allowed_overrides: the result is a new version."""

    image = serializers.CharField(required=False)
    entrypoint = serializers.CharField(required=False, trim_whitespace=False)
    runtime_env = serializers.DictField(required=False)
    head = serializers.DictField(required=False)
    worker_groups = serializers.ListField(child=serializers.DictField(), required=False)
    max_runtime_seconds = serializers.IntegerField(required=False)
    min_runtime_seconds = serializers.IntegerField(required=False)
    max_retries = serializers.IntegerField(required=False)
    priority = serializers.IntegerField(required=False)
    ttl_seconds_after_finished = serializers.IntegerField(required=False)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    allowed_overrides = serializers.ListField(child=serializers.CharField(), required=False)


@extend_schema_serializer(examples=examples.TEMPLATE_VERSION_OUTPUT)
class TemplateVersionOutput(serializers.ModelSerializer):
    created_by = serializers.EmailField(source="created_by.email", allow_null=True)
    spec = serializers.JSONField()

    class Meta:
        model = JobTemplateVersion
        fields = ["version", "spec", "allowed_overrides", "created_by", "created_at"]


@extend_schema_serializer(examples=examples.TEMPLATE_OUTPUT)
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


@extend_schema_serializer(examples=examples.JOB_SUBMIT_INPUT)
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


@extend_schema_serializer(examples=examples.REASON_INPUT)
class ReasonInput(StrictSerializer):
    reason = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")


@extend_schema_serializer(examples=examples.REJECT_INPUT)
class RejectInput(StrictSerializer):
    reason = serializers.CharField(max_length=1000, help_text="Why the job is rejected")


def _seconds(start, end) -> float | None:
    return round((end - start).total_seconds(), 3) if start and end else None


class AttemptOutput(FieldsBuiltOnceMixin, serializers.ModelSerializer):
    submission_id = serializers.CharField(help_text="The Ray job's submission_id")
    compute_target = serializers.CharField(source="target_name")
    phases = serializers.SerializerMethodField(help_text="Seconds spent in each phase")
    dashboard_url = serializers.SerializerMethodField(
        help_text="The attempt's Ray Dashboard through Manta (a path on this API, read only), "
        "while its cluster is up; empty otherwise"
    )

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
            "preempting_at",
            "preempted_gpu_seconds",
            "gpu_flavor",
        ]
        extra_kwargs = {
            "gpu_flavor": {"help_text": "The GPU flavor admission chose ('': untyped, or none)"}
        }

    def get_dashboard_url(self, attempt) -> str:
        # Not the cluster's own address: that is a port on the worker host, behind its token.
        return dashboard.proxy_path(attempt)

    def get_phases(self, attempt) -> dict[str, float | None]:
        return {
            "dispatch": _seconds(attempt.created_at, attempt.launch_started_at),
            "cluster_start": _seconds(attempt.launch_started_at, attempt.cluster_ready_at),
            "submit": _seconds(attempt.cluster_ready_at, attempt.submitted_at),
            "to_running": _seconds(attempt.submitted_at, attempt.running_at),
            "run": _seconds(attempt.running_at, attempt.finished_at),
            "teardown": _seconds(attempt.finished_at, attempt.torn_down_at),
        }


@extend_schema_serializer(examples=examples.JOB_LOGS_OUTPUT)
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


class PredictedStartOutput(serializers.Serializer):
    """When the job is expected to be admitted (see docs/prediction.md)."""

    p50 = serializers.DateTimeField(allow_null=True, help_text="Median; null: cannot predict")
    p90 = serializers.DateTimeField(allow_null=True, help_text="90th percentile")
    why_unknown = serializers.CharField(
        allow_blank=True, help_text="When p50 is null: why there is no prediction"
    )


class GroupFactorsOutput(serializers.Serializer):
    group = serializers.CharField(help_text="The quota group's name")
    current_share = serializers.FloatField(
        allow_null=True, help_text="What its subtree holds now ÷ its guarantee (dominant)"
    )
    decayed_usage_share = serializers.FloatField(
        allow_null=True, help_text="Its workspaces' decayed past usage ÷ its guarantee"
    )
    weight = serializers.FloatField(help_text="The group's fair_share_weight")
    fair_share_key = serializers.FloatField(
        allow_null=True, help_text="Compared with its siblings' first: lowest goes first"
    )


class QueueFactorsOutput(serializers.Serializer):
    """What places a queued job under ``fair_share`` or ``intelligent``, as Slurm's ``sprio``
    shows it (docs/scheduling.md#policies). A share is null where it is infinite: the workspace
    holds (or held) a resource it has no guarantee of."""

    current_share = serializers.FloatField(
        allow_null=True, help_text="What its workspace holds now ÷ its guarantee (dominant)"
    )
    decayed_usage_share = serializers.FloatField(
        allow_null=True,
        help_text="Its workspace's decayed past usage, as an average held ÷ its guarantee",
    )
    decayed_gpu_hours = serializers.FloatField(
        help_text="Its workspace's past GPU use, in GPU-hours decayed to now"
    )
    weight = serializers.FloatField(help_text="Its workspace's fair_share_weight")
    fair_share_key = serializers.FloatField(
        allow_null=True,
        help_text="(current_share + decayed_usage_share) ÷ weight: lowest goes first",
    )
    priority = serializers.IntegerField()
    age_seconds = serializers.FloatField(help_text="How long it has been queued")
    band = serializers.ChoiceField(
        choices=["strict", "backfill"],
        required=False,
        help_text="intelligent only: priority 7-9 keep strict order, 1-6 may be overtaken",
    )
    aged = serializers.BooleanField(
        required=False,
        help_text="intelligent only: a backfill job that waited past the aging time, and is "
        "no longer overtaken",
    )
    path = GroupFactorsOutput(
        many=True,
        required=False,
        help_text="Under quota groups: the factors of each group above its workspace, from "
        "the top; siblings are ordered at the highest level where their paths part",
    )


class QueueOutput(serializers.Serializer):
    position = serializers.IntegerField(help_text="1-based place in the organisation's queue")
    queued = serializers.IntegerField(help_text="How many jobs the organisation has queued")
    waiting_for = serializers.CharField()
    predicted_start = PredictedStartOutput()
    factors = QueueFactorsOutput(
        required=False, help_text="Under fair_share and intelligent: what places the job"
    )


@extend_schema_serializer(examples=examples.JOB_OUTPUT)
class JobOutput(FieldsBuiltOnceMixin, serializers.ModelSerializer):
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
    gpu_flavor = serializers.SerializerMethodField(
        help_text="The GPU flavor its latest admission chose ('': untyped GPUs, or no GPUs; "
        "null before its first admission); spec.gpu_flavor says which it accepts"
    )
    queue = serializers.SerializerMethodField(
        help_text="While queued: position in the organisation's queue, what it waits for and "
        "the predicted start. A submission's answer has it only with ?include=position (null "
        "otherwise); the job's detail always has it."
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
            "gpu_flavor",
            "queue",
        ]

    def get_gpu_flavor(self, job) -> str | None:
        attempts = list(job.attempts.all())  # prefetched with the job
        return max(attempts, key=lambda a: a.number).gpu_flavor if attempts else None

    @extend_schema_field(QueueOutput(allow_null=True))
    def get_queue(self, job) -> dict | None:
        from jobs.admission import explain
        from jobs.prediction import cached_prediction

        if not self.context.get("explain"):
            return None
        queue = explain(job)
        if queue is not None:
            queue["predicted_start"] = PredictedStartOutput(cached_prediction(job)).data
        return queue

    def get_template(self, job) -> dict | None:
        if job.template_version is None:
            return None  # an ad-hoc job
        template = job.template_version.template
        return {"id": template.pk, "name": template.name}


class SubmitQuery(serializers.Serializer):
    dry_run = serializers.BooleanField(required=False, default=False)
    include = serializers.MultipleChoiceField(choices=["position"], required=False, default=set)


class DryRunOutput(serializers.Serializer):
    """What ``POST …/jobs/?dry_run=true`` answers: what the submission would do now. Nothing
    is created."""

    dry_run = serializers.SerializerMethodField()
    state = serializers.CharField(
        source="job.state", help_text="The state the job would enter: queued or pending_approval"
    )
    approval_reason = serializers.CharField(source="job.approval_reason", allow_blank=True)
    requested = ResourcesOutput(source="job.requested")
    would_admit_now = serializers.BooleanField(
        help_text="Whether the next admission pass would admit it"
    )
    position = serializers.IntegerField(
        source="prediction.position",
        help_text="Its place in the organisation's admission order (0: admitted now)",
    )
    blocker = serializers.ChoiceField(
        source="prediction.blocker",
        choices=(*REASONS, *QUEUE_REASONS),
        allow_null=True,
        help_text="What it would wait for (a why-waiting reason); null when it would be "
        "admitted now",
    )
    waiting_for = serializers.CharField(
        source="prediction.waiting_for",
        allow_null=True,
        help_text="What it would wait for, in words, as a queued job's queue.waiting_for says "
        "it (a limit, a capacity, an earlier job that keeps strict order, capacity held back "
        "for an overdue job, …); null when it would be admitted now",
    )
    predicted_start = PredictedStartOutput(source="prediction")

    def get_dry_run(self, answer) -> bool:
        return True


@extend_schema_serializer(examples=examples.JOB_EVENT_OUTPUT)
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


@extend_schema_serializer(examples=examples.LAUNCH_PLAN_OUTPUT)
class LaunchPlanOutput(serializers.Serializer):
    kind = serializers.ChoiceField(choices=ComputeTargetKind.choices)
    cluster_name = serializers.CharField(allow_null=True, required=False)
    nodes = serializers.ListField(child=serializers.DictField(), required=False)
    submission = serializers.DictField(required=False)
    manifest = serializers.DictField(required=False, help_text="kuberay: the RayJob")
    address = serializers.CharField(required=False, help_text="ray: the cluster's dashboard")
