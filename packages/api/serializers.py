from rest_framework import serializers

from packages.models import CodePackage


class PackageOutput(serializers.ModelSerializer):
    uri = serializers.CharField(
        read_only=True, help_text="Put it in runtime_env.working_dir to run this code"
    )
    uploaded_by = serializers.SlugRelatedField(slug_field="email", read_only=True)

    class Meta:
        model = CodePackage
        fields = ["sha256", "size", "uri", "uploaded_by", "created_at", "last_used_at"]
