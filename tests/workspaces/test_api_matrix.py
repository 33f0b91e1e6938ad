import pytest

from tests.conftest import SYSTEM
from tests.matrix import IN_ORG, ORG_ADMINS, WS_ADMINS, WS_VISIBLE, Case, check_case
from workspaces.invitations import invitation_create
from workspaces.models import WorkspaceMembership

ORG = "/api/v1/orgs/{org}/"
WS = ORG + "workspaces/{ws}/"


def developer2_membership(world):
    membership = WorkspaceMembership.objects.get(workspace=world.ws, user=world.users["developer2"])
    return {"member": membership.pk}


def an_invitation(world):
    invitation, _ = invitation_create(actor=SYSTEM, organization=world.org, email="x@y.test")
    return {"invitation": invitation.pk}


CASES = [
    Case("org_retrieve", "GET", ORG, IN_ORG, ws_scoped=False),
    Case("org_update", "PATCH", ORG, ORG_ADMINS, body={"name": "Acme Corp"},
         audit="org.update", ws_scoped=False),
    Case("org_users_list", "GET", ORG + "users/", ORG_ADMINS, ws_scoped=False),
    Case("invitations_list", "GET", ORG + "invitations/", ORG_ADMINS, ws_scoped=False),
    Case("invitations_create", "POST", ORG + "invitations/", ORG_ADMINS, status=201,
         body={"email": "new@acme.test"}, audit="invitation.create", ws_scoped=False),
    Case("invitation_revoke", "DELETE", ORG + "invitations/{invitation}/", ORG_ADMINS,
         status=204, audit="invitation.revoke", ws_scoped=False, params=an_invitation),
    Case("workspaces_list", "GET", ORG + "workspaces/", IN_ORG, ws_scoped=False),
    Case("workspaces_create", "POST", ORG + "workspaces/", ORG_ADMINS, status=201,
         body={"slug": "new-ws", "name": "New"}, audit="workspace.create", ws_scoped=False),
    Case("workspace_retrieve", "GET", WS, WS_VISIBLE),
    Case("workspace_update", "PATCH", WS, WS_ADMINS, body={"description": "changed"},
         audit="workspace.update"),
    Case("workspace_archive", "DELETE", WS, ORG_ADMINS, status=204, audit="workspace.archive"),
    Case("members_list", "GET", WS + "members/", WS_VISIBLE),
    Case("members_create", "POST", WS + "members/", WS_ADMINS, status=201,
         body={"email": "member@acme.test", "role": "viewer"}, audit="member.add"),
    Case("members_update", "PATCH", WS + "members/{member}/", WS_ADMINS, body={"role": "viewer"},
         audit="member.update", params=developer2_membership),
    Case("members_remove", "DELETE", WS + "members/{member}/", WS_ADMINS, status=204,
         audit="member.remove", params=developer2_membership),
    Case("audit_list", "GET", ORG + "audit-events/", ORG_ADMINS, ws_scoped=False),
    Case("audit_verify", "GET", ORG + "audit-events/verify/", ORG_ADMINS, ws_scoped=False),
    Case("audit_export", "GET", ORG + "audit-events/export/", ORG_ADMINS, ws_scoped=False),
]  # fmt: skip

PRINCIPALS = [None, "foreign", *IN_ORG]


@pytest.mark.parametrize("who", PRINCIPALS, ids=lambda w: w or "anonymous")
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matrix(world, case, who):
    check_case(world, case, who)


def test_foreign_object_ids_answer_404(world):
    """An id that exists in another tenant is not found through this tenant's URL."""
    from tests.conftest import SYSTEM
    from workspaces import services

    other_ws = services.workspace_create(actor=SYSTEM, organization=world.other_org, slug="ml")
    membership = services.member_add(
        actor=SYSTEM, workspace=other_ws, email="owner@globex.test", role="admin"
    )
    client = world.client("owner")
    url = f"/api/v1/orgs/acme/workspaces/ml/members/{membership.pk}/"
    assert client.patch(url, {"role": "viewer"}, format="json").status_code == 404
    assert client.delete(url).status_code == 404
    # and the other org's owner cannot reach acme's workspace even with the same slug
    foreign = world.client("foreign")
    assert foreign.get("/api/v1/orgs/acme/workspaces/ml/").status_code == 404
    assert foreign.get("/api/v1/orgs/globex/workspaces/ml/").status_code == 200
