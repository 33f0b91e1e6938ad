"""The benchmark's baseline: the API's URLs plus one bare DRF endpoint that validates a body and
inserts a row (no authentication, tenancy, throttles, audit or outbox), served by the same
settings and server as the job POST. Only bench/submit.py serves it (bench/submit_settings.py):
it is not among the production URLs."""

from django.urls import path
from rest_framework import permissions, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from config.urls import urlpatterns as api_urlpatterns
from outbox.models import DomainEvent


class BareInput(serializers.Serializer):
    organization = serializers.IntegerField(min_value=1)
    name = serializers.CharField(max_length=100)


class BareInsert(APIView):
    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]
    throttle_classes: list = []

    def post(self, request):
        data = BareInput(data=request.data)
        data.is_valid(raise_exception=True)
        row = DomainEvent.objects.create(
            type="bench.bare",
            organization_id=data.validated_data["organization"],
            payload={"name": data.validated_data["name"]},
            dispatched_at="2000-01-01T00:00:00Z",  # nothing to send
        )
        return Response({"id": str(row.pk)}, status=201)


urlpatterns = [*api_urlpatterns, path("bench/bare/", BareInsert.as_view())]
