"""Code packages of a workspace: upload a zip of a working directory, look one up."""

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, permissions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from config.throttles import PackageUploadThrottle, ThrottledViewMixin
from packages import services
from packages.models import CodePackage
from workspaces import roles
from workspaces.api.tenancy import WorkspaceViewSet

from .serializers import PackageOutput

ZIP_TYPES = ("application/zip", "application/octet-stream", "application/x-zip-compressed")


class PackageViewSet(ThrottledViewMixin, WorkspaceViewSet):
    queryset = CodePackage.objects.none()
    workspace_field = "workspace"
    lookup_field = "sha256"
    # Only a sha256 can name a package; anything else (a NUL, a path) is not looked up.
    lookup_value_regex = r"[0-9a-f]{64}"
    not_found_message = "No such package in this workspace."
    serializer_class = PackageOutput
    throttle_map = {"create": [PackageUploadThrottle]}
    permission_map = {
        "list": roles.WS_VIEW,
        "retrieve": roles.WS_VIEW,
        "create": roles.WS_SUBMIT_JOB,
    }

    def base_queryset(self):
        return CodePackage.objects.select_related("uploaded_by")

    @extend_schema(operation_id="packages_list")
    def list(self, request, org=None, ws=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(PackageOutput(page, many=True).data)

    @extend_schema(operation_id="package_retrieve")
    def retrieve(self, request, org=None, ws=None, sha256=None):
        return Response(PackageOutput(self.get_object()).data)

    @extend_schema(
        operation_id="packages_upload",
        # The body is the zip's bytes, streamed. The view also takes application/zip and
        # application/x-zip-compressed (ZIP_TYPES); the schema names the generic binary type,
        # which client generators send as raw bytes (openapi-python-client skips an operation
        # whose only body type it does not know, such as application/zip).
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={
            201: PackageOutput,
            200: OpenApiResponse(PackageOutput, description="This content was uploaded before"),
            413: OpenApiResponse(description="Larger than MANTA_PACKAGE_MAX_BYTES"),
        },
        description="The body is a zip of a working directory, sent as raw bytes with "
        "Content-Type application/octet-stream (application/zip and "
        "application/x-zip-compressed are taken too): paths relative to it, no `..`, "
        f"no absolute paths, no links, at most {services.MAX_ENTRIES} entries, at most "
        "MANTA_PACKAGE_MAX_BYTES (default 100 MiB). New content must fit the workspace's "
        "package storage (MANTA_PACKAGE_STORAGE_GB, MANTA_PACKAGE_STORAGE_COUNT): otherwise "
        "409 `package_storage_exceeded`; content the workspace holds already answers 200 "
        "whatever it uses. Uploads per user are throttled (MANTA_THROTTLE_PACKAGE_UPLOAD): "
        "429 `throttled` with Retry-After.",
    )
    def create(self, request, org=None, ws=None):
        kind = (request.content_type or "").split(";")[0].strip()
        if kind not in ZIP_TYPES:
            raise exceptions.UnsupportedMediaType(
                kind, detail=f"send the zip as the body with Content-Type: {ZIP_TYPES[0]}"
            )
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0) or None
        except ValueError:
            length = None
        # The raw stream: the body is never read into memory as a whole.
        package, created = services.package_upload(
            actor=self.actor, workspace=self.workspace, stream=request._request, length=length
        )
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(PackageOutput(package).data, status=code)


class PackageDownloadView(APIView):
    """A package's zip behind a short-lived signed link (handed to clusters that download code
    themselves, such as a RayJob's). The link is the credential: no token."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]

    @extend_schema(
        operation_id="package_download",
        auth=[],
        # Served as application/zip; listed as application/octet-stream too, so that client
        # generators that know only the generic binary type return the bytes.
        responses={
            (200, "application/zip"): OpenApiTypes.BINARY,
            (200, "application/octet-stream"): OpenApiTypes.BINARY,
        },
        description="The package's zip (served as application/zip). 404 for a link Manta did "
        "not sign, one that expired, or deleted content.",
    )
    def get(self, request, token=None):
        blob = services.download_open(token)
        if blob is None:
            raise exceptions.NotFound("No such package link, or it expired.")
        return FileResponse(blob, content_type="application/zip", filename="package.zip")
