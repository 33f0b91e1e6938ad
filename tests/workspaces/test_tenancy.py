"""The tenant base view scopes querysets itself: a view hands it every row and still answers only
with the URL's tenant's, and a view that declares no scope cannot be defined."""

from __future__ import annotations

import pytest
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory, force_authenticate

from tests.conftest import SYSTEM
from workspaces import roles, services
from workspaces.api.tenancy import TenantViewSet, WorkspaceViewSet
from workspaces.models import ComputeTarget, WorkspaceMembership

RAY = {"address": "http://127.0.0.1:8265"}


class EveryMembership(WorkspaceViewSet):
    """Hands the base every membership of every workspace."""

    queryset = WorkspaceMembership.objects.none()
    workspace_field = "workspace"
    not_found_message = "No such member."
    permission_map = {"list": roles.WS_VIEW, "retrieve": roles.WS_VIEW}

    def base_queryset(self):
        return WorkspaceMembership.objects.order_by("id")

    def list(self, request, **kwargs):
        return Response(sorted(self.get_queryset().values_list("pk", flat=True)))

    def retrieve(self, request, **kwargs):
        return Response({"id": self.get_object().pk})


class EveryTarget(TenantViewSet):
    """Hands the base every compute target of every organisation."""

    queryset = ComputeTarget.objects.none()
    organization_field = "organization"
    permission_map = {"retrieve": roles.ORG_VIEW}

    def base_queryset(self):
        return ComputeTarget.objects.all()

    def retrieve(self, request, **kwargs):
        return Response({"id": self.get_object().pk})


def call(viewset, action, user, **kwargs):
    request = APIRequestFactory().get("/")
    force_authenticate(request, user=user)
    return viewset.as_view({"get": action})(request, **kwargs)


@pytest.fixture
def elsewhere(world):
    """A workspace of the same organisation the developer is not a member of, with a member."""
    other = services.workspace_create(actor=SYSTEM, organization=world.org, slug="elsewhere")
    services.member_add(actor=SYSTEM, workspace=other, email="member@acme.test", role="viewer")
    return other


def test_the_base_keeps_the_rows_of_the_urls_workspace(world, elsewhere):
    developer = world.users["developer"]
    own = WorkspaceMembership.objects.get(workspace=world.ws, user=developer)
    theirs = WorkspaceMembership.objects.get(workspace=elsewhere)

    listed = call(EveryMembership, "list", developer, org="acme", ws="ml")
    assert listed.status_code == 200
    assert listed.data == list(
        WorkspaceMembership.objects.filter(workspace=world.ws).values_list("pk", flat=True)
    )
    assert theirs.pk not in listed.data

    found = call(EveryMembership, "retrieve", developer, org="acme", ws="ml", pk=own.pk)
    assert (found.status_code, found.data) == (200, {"id": own.pk})
    # the owner may see the other workspace, but not through this one's URL
    for who in ("developer", "owner"):
        missing = call(
            EveryMembership, "retrieve", world.users[who], org="acme", ws="ml", pk=theirs.pk
        )
        assert missing.status_code == 404
        assert str(missing.data["detail"]) == "No such member."


def test_the_base_keeps_the_rows_of_the_urls_organisation(world):
    ours = ComputeTarget.objects.create(organization=world.org, name="ours", kind="ray", config=RAY)
    theirs = ComputeTarget.objects.create(
        organization=world.other_org, name="theirs", kind="ray", config=RAY
    )
    owner = world.users["owner"]
    assert call(EveryTarget, "retrieve", owner, org="acme", pk=ours.pk).status_code == 200
    missing = call(EveryTarget, "retrieve", owner, org="acme", pk=theirs.pk)
    assert missing.status_code == 404
    assert str(missing.data["detail"]) == "Not found."


def test_a_view_with_rows_but_no_workspace_scope_cannot_be_defined():
    body = {"queryset": WorkspaceMembership.objects.none(), "permission_map": {}}
    with pytest.raises(TypeError, match="declares no workspace_field"):
        type("Unscoped", (WorkspaceViewSet,), body)
    # the organisation alone would let the org's other workspaces' rows through
    with pytest.raises(TypeError, match="declares no workspace_field"):
        type(
            "OrgOnly",
            (WorkspaceViewSet,),
            {**body, "organization_field": "workspace__organization"},
        )


def test_a_view_with_a_base_queryset_but_no_scope_cannot_be_defined():
    def base_queryset(self):
        return ComputeTarget.objects.all()

    with pytest.raises(TypeError, match="declares no organization_field"):
        type("Unscoped", (TenantViewSet,), {"base_queryset": base_queryset})


def test_an_organisation_view_cannot_scope_by_a_workspace():
    with pytest.raises(TypeError, match="resolves no workspace"):
        type("Confused", (TenantViewSet,), {"workspace_field": "workspace"})


def test_a_view_cannot_override_get_queryset():
    with pytest.raises(TypeError, match="not get_queryset"):
        type("Careless", (TenantViewSet,), {"get_queryset": lambda self: None})


def test_the_unscoped_path_has_a_name_to_notice(world, elsewhere):
    """Only ``dangerously_get_queryset`` hands out rows unscoped, and needs no scope to do so."""

    class Everything(WorkspaceViewSet):
        queryset = WorkspaceMembership.objects.none()
        permission_map = {"retrieve": roles.WS_VIEW}

        def dangerously_get_queryset(self):
            return WorkspaceMembership.objects.all()

        def retrieve(self, request, **kwargs):
            return Response({"id": self.get_object().pk})

    theirs = WorkspaceMembership.objects.get(workspace=elsewhere)
    found = call(
        Everything, "retrieve", world.users["developer"], org="acme", ws="ml", pk=theirs.pk
    )
    assert found.status_code == 200
