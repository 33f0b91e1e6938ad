from rest_framework import serializers

from config.strict import ReplaceMixin, StrictModelSerializer
from quotas.models import RESOURCES, OrgQuota, QuotaGroup, WorkspaceQuota

AMOUNT = {"min_value": 0, "max_value": 1_000_000, "required": False, "allow_null": True}
# A quota nobody has set yet is the default one, not a row: it was never updated.
UPDATED_AT = {"read_only": True, "allow_null": True, "help_text": "null until first set"}


class OrgQuotaSerializer(StrictModelSerializer):
    cpu = serializers.FloatField(**AMOUNT, help_text="Capacity; null = unlimited")
    memory_gb = serializers.FloatField(**AMOUNT)
    gpu = serializers.FloatField(**AMOUNT)
    disk_gb = serializers.FloatField(
        **AMOUNT, help_text="Nodes' writable storage; null = unlimited"
    )
    updated_at = serializers.DateTimeField(**UPDATED_AT)

    class Meta:
        model = OrgQuota
        fields = [
            "cpu",
            "memory_gb",
            "gpu",
            "disk_gb",
            "max_running_jobs",
            "policy",
            "balanced_max_wait_seconds",
            "preemption",
            "updated_at",
        ]


class GroupName(serializers.CharField):
    """A quota group of the organisation in the serializer's context, given by its name (null:
    the organisation itself); a name it has no group of is a 400 naming the field."""

    def __init__(self, **kwargs):
        super().__init__(allow_null=True, required=False, **kwargs)

    def run_validators(self, value):
        """Nothing more to check: :meth:`to_internal_value` found the group."""

    def to_internal_value(self, data):
        name = super().to_internal_value(data)
        if len(name) > 64:
            raise serializers.ValidationError("a quota group's name has at most 64 characters")
        group = QuotaGroup.objects.filter(
            organization=self.context["organization"], name=name
        ).first()
        if group is None:
            raise serializers.ValidationError(f"the organisation has no quota group '{name}'")
        return group

    def to_representation(self, value):
        return value.name if isinstance(value, QuotaGroup) else value


LENDING = {
    **AMOUNT,
    "help_text": "How much of its guarantee it lends out while idle; null = all of it",
}


class WorkspaceQuotaSerializer(StrictModelSerializer):
    guaranteed_cpu = serializers.FloatField(min_value=0, max_value=1_000_000, required=False)
    guaranteed_memory_gb = serializers.FloatField(min_value=0, max_value=1_000_000, required=False)
    guaranteed_gpu = serializers.FloatField(min_value=0, max_value=1_000_000, required=False)
    guaranteed_disk_gb = serializers.FloatField(min_value=0, max_value=1_000_000, required=False)
    limit_cpu = serializers.FloatField(**AMOUNT, help_text="null = up to the org's capacity")
    limit_memory_gb = serializers.FloatField(**AMOUNT)
    limit_gpu = serializers.FloatField(**AMOUNT)
    limit_disk_gb = serializers.FloatField(**AMOUNT)
    gpu_hours_per_month = serializers.FloatField(**AMOUNT)
    fair_share_weight = serializers.FloatField(
        max_value=1_000_000,
        required=False,
        help_text="Under fair_share, its share (now and past) is divided by this; more than 0",
    )
    group = GroupName(help_text="Its quota group; null = directly under the organisation")
    lending_limit_cpu = serializers.FloatField(**LENDING)
    lending_limit_memory_gb = serializers.FloatField(**LENDING)
    lending_limit_gpu = serializers.FloatField(**LENDING)
    lending_limit_disk_gb = serializers.FloatField(**LENDING)
    updated_at = serializers.DateTimeField(**UPDATED_AT)

    class Meta:
        model = WorkspaceQuota
        fields = [
            "guaranteed_cpu",
            "guaranteed_memory_gb",
            "guaranteed_gpu",
            "guaranteed_disk_gb",
            "limit_cpu",
            "limit_memory_gb",
            "limit_gpu",
            "limit_disk_gb",
            "max_running_jobs",
            "max_queued_jobs",
            "gpu_hours_per_month",
            "budget_action",
            "fair_share_weight",
            "group",
            "lending_limit_cpu",
            "lending_limit_memory_gb",
            "lending_limit_gpu",
            "lending_limit_disk_gb",
            "updated_at",
        ]

    def validate_fair_share_weight(self, value: float) -> float:
        if not value > 0:  # a weight of 0 would divide by 0; a negative one would invert the order
            raise serializers.ValidationError(f"must be greater than 0, not {value:g}")
        return value


def _positive_weight(value: float) -> float:
    if not value > 0:  # a weight of 0 would divide by 0; a negative one would invert the order
        raise serializers.ValidationError(f"must be greater than 0, not {value:g}")
    return value


GUARANTEED = {"min_value": 0, "max_value": 1_000_000, "required": False}


class QuotaGroupSerializer(StrictModelSerializer):
    """A node of the quota tree between the organisation and its workspaces."""

    name = serializers.SlugField(max_length=64, help_text="Unique in the organisation")
    parent = GroupName(help_text="The group it is under; null = directly under the organisation")
    guaranteed_cpu = serializers.FloatField(**GUARANTEED)
    guaranteed_memory_gb = serializers.FloatField(**GUARANTEED)
    guaranteed_gpu = serializers.FloatField(**GUARANTEED)
    guaranteed_disk_gb = serializers.FloatField(**GUARANTEED)
    limit_cpu = serializers.FloatField(**AMOUNT, help_text="null = up to the limit above it")
    limit_memory_gb = serializers.FloatField(**AMOUNT)
    limit_gpu = serializers.FloatField(**AMOUNT)
    limit_disk_gb = serializers.FloatField(**AMOUNT)
    lending_limit_cpu = serializers.FloatField(**LENDING)
    lending_limit_memory_gb = serializers.FloatField(**LENDING)
    lending_limit_gpu = serializers.FloatField(**LENDING)
    lending_limit_disk_gb = serializers.FloatField(**LENDING)
    fair_share_weight = serializers.FloatField(
        max_value=1_000_000,
        required=False,
        help_text="Under fair_share, its subtree's share is divided by this among its "
        "siblings; more than 0",
    )

    class Meta:
        model = QuotaGroup
        fields = [
            "id",
            "name",
            "parent",
            *(f"{kind}_{name}" for kind in ("guaranteed", "limit", "lending_limit")
              for name in RESOURCES),
            "max_running_jobs",
            "fair_share_weight",
            "created_at",
            "updated_at",
        ]  # fmt: skip
        read_only_fields = ["id", "created_at", "updated_at"]

    def validate_fair_share_weight(self, value: float) -> float:
        return _positive_weight(value)


class NodeAmounts(serializers.Serializer):
    cpu = serializers.FloatField(allow_null=True)
    memory_gb = serializers.FloatField(allow_null=True)
    gpu = serializers.FloatField(allow_null=True)
    disk_gb = serializers.FloatField(allow_null=True)


class QuotaNodeOutput(serializers.Serializer):
    """One node of the quota tree as it stands: its quota, what its subtree holds, and how much
    of that is borrowed (held beyond its guarantee)."""

    level = serializers.ChoiceField(choices=["organization", "group", "workspace"])
    name = serializers.CharField()
    guaranteed = NodeAmounts()
    limit = NodeAmounts(help_text="null: no limit of its own")
    lending_limit = NodeAmounts(help_text="null: it lends all of its idle guarantee")
    fair_share_weight = serializers.FloatField()
    max_running_jobs = serializers.IntegerField(allow_null=True)
    usage = NodeAmounts(help_text="Held by the launching and running jobs of its subtree")
    running = serializers.IntegerField()
    borrowed = NodeAmounts(help_text="Held beyond its guarantee")
    children = serializers.ListField(
        child=serializers.DictField(), help_text="Its groups and workspaces, each a node"
    )


class OrgQuotaReplaceInput(ReplaceMixin, OrgQuotaSerializer):
    """A PUT body: the whole quota, null where unlimited."""


class WorkspaceQuotaReplaceInput(ReplaceMixin, WorkspaceQuotaSerializer):
    """A PUT body: the whole quota, null where unlimited."""


class ResourceAmounts(serializers.Serializer):
    cpu = serializers.FloatField(allow_null=True)
    memory_gb = serializers.FloatField(allow_null=True)
    gpu = serializers.FloatField(allow_null=True)
    disk_gb = serializers.FloatField(allow_null=True)


class UsageOutput(serializers.Serializer):
    reserved = ResourceAmounts()
    guaranteed = ResourceAmounts()
    limit = ResourceAmounts()
    running = serializers.IntegerField()
    queued = serializers.IntegerField()
    pending_approval = serializers.IntegerField()
    gpu_hours_this_month = serializers.FloatField()
    gpu_hours_per_month = serializers.FloatField(allow_null=True)
    preempted_gpu_hours_this_month = serializers.FloatField(
        help_text="GPU-hours this workspace's preempted attempts had run when they were stopped "
        "this month: work lost to preemption"
    )
