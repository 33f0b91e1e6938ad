from django.core.validators import RegexValidator
from rest_framework import serializers

from workspaces.models import (
    ApiToken,
    ApprovalPolicy,
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


class TokenCreateInput(serializers.Serializer):
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
        fields = ["id", "slug", "name", "allowed_image_prefixes", "created_at", "role"]

    def get_role(self, org) -> str:
        return self.context.get("roles", {}).get(org.pk, "")


class OrgUpdateInput(serializers.Serializer):
    name = serializers.CharField(required=False, max_length=200)
    allowed_image_prefixes = serializers.ListField(
        child=serializers.CharField(max_length=200, min_length=1),
        required=False,
        max_length=50,
        help_text="A template's image must start with one of these.",
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
    notification_preferences = serializers.DictField()


class OrgUserCreateInput(serializers.Serializer):
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

THRESHOLD_KEYS = ("gpu", "cpu", "memory_gb", "max_runtime_seconds")


class ApprovalThresholdsField(serializers.DictField):
    child = serializers.FloatField(min_value=0)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        unknown = sorted(set(value) - set(THRESHOLD_KEYS))
        if unknown:
            raise serializers.ValidationError(
                f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(THRESHOLD_KEYS)}"
            )
        return value


class WorkspaceCreateInput(serializers.Serializer):
    slug = serializers.CharField(max_length=40, validators=[slug_validator])
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    description = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, default=""
    )


class WorkspaceUpdateInput(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    approval_policy = serializers.ChoiceField(choices=ApprovalPolicy.choices, required=False)
    approval_thresholds = ApprovalThresholdsField(required=False)
    compute_target = serializers.CharField(
        max_length=64,
        required=False,
        validators=[RegexValidator(r"^[a-z0-9][a-z0-9-]*$", "Use a compute target's name.")],
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
            "archived_at",
            "created_at",
        ]


class MemberCreateInput(serializers.Serializer):
    email = serializers.EmailField()
    role = serializers.ChoiceField(choices=WorkspaceRole.choices)


class MemberUpdateInput(serializers.Serializer):
    role = serializers.ChoiceField(choices=WorkspaceRole.choices)


class MemberOutput(serializers.ModelSerializer):
    user_id = serializers.IntegerField(source="user.id")
    email = serializers.EmailField(source="user.email")

    class Meta:
        model = WorkspaceMembership
        fields = ["id", "user_id", "email", "role", "created_at"]
