import ipaddress
import re

from django.conf import settings
from django.core.validators import RegexValidator
from drf_spectacular.utils import OpenApiExample, extend_schema_serializer
from rest_framework import serializers

from config import egress as egress_policy
from config import ssrf
from config.gpu_flavors import flavor_problem
from config.strict import StrictSerializer, unknown_errors
from workspaces import kubeconfig
from workspaces.models import (
    EMAIL_CATEGORIES,
    MAX_MIN_RUNTIME_SECONDS,
    MAX_PREEMPTION_GRACE_SECONDS,
    ApiToken,
    ApprovalPolicy,
    ComputeTarget,
    ComputeTargetKind,
    Organization,
    OrgMembership,
    OrgRole,
    User,
    Workspace,
    WorkspaceMembership,
    WorkspaceRole,
    slug_validator,
)

# --- tokens ------------------------------------------------------------------------------------


class TokenCreateInput(StrictSerializer):
    email = serializers.EmailField()
    password = serializers.CharField(write_only=True, trim_whitespace=False, max_length=256)
    name = serializers.CharField(required=False, allow_blank=True, max_length=100, default="")
    expires_in_days = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=3650, default=None
    )


class TokenOutput(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "expires_at", "revoked_at", "last_used_at"]


class TokenCreatedOutput(TokenOutput):
    token = serializers.CharField(help_text="The secret. Shown once; store it now.")

    class Meta(TokenOutput.Meta):
        fields = ["id", "token", *TokenOutput.Meta.fields[1:]]


# --- users and orgs ----------------------------------------------------------------------------


class UserOutput(serializers.ModelSerializer):
    class Meta:
        model = User
        fields = ["id", "email", "full_name", "date_joined"]


class OrgOutput(serializers.ModelSerializer):
    role = serializers.SerializerMethodField(help_text="The caller's role in this organisation")

    class Meta:
        model = Organization
        fields = [
            "id",
            "slug",
            "name",
            "allowed_image_prefixes",
            "max_nodes_per_job",
            "max_min_runtime_seconds",
            "preemption_grace_seconds",
            "created_at",
            "role",
        ]

    def get_role(self, org) -> str:
        return self.context.get("roles", {}).get(org.pk, "")


class OrgUpdateInput(StrictSerializer):
    name = serializers.CharField(required=False, max_length=200)
    allowed_image_prefixes = serializers.ListField(
        child=serializers.CharField(max_length=200, min_length=1),
        required=False,
        max_length=50,
        help_text="A template's image must start with one of these.",
    )
    max_nodes_per_job = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=1000,
        help_text="The most Ray nodes (head + worker replicas) one job may ask for.",
    )
    max_min_runtime_seconds = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_MIN_RUNTIME_SECONDS,
        help_text="The longest min_runtime_seconds a job may ask for (a job younger than its "
        "minimum runtime is never preempted).",
    )
    preemption_grace_seconds = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_PREEMPTION_GRACE_SECONDS,
        help_text="Seconds a preempted job's driver has between SIGTERM and the end of its "
        "cluster (0: stopped at once).",
    )


class MeOrgOutput(serializers.Serializer):
    slug = serializers.CharField()
    name = serializers.CharField()
    role = serializers.CharField()


class MeOutput(serializers.Serializer):
    id = serializers.IntegerField()
    email = serializers.EmailField()
    full_name = serializers.CharField()
    organizations = MeOrgOutput(many=True)
    notification_preferences = serializers.DictField(
        child=serializers.BooleanField(),
        help_text="Email categories and whether you receive them: "
        + ", ".join(f"{key} ({text})" for key, text in EMAIL_CATEGORIES.items()),
    )


@extend_schema_serializer(
    examples=[
        OpenApiExample(
            "No failure emails",
            value={"notification_preferences": {"job_failed": False}},
            request_only=True,
        )
    ]
)
class MeUpdateInput(StrictSerializer):
    notification_preferences = serializers.DictField(
        child=serializers.BooleanField(),
        required=False,
        help_text="Categories to turn on (true) or off (false): " + ", ".join(EMAIL_CATEGORIES),
    )


class OrgUserCreateInput(StrictSerializer):
    email = serializers.EmailField()
    password = serializers.CharField(write_only=True, trim_whitespace=False, max_length=256)
    org_role = serializers.ChoiceField(choices=OrgRole.choices, default=OrgRole.MEMBER)
    full_name = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")


class OrgUserOutput(serializers.ModelSerializer):
    id = serializers.IntegerField(source="user.id")
    email = serializers.EmailField(source="user.email")
    full_name = serializers.CharField(source="user.full_name")
    org_role = serializers.CharField(source="role")
    joined_at = serializers.DateTimeField(source="created_at")

    class Meta:
        model = OrgMembership
        fields = ["id", "email", "full_name", "org_role", "joined_at"]


# --- workspaces --------------------------------------------------------------------------------

# What jobs.services.approval_needed compares: the requested resources and the runtime.
THRESHOLD_KEYS = ("gpu", "cpu", "memory_gb", "max_runtime_seconds")


class ThresholdField(serializers.FloatField):
    """A JSON number, not a string or a boolean that would coerce to one."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


class ApprovalThresholdsField(serializers.DictField):
    child = ThresholdField(min_value=0)

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = unknown_errors(data, THRESHOLD_KEYS, "resource")
            if unknown:
                raise serializers.ValidationError(unknown)
        return super().to_internal_value(data)


class WorkspaceCreateInput(StrictSerializer):
    slug = serializers.CharField(max_length=40, validators=[slug_validator])
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    description = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, default=""
    )


class WorkspaceUpdateInput(StrictSerializer):
    name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    approval_policy = serializers.ChoiceField(choices=ApprovalPolicy.choices, required=False)
    approval_thresholds = ApprovalThresholdsField(required=False)
    compute_target = serializers.CharField(
        max_length=64,
        required=False,
        validators=[RegexValidator(r"^[a-z0-9][a-z0-9-]*$", "Use a compute target's name.")],
    )
    adhoc_jobs = serializers.BooleanField(
        required=False, help_text="Accept jobs submitted with a spec instead of a template"
    )


class WorkspaceOutput(serializers.ModelSerializer):
    organization = serializers.CharField(source="organization.slug")

    class Meta:
        model = Workspace
        fields = [
            "id",
            "organization",
            "slug",
            "name",
            "description",
            "approval_policy",
            "approval_thresholds",
            "compute_target",
            "adhoc_jobs",
            "archived_at",
            "created_at",
        ]


class MemberCreateInput(StrictSerializer):
    email = serializers.EmailField()
    role = serializers.ChoiceField(choices=WorkspaceRole.choices)


class MemberUpdateInput(StrictSerializer):
    role = serializers.ChoiceField(choices=WorkspaceRole.choices)


class MemberOutput(serializers.ModelSerializer):
    user_id = serializers.IntegerField(source="user.id")
    email = serializers.EmailField(source="user.email")

    class Meta:
        model = WorkspaceMembership
        fields = ["id", "user_id", "email", "role", "created_at"]


# --- compute targets ---------------------------------------------------------------------------


class LocalTargetConfig(StrictSerializer):
    start_timeout_seconds = serializers.IntegerField(min_value=10, max_value=1800, required=False)
    object_store_memory_bytes = serializers.IntegerField(
        min_value=78643200, max_value=1 << 40, required=False
    )
    egress_allow = serializers.ListField(
        child=serializers.CharField(max_length=64),
        max_length=64,
        required=False,
        help_text="Networks (CIDR) this target's jobs may reach beyond the public internet, "
        "e.g. a package mirror; within MANTA_LOCAL_EGRESS_ALLOWABLE",
    )

    def validate_egress_allow(self, value: list[str]) -> list[str]:
        allowable = [ipaddress.ip_network(n) for n in settings.MANTA_LOCAL_EGRESS_ALLOWABLE]
        try:
            networks = egress_policy.parse_networks(value, field="egress_allow")
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from exc
        problems = [p for n in networks if (p := egress_policy.allow_problem(n, allowable))]
        if problems:
            raise serializers.ValidationError(problems)
        return [str(n) for n in networks]


class RayTargetConfig(StrictSerializer):
    address = serializers.RegexField(
        r"^https?://[^\s/]+(:\d+)?/?$", help_text="The Ray dashboard, e.g. http://ray-head:8265"
    )
    token = serializers.CharField(
        required=False, write_only=True, max_length=4096, help_text="Stored encrypted"
    )

    def validate_address(self, value: str) -> str:
        try:
            ssrf.check_compute_address(value, settings.MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS)
        except ssrf.UnsafeURL as exc:
            raise serializers.ValidationError(str(exc)) from exc
        return value


# Kubernetes label keys ([prefix/]name) and values, as the API server checks them.
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MAX_TARGET_FLAVORS = 16


class GpuFlavorConfig(StrictSerializer):
    count = serializers.IntegerField(
        min_value=0, max_value=100_000, help_text="How many GPUs of this flavor the cluster has"
    )
    node_labels = serializers.DictField(
        child=serializers.CharField(max_length=63, allow_blank=True),
        help_text="The labels of this flavor's nodes, e.g. "
        '{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}: its GPU pods\' nodeSelector',
    )

    def validate_node_labels(self, value: dict[str, str]) -> dict[str, str]:
        if not value:
            raise serializers.ValidationError(
                "at least one label: without one, the flavor's pods could land on any GPU node"
            )
        for key, label in value.items():
            prefix, slash, name = key.rpartition("/")
            if not _LABEL_NAME.match(name) or (
                slash and (len(prefix) > 253 or not _LABEL_PREFIX.match(prefix))
            ):
                raise serializers.ValidationError(f"{key!r} is not a Kubernetes label key")
            if label and not _LABEL_NAME.match(label):
                raise serializers.ValidationError(
                    f"{key}: {label!r} is not a Kubernetes label value"
                )
        return value


def validate_gpu_flavors(value: dict[str, dict]) -> dict[str, dict]:
    """Flavor names by the rule, at most MAX_TARGET_FLAVORS, and no two flavors on the same
    nodes (their jobs would share them)."""
    if len(value) > MAX_TARGET_FLAVORS:
        raise serializers.ValidationError(f"at most {MAX_TARGET_FLAVORS} flavors")
    bad = {name: [problem] for name in value if (problem := flavor_problem(name))}
    if bad:
        raise serializers.ValidationError(bad)
    seen: dict[tuple, str] = {}
    for name, flavor in value.items():
        labels = tuple(sorted(flavor["node_labels"].items()))
        if labels in seen:
            raise serializers.ValidationError(
                {name: [f"node_labels are those of {seen[labels]}: a flavor's nodes are its own"]}
            )
        seen[labels] = name
    return value


class KubeRayTargetConfig(StrictSerializer):
    namespace_pattern = serializers.CharField(
        max_length=100, required=False, default="manta-{workspace}"
    )
    kubeconfig = serializers.CharField(
        required=False,
        write_only=True,
        max_length=200_000,
        help_text="kubeconfig YAML; stored encrypted",
    )
    context = serializers.CharField(required=False, max_length=200)
    in_cluster = serializers.BooleanField(required=False, default=False)
    gpu_flavors = serializers.DictField(
        child=GpuFlavorConfig(),
        required=False,
        help_text="The GPU flavors the cluster has, in the order a job that names none tries "
        'them: {"h100": {"count": 8, "node_labels": {...}}}',
    )

    def validate_gpu_flavors(self, value: dict[str, dict]) -> dict[str, dict]:
        return validate_gpu_flavors(value)

    def validate_kubeconfig(self, value: str) -> str:
        try:
            found = kubeconfig.problems(kubeconfig.load(value))
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from exc
        if found:
            raise serializers.ValidationError(found)
        return value

    def validate_in_cluster(self, value: bool) -> bool:
        if value and not settings.MANTA_KUBERAY_IN_CLUSTER:
            raise serializers.ValidationError(
                "in_cluster would use the platform's own service account; only where the "
                "deployment allows it (MANTA_KUBERAY_IN_CLUSTER=true)"
            )
        return value

    def validate(self, attrs):
        if not attrs.get("in_cluster") and not attrs.get("kubeconfig"):
            raise serializers.ValidationError(
                {"kubeconfig": ["required unless in_cluster is true"]}
            )
        return attrs


TARGET_CONFIGS = {
    "local": LocalTargetConfig,
    "ray": RayTargetConfig,
    "kuberay": KubeRayTargetConfig,
}


def validate_target_config(kind: str, config) -> dict:
    serializer = TARGET_CONFIGS[kind](data=config)
    if not isinstance(config, dict):
        raise serializers.ValidationError({"config": ["must be an object"]})
    if not serializer.is_valid():
        raise serializers.ValidationError({"config": serializer.errors})
    return dict(serializer.validated_data)


class ComputeTargetCreateInput(StrictSerializer):
    name = serializers.CharField(max_length=64, validators=[slug_validator])
    kind = serializers.ChoiceField(choices=ComputeTargetKind.choices)
    config = serializers.DictField(required=False, default=dict)

    def validate(self, attrs):
        attrs["config"] = validate_target_config(attrs["kind"], attrs["config"])
        return attrs


class ComputeTargetUpdateInput(StrictSerializer):
    config = serializers.DictField()


class ComputeTargetOutput(serializers.ModelSerializer):
    config = serializers.JSONField(help_text="Without secrets")
    secrets = serializers.SerializerMethodField(help_text="Which secrets are stored (not values)")

    class Meta:
        model = ComputeTarget
        fields = ["id", "name", "kind", "config", "secrets", "created_at", "updated_at"]

    def get_secrets(self, target) -> list[str]:
        from workspaces.compute_targets import compute_target_secrets

        return sorted(compute_target_secrets(target)) if target.secret_encrypted else []
