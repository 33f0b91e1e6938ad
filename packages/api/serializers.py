from rest_framework import serializers

from config.strict import StrictSerializer
from packages.models import CodePackage, CodeSource


class PackageOutput(serializers.ModelSerializer):
    uri = serializers.CharField(
        read_only=True, help_text="Put it in runtime_env.working_dir to run this code"
    )
    # null when no user uploaded it (fetched from a code source) or the user was deleted
    uploaded_by = serializers.SlugRelatedField(slug_field="email", read_only=True, allow_null=True)

    class Meta:
        model = CodePackage
        fields = ["sha256", "size", "uri", "uploaded_by", "created_at", "last_used_at"]


class CodeSourceOutput(serializers.ModelSerializer):
    has_deploy_key = serializers.BooleanField(read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="email", read_only=True, allow_null=True)

    class Meta:
        model = CodeSource
        fields = [
            "name",
            "url",
            "default_ref",
            "has_deploy_key",
            "known_hosts",
            "created_by",
            "created_at",
            "updated_at",
        ]


class CodeSourceCreateInput(StrictSerializer):
    name = serializers.SlugField(max_length=63)
    url = serializers.CharField(
        max_length=500,
        help_text="https:// or ssh://git@host/path (git:// and http:// where the operator "
        "allows them); it must pass the same network policy as webhooks",
    )
    default_ref = serializers.CharField(max_length=255, required=False, default="main")
    deploy_key = serializers.CharField(
        required=False,
        allow_blank=True,
        write_only=True,
        trim_whitespace=False,
        help_text="An SSH private key with read access; stored encrypted, never shown again",
    )
    known_hosts = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="known_hosts lines of the server, checked for ssh:// URLs",
    )


class CodeSourceUpdateInput(CodeSourceCreateInput):
    name = None
    url = serializers.CharField(max_length=500, required=False)
    default_ref = serializers.CharField(max_length=255, required=False)
