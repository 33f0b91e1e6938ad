"""The caller's own account: who they are and their email preferences (``me/``), and their
personal access tokens (``auth/tokens/``). Views only translate: parse, call one service, render."""

from django.contrib.auth import authenticate
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.context import Actor
from config import strict
from config.errors import InvalidCredentials
from config.throttles import (
    LoginAccountThrottle,
    LoginIPThrottle,
    ThrottledViewMixin,
    TokenIssueThrottle,
)
from workspaces import identity, selectors
from workspaces.models import ApiToken, OrgMembership

from . import serializers as s
from .tenancy import object_or_404


class TokenViewSet(ThrottledViewMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """Personal access tokens. Create with email + password; list and revoke with a token."""

    serializer_class = s.TokenOutput
    queryset = ApiToken.objects.none()
    throttle_map = {"create": [LoginIPThrottle, LoginAccountThrottle, TokenIssueThrottle]}

    def get_permissions(self):
        return [AllowAny()] if self.action == "create" else [IsAuthenticated()]

    def get_authenticators(self):
        # Creating a token needs only the credentials in the body; a stale Authorization header
        # must not get in the way.
        if self.request is not None and self.request.method == "POST":
            return []
        return super().get_authenticators()

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        return selectors.tokens_of(self.request.user)

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        strict.refuse_unexpected_body(request, self)

    @extend_schema(
        operation_id="auth_token_create",
        request=s.TokenCreateInput,
        responses={201: s.TokenCreatedOutput},
        auth=[],
        examples=[
            OpenApiExample(
                "Issue a token",
                value={
                    "email": "dev@acme.test",
                    "password": "…",
                    "name": "ci",
                    "expires_in_days": 30,
                },
                request_only=True,
            )
        ],
    )
    def create(self, request):
        data = s.TokenCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        user = authenticate(
            request, email=data.validated_data["email"], password=data.validated_data["password"]
        )
        if user is None:
            raise InvalidCredentials("invalid email or password")
        token, secret = identity.token_create(
            actor=Actor.for_user(user),
            user=user,
            name=data.validated_data["name"],
            expires_in_days=data.validated_data["expires_in_days"],
        )
        token.token = secret
        return Response(s.TokenCreatedOutput(token).data, status=status.HTTP_201_CREATED)

    @extend_schema(operation_id="auth_token_list")
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def get_object(self):
        # The caller's own tokens are the whole queryset: someone else's token does not exist.
        return object_or_404(self.get_queryset(), "No such token.", pk=self.kwargs["pk"])

    @extend_schema(operation_id="auth_token_revoke", responses={204: None})
    def destroy(self, request, pk=None):
        identity.token_revoke(actor=Actor.from_request(request), token=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class MeView(APIView):
    """The caller."""

    @extend_schema(operation_id="me_retrieve", responses=s.MeOutput)
    def get(self, request):
        return Response(self._render(request.user))

    @extend_schema(
        operation_id="me_update",
        request=s.MeUpdateInput,
        responses=s.MeOutput,
        description="Turn email notification categories on or off (absent ones keep their "
        "setting).",
    )
    def patch(self, request):
        data = s.MeUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        if "notification_preferences" in data.validated_data:
            identity.notification_preferences_update(
                actor=Actor.from_request(request),
                user=request.user,
                preferences=data.validated_data["notification_preferences"],
            )
            request.user.refresh_from_db()
        return Response(self._render(request.user))

    def _render(self, user) -> dict:
        memberships = OrgMembership.objects.filter(user=user).select_related("organization")
        body = {
            "id": user.pk,
            "email": user.email,
            "full_name": user.full_name,
            "organizations": [
                {"slug": m.organization.slug, "name": m.organization.name, "role": m.role}
                for m in memberships.order_by("organization_id")
            ],
            "notification_preferences": selectors.notification_preferences_of(user),
        }
        return s.MeOutput(body).data
