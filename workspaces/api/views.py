"""Identity and tenancy endpoints. Views only translate: parse, call one service, render."""

from django.contrib.auth import authenticate
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import exceptions, mixins, status, viewsets
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
from workspaces import compute_targets, identity, roles, selectors, services
from workspaces.models import (
    ApiToken,
    ComputeTarget,
    Organization,
    OrgMembership,
    Workspace,
    WorkspaceMembership,
)

from . import serializers as s
from .idempotency import IDEMPOTENCY_KEY, idempotent
from .tenancy import TenantViewSet, WorkspaceViewSet


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

    @extend_schema(operation_id="auth_token_revoke", responses={204: None})
    def destroy(self, request, pk=None):
        token = self.get_queryset().filter(pk=pk).first()
        if token is None:
            raise exceptions.NotFound("No such token.")
        identity.token_revoke(actor=Actor.from_request(request), token=token)
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


class OrgListView(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Organisations the caller belongs to."""

    serializer_class = s.OrgOutput

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Organization.objects.none()
        return selectors.orgs_visible_to(self.request.user)

    def get_serializer_context(self):
        context = super().get_serializer_context()
        if self.request and self.request.user.is_authenticated:
            context["roles"] = dict(
                OrgMembership.objects.filter(user=self.request.user).values_list(
                    "organization_id", "role"
                )
            )
        return context

    @extend_schema(operation_id="orgs_list")
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)


class OrgViewSet(TenantViewSet):
    """An organisation."""

    serializer_class = s.OrgOutput
    permission_map = {"retrieve": roles.ORG_VIEW, "partial_update": roles.ORG_MANAGE}

    def _render(self, org):
        return s.OrgOutput(org, context={"roles": {org.pk: self.org_membership.role}}).data

    @extend_schema(operation_id="org_retrieve")
    def retrieve(self, request, org=None):
        return Response(self._render(self.organization))

    @extend_schema(operation_id="org_update", request=s.OrgUpdateInput, responses=s.OrgOutput)
    def partial_update(self, request, org=None):
        data = s.OrgUpdateInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        updated = services.org_update(
            actor=self.actor, organization=self.organization, data=data.validated_data
        )
        return Response(self._render(updated))


class OrgUserViewSet(TenantViewSet):
    """Users of an organisation (org owners and admins). Accounts join by invitation."""

    serializer_class = s.OrgUserOutput
    queryset = OrgMembership.objects.none()
    permission_map = {"list": roles.ORG_MANAGE_USERS}

    def scoped_queryset(self):
        return selectors.org_users(self.organization)

    @extend_schema(operation_id="org_users_list")
    def list(self, request, org=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.OrgUserOutput(page, many=True).data)


class WorkspaceListViewSet(TenantViewSet):
    """Workspaces of an organisation."""

    serializer_class = s.WorkspaceOutput
    queryset = Workspace.objects.none()
    permission_map = {"list": roles.ORG_VIEW, "create": roles.ORG_MANAGE_WORKSPACES}

    def scoped_queryset(self):
        include = self.request.query_params.get("include_archived") in ("1", "true")
        return selectors.workspaces_visible_to(
            self.request.user, self.org_membership, include_archived=include
        )

    @extend_schema(
        operation_id="workspaces_list",
        parameters=[OpenApiParameter("include_archived", bool, description="Also archived ones")],
    )
    def list(self, request, org=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.WorkspaceOutput(page, many=True).data)

    @extend_schema(
        operation_id="workspaces_create",
        parameters=[IDEMPOTENCY_KEY],
        request=s.WorkspaceCreateInput,
        responses={201: s.WorkspaceOutput},
        examples=[
            OpenApiExample(
                "Create a workspace",
                value={"slug": "ml-research", "name": "ML research", "description": "Team A"},
                request_only=True,
            )
        ],
    )
    @idempotent
    def create(self, request, org=None):
        data = s.WorkspaceCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        workspace = services.workspace_create(
            actor=self.actor, organization=self.organization, **data.validated_data
        )
        return Response(s.WorkspaceOutput(workspace).data, status=status.HTTP_201_CREATED)


class WorkspaceDetailViewSet(WorkspaceViewSet):
    """One workspace; DELETE archives it."""

    serializer_class = s.WorkspaceOutput
    permission_map = {
        "retrieve": roles.WS_VIEW,
        "partial_update": roles.WS_MANAGE,
        "destroy": roles.ORG_MANAGE_WORKSPACES,
    }

    @extend_schema(operation_id="workspace_retrieve")
    def retrieve(self, request, org=None, ws=None):
        return Response(s.WorkspaceOutput(self.workspace).data)

    @extend_schema(
        operation_id="workspace_update", request=s.WorkspaceUpdateInput, responses=s.WorkspaceOutput
    )
    def partial_update(self, request, org=None, ws=None):
        data = s.WorkspaceUpdateInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        workspace = services.workspace_update(
            actor=self.actor, workspace=self.workspace, data=data.validated_data
        )
        return Response(s.WorkspaceOutput(workspace).data)

    @extend_schema(operation_id="workspace_archive", responses={204: None})
    def destroy(self, request, org=None, ws=None):
        services.workspace_archive(actor=self.actor, workspace=self.workspace)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MemberViewSet(WorkspaceViewSet):
    """Role grants on a workspace."""

    serializer_class = s.MemberOutput
    queryset = WorkspaceMembership.objects.none()
    permission_map = {
        "list": roles.WS_VIEW,
        "create": roles.WS_MANAGE_MEMBERS,
        "partial_update": roles.WS_MANAGE_MEMBERS,
        "destroy": roles.WS_MANAGE_MEMBERS,
    }

    def scoped_queryset(self):
        return selectors.workspace_members(self.workspace)

    def _membership(self, pk) -> WorkspaceMembership:
        membership = self.get_queryset().filter(pk=pk).first()
        if membership is None:
            raise exceptions.NotFound("No such member.")
        return membership

    @extend_schema(operation_id="workspace_members_list")
    def list(self, request, org=None, ws=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.MemberOutput(page, many=True).data)

    @extend_schema(
        operation_id="workspace_members_create",
        parameters=[IDEMPOTENCY_KEY],
        request=s.MemberCreateInput,
        responses={201: s.MemberOutput},
    )
    @idempotent
    def create(self, request, org=None, ws=None):
        data = s.MemberCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.member_add(
            actor=self.actor, workspace=self.workspace, **data.validated_data
        )
        return Response(s.MemberOutput(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        operation_id="workspace_members_update",
        request=s.MemberUpdateInput,
        responses=s.MemberOutput,
    )
    def partial_update(self, request, org=None, ws=None, pk=None):
        data = s.MemberUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.member_update(
            actor=self.actor, membership=self._membership(pk), role=data.validated_data["role"]
        )
        return Response(s.MemberOutput(membership).data)

    @extend_schema(operation_id="workspace_members_remove", responses={204: None})
    def destroy(self, request, org=None, ws=None, pk=None):
        services.member_remove(actor=self.actor, membership=self._membership(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class ComputeTargetViewSet(TenantViewSet):
    """Where an organisation's jobs run (``local`` exists implicitly in every org)."""

    serializer_class = s.ComputeTargetOutput
    queryset = ComputeTarget.objects.none()
    permission_map = {
        "list": roles.ORG_VIEW,
        "retrieve": roles.ORG_VIEW,
        "create": roles.ORG_MANAGE,
        "partial_update": roles.ORG_MANAGE,
        "destroy": roles.ORG_MANAGE,
    }

    def scoped_queryset(self):
        return ComputeTarget.objects.filter(organization=self.organization).order_by("id")

    def _target(self, pk) -> ComputeTarget:
        target = self.get_queryset().filter(pk=pk).first()
        if target is None:
            raise exceptions.NotFound("No such compute target.")
        return target

    @extend_schema(operation_id="compute_targets_list")
    def list(self, request, org=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.ComputeTargetOutput(page, many=True).data)

    @extend_schema(
        operation_id="compute_targets_create",
        parameters=[IDEMPOTENCY_KEY],
        request=s.ComputeTargetCreateInput,
        responses={201: s.ComputeTargetOutput},
        examples=[
            OpenApiExample(
                "An existing Ray cluster",
                value={
                    "name": "shared-ray",
                    "kind": "ray",
                    "config": {"address": "http://127.0.0.1:8265", "token": "…"},
                },
                request_only=True,
            )
        ],
    )
    @idempotent
    def create(self, request, org=None):
        data = s.ComputeTargetCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        target = compute_targets.compute_target_create(
            actor=self.actor, organization=self.organization, **data.validated_data
        )
        return Response(s.ComputeTargetOutput(target).data, status=status.HTTP_201_CREATED)

    @extend_schema(operation_id="compute_target_retrieve")
    def retrieve(self, request, org=None, pk=None):
        return Response(s.ComputeTargetOutput(self._target(pk)).data)

    @extend_schema(
        operation_id="compute_target_update",
        request=s.ComputeTargetUpdateInput,
        responses=s.ComputeTargetOutput,
    )
    def partial_update(self, request, org=None, pk=None):
        target = self._target(pk)
        data = s.ComputeTargetUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        config = s.validate_target_config(target.kind, data.validated_data["config"])
        updated = compute_targets.compute_target_update(
            actor=self.actor, target=target, config=config
        )
        return Response(s.ComputeTargetOutput(updated).data)

    @extend_schema(operation_id="compute_target_delete", responses={204: None})
    def destroy(self, request, org=None, pk=None):
        compute_targets.compute_target_delete(actor=self.actor, target=self._target(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)
