"""Organisations: the ones the caller belongs to, one organisation, and its users. Views only
translate: parse, call one service, render."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.response import Response

from workspaces import roles, selectors, services
from workspaces.models import Organization, OrgMembership

from . import serializers as s
from .tenancy import TenantViewSet


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
    organization_field = "organization"
    permission_map = {"list": roles.ORG_MANAGE_USERS}

    def base_queryset(self):
        return selectors.org_users(self.organization)

    @extend_schema(operation_id="org_users_list")
    def list(self, request, org=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.OrgUserOutput(page, many=True).data)
