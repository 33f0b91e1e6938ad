"""Business rules of the tenancy endpoints: bad input is a 400 naming the field, and changes
nothing."""

import pytest

from audit.models import AuditEvent
from workspaces.models import Workspace, WorkspaceMembership

WS_URL = "/api/v1/orgs/acme/workspaces/"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"slug": "Has Spaces"}, "slug"),
        ({"slug": "-leading"}, "slug"),
        ({"slug": "x" * 41}, "slug"),
        ({"name": "no slug"}, "slug"),
        ({"slug": "ml"}, "slug"),  # taken
    ],
)
def test_workspace_create_rules(world, body, field):
    before = (Workspace.objects.count(), AuditEvent.objects.count())
    response = world.client("owner").post(WS_URL, body, format="json")
    assert response.status_code in (400, 409), response.content
    assert field in response.json()["errors"], response.json()
    assert (Workspace.objects.count(), AuditEvent.objects.count()) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"approval_policy": "sometimes"}, "approval_policy"),
        ({"approval_thresholds": {"gpu": -1}}, "approval_thresholds.gpu"),
        ({"approval_thresholds": {"tpu": 1}}, "approval_thresholds.tpu"),
        ({"compute_target": "Not A Name"}, "compute_target"),
    ],
)
def test_workspace_update_rules(world, body, field):
    response = world.client("ws_admin").patch(WS_URL + "ml/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()["errors"], response.json()


def test_member_rules(world):
    client = world.client("ws_admin")
    url = WS_URL + "ml/members/"
    unknown = client.post(url, {"email": "nobody@else.test", "role": "viewer"}, format="json")
    assert unknown.status_code == 400 and "email" in unknown.json()["errors"]
    foreign = client.post(url, {"email": "owner@globex.test", "role": "viewer"}, format="json")
    assert foreign.status_code == 400, "a user outside the org cannot be added"
    bad_role = client.post(url, {"email": "member@acme.test", "role": "god"}, format="json")
    assert bad_role.status_code == 400 and "role" in bad_role.json()["errors"]
    twice = client.post(url, {"email": "dev@acme.test", "role": "viewer"}, format="json")
    assert twice.status_code == 409 and twice.json()["type"] == "conflict"
    assert not WorkspaceMembership.objects.filter(user__email="member@acme.test").exists()


def test_role_change_changes_permissions(world):
    """Roles are held as guardian group membership: a PATCH really moves the user."""
    viewer = world.client("viewer")
    assert viewer.post(WS_URL + "ml/members/", {"email": "member@acme.test", "role": "viewer"},
                       format="json").status_code == 403  # fmt: skip
    membership = WorkspaceMembership.objects.get(user=world.users["viewer"])
    world.client("ws_admin").patch(
        WS_URL + f"ml/members/{membership.pk}/", {"role": "admin"}, format="json"
    )
    assert viewer.post(WS_URL + "ml/members/", {"email": "member@acme.test", "role": "viewer"},
                       format="json").status_code == 201  # fmt: skip


def test_removed_member_loses_access(world):
    membership = WorkspaceMembership.objects.get(user=world.users["developer"])
    world.client("ws_admin").delete(WS_URL + f"ml/members/{membership.pk}/")
    assert world.client("developer").get(WS_URL + "ml/").status_code == 404


def test_archived_workspace_leaves_the_list_and_refuses_edits(world):
    client = world.client("owner")
    assert client.delete(WS_URL + "ml/").status_code == 204
    assert "ml" not in [w["slug"] for w in client.get(WS_URL).json()["results"]]
    listed = client.get(WS_URL, {"include_archived": "true"}).json()["results"]
    assert [w["archived_at"] is not None for w in listed if w["slug"] == "ml"] == [True]
    edit = client.patch(WS_URL + "ml/", {"name": "again"}, format="json")
    assert edit.status_code == 409


def test_org_update_image_prefixes(world):
    client = world.client("org_admin")
    response = client.patch("/api/v1/orgs/acme/", {"allowed_image_prefixes": ["ghcr.io/acme/"]},
                            format="json")  # fmt: skip
    assert response.status_code == 200
    assert response.json()["allowed_image_prefixes"] == ["ghcr.io/acme/"]
    bad = client.patch("/api/v1/orgs/acme/", {"allowed_image_prefixes": [""]}, format="json")
    assert bad.status_code == 400 and "allowed_image_prefixes.0" in bad.json()["errors"]


def test_only_owner_invites_owner(world):
    body = {"email": "x@acme.test", "org_role": "owner"}
    refused = world.client("org_admin").post("/api/v1/orgs/acme/invitations/", body, format="json")
    assert refused.status_code == 400 and "org_role" in refused.json()["errors"]
    assert (
        world.client("owner")
        .post("/api/v1/orgs/acme/invitations/", body, format="json")
        .status_code
        == 201
    )


def test_non_json_body_is_415(world):
    response = world.client("owner").generic(
        "POST", WS_URL, "slug=x", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 415
    assert response.json()["type"] == "unsupported_media_type"
