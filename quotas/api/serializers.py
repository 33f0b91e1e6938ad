from rest_framework import serializers
from rest_framework.fields import empty

from config.gpu_flavors import flavor_problem
from config.strict import ReplaceMixin, StrictModelSerializer, StrictSerializer
from quotas.flavors import normalised_group_quota, normalised_workspace_quota
from quotas.models import RESOURCES, OrgQuota, QuotaGroup, WorkspaceQuota

AMOUNT = {"min_value": 0, "max_value": 1_000_000, "required": False, "allow_null": True}
# A quota nobody has set yet is the default one, not a row: it was never updated.
UPDATED_AT = {"read_only": True, "allow_null": True, "help_text": "null until first set"}


def _check_flavor_names(value: dict) -> dict:
    bad = {name: [problem] for name in value if (problem := flavor_problem(name))}
    if bad:
        raise serializers.ValidationError(bad)
    return value


class FlavorQuota(StrictSerializer):
    """A workspace's quota of one GPU flavor."""

    guaranteed = serializers.FloatField(min_value=0, max_value=1_000_000, required=False)
    limit = serializers.FloatField(
        **AMOUNT, help_text="null = up to the limit of the flavor above it"
    )
    lending_limit = serializers.FloatField(
        **AMOUNT,
        help_text="How much of its guarantee of the flavor it lends while idle; absent or "
        "null = none (the whole guarantee is kept for it)",
    )
    gpu_hours_per_month = serializers.FloatField(
        **AMOUNT, help_text="GPU-hour budget of the flavor per month; null = none"
    )

    def validate(self, attrs):
        guaranteed, limit = attrs.get("guaranteed", 0), attrs.get("limit")
        lending = attrs.get("lending_limit")
        if limit is not None and guaranteed > limit:
            raise serializers.ValidationError(
                {"guaranteed": [f"guaranteed {guaranteed:g} is above the limit {limit:g}"]}
            )
        if lending is not None and lending > guaranteed:
            raise serializers.ValidationError(
                {
                    "lending_limit": [
                        f"lending limit {lending:g} is above the guarantee {guaranteed:g}: a "
                        "node lends at most what it is guaranteed"
                    ]
                }
            )
        return attrs


class GroupFlavorQuota(FlavorQuota):
    """A quota group's quota of one GPU flavor."""

    gpu_hours_per_month = None  # budgets are a workspace's
    lending_limit = serializers.FloatField(
        **AMOUNT,
        help_text="How much of its guarantee of the flavor it lends while idle; null = all "
        "of it (as for the totals)",
    )


class _ReplaceKeepsFlavorsOptional:
    # A PUT without gpu_flavors replaces them with none: the field predates no client.
    def get_fields(self):
        fields = super().get_fields()
        fields["gpu_flavors"].required = False
        fields["gpu_flavors"].default = dict
        return fields


class OrgQuotaSerializer(StrictModelSerializer):
    cpu = serializers.FloatField(**AMOUNT, help_text="Capacity; null = unlimited")
    memory_gb = serializers.FloatField(**AMOUNT)
    gpu = serializers.FloatField(**AMOUNT)
    disk_gb = serializers.FloatField(
        **AMOUNT, help_text="Nodes' writable storage; null = unlimited"
    )
    gpu_flavors = serializers.DictField(
        child=serializers.FloatField(min_value=0, max_value=1_000_000),
        required=False,
        help_text='Capacity per GPU flavor, e.g. {"h100": 8}; a flavor not named has no cap '
        "of its own (gpu caps them all)",
    )
    updated_at = serializers.DateTimeField(**UPDATED_AT)

    def validate_gpu_flavors(self, value: dict) -> dict:
        return _check_flavor_names(value)

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
            "fair_share_preemption",
            "gpu_flavors",
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
    gpu_flavors = serializers.DictField(
        child=FlavorQuota(),
        required=False,
        help_text="Guaranteed, limit, lending limit and monthly GPU-hour budget per GPU "
        'flavor, e.g. {"h100": {"guaranteed": 2, "limit": 4, "gpu_hours_per_month": 100}}',
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
            "gpu_flavors",
            "group",
            "lending_limit_cpu",
            "lending_limit_memory_gb",
            "lending_limit_gpu",
            "lending_limit_disk_gb",
            "updated_at",
        ]

    def validate_gpu_flavors(self, value: dict) -> dict:
        return normalised_workspace_quota(_check_flavor_names(value))

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
    gpu_flavors = serializers.DictField(
        child=GroupFlavorQuota(),
        required=False,
        help_text='Guaranteed, limit and lending limit per GPU flavor, e.g. {"h100": '
        '{"guaranteed": 4, "limit": 8, "lending_limit": 2}}; within its totals',
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
            "gpu_flavors",
            "created_at",
            "updated_at",
        ]  # fmt: skip
        read_only_fields = ["id", "created_at", "updated_at"]

    def validate_fair_share_weight(self, value: float) -> float:
        return _positive_weight(value)

    def validate_gpu_flavors(self, value: dict) -> dict:
        return normalised_group_quota(_check_flavor_names(value))


class NodeAmounts(serializers.Serializer):
    cpu = serializers.FloatField(allow_null=True)
    memory_gb = serializers.FloatField(allow_null=True)
    gpu = serializers.FloatField(allow_null=True)
    disk_gb = serializers.FloatField(allow_null=True)


class NodeFlavor(serializers.Serializer):
    """One node's quota and usage of one GPU flavor (the organisation's guaranteed and limit:
    its capacity of it)."""

    guaranteed = serializers.FloatField(allow_null=True)
    limit = serializers.FloatField(allow_null=True, help_text="null: no limit of its own")
    lending_limit = serializers.FloatField(
        allow_null=True, help_text="What it lends of its guarantee while idle; null: all of it"
    )
    usage = serializers.FloatField(help_text="Held by the jobs of its subtree")
    borrowed = serializers.FloatField(help_text="Held beyond its guarantee")


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
    gpu_flavors = serializers.DictField(
        child=NodeFlavor(),
        help_text="Per GPU flavor the tree has a quota of or holds: its quota and usage",
    )
    children = serializers.ListField(
        child=serializers.DictField(), help_text="Its groups and workspaces, each a node"
    )


class OrgQuotaReplaceInput(_ReplaceKeepsFlavorsOptional, ReplaceMixin, OrgQuotaSerializer):
    """A PUT body: the whole quota, null where unlimited (fair_share_preemption, newer than
    the other fields, is false when not given)."""

    def get_fields(self):
        fields = super().get_fields()
        fields["fair_share_preemption"].required = False
        fields["fair_share_preemption"].default = False
        return fields


class _ReplaceKeepsTreePlace:
    # A PUT that does not name the workspace's group or lending limits keeps them: a client
    # written before the quota tree must not move a workspace out of its group by omission.
    def get_fields(self):
        fields = super().get_fields()
        for name in ("group", *(f"lending_limit_{r}" for r in RESOURCES)):
            fields[name].required = False
            fields[name].default = empty
        return fields


class WorkspaceQuotaReplaceInput(
    _ReplaceKeepsTreePlace, _ReplaceKeepsFlavorsOptional, ReplaceMixin, WorkspaceQuotaSerializer
):
    """A PUT body: the whole quota, null where unlimited (its place in the quota tree and its
    lending limits are kept when not given)."""


class ResourceAmounts(serializers.Serializer):
    cpu = serializers.FloatField(allow_null=True)
    memory_gb = serializers.FloatField(allow_null=True)
    gpu = serializers.FloatField(allow_null=True)
    disk_gb = serializers.FloatField(allow_null=True)


class FlavorUsage(serializers.Serializer):
    reserved = serializers.FloatField()
    guaranteed = serializers.FloatField()
    limit = serializers.FloatField(allow_null=True)
    gpu_hours_this_month = serializers.FloatField()
    gpu_hours_per_month = serializers.FloatField(
        allow_null=True, help_text="The flavor's monthly GPU-hour budget; null = none"
    )


class UsageOutput(serializers.Serializer):
    gpu_flavors = serializers.DictField(
        child=FlavorUsage(),
        help_text="Per GPU flavor the workspace has a quota of, holds or used this month",
    )
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
