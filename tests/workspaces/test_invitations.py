"""Accounts stay in their tenant: an organisation invites an address, and the account (new or
existing) joins only by accepting with the token; inviting tells nothing about which addresses
have accounts."""

from __future__ import annotations

import datetime as dt

from django.core import mail
from django.utils import timezone
from rest_framework.test import APIClient

from tests.conftest import SYSTEM
from tests.matrix import row_counts
from tests.test_schema import load_schema
from workspaces.invitations import invitation_create
from workspaces.models import Invitation, OrgMembership, User

ORG = "/api/v1/orgs/acme/"
ACCEPT = "/api/v1/invitations/accept/"


def invite(world, email, who="org_admin", **body):
    response = world.client(who).post(ORG + "invitations/", {"email": email, **body}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_an_org_admin_cannot_pull_another_organisations_account_in(world):
    """The reported path: evil's admin POSTed acme's owner's email to its users/ and got them."""
    response = world.client("org_admin").post(
        ORG + "users/", {"email": "owner@globex.test", "password": "x" * 20}, format="json"
    )
    assert response.status_code == 405
    invited = invite(world, "owner@globex.test", org_role="admin")
    foreign = world.users["foreign"]
    assert not OrgMembership.objects.filter(organization=world.org, user=foreign).exists()
    # The invitation is accepted only with the account's own password.
    wrong = APIClient().post(
        ACCEPT, {"token": invited["token"], "password": "guess"}, format="json"
    )
    assert wrong.status_code == 401
    assert not OrgMembership.objects.filter(organization=world.org, user=foreign).exists()


def test_the_answer_is_the_same_whether_the_account_exists_or_not(
    world, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        known = invite(world, "owner@globex.test")
        unknown = invite(world, "nobody@elsewhere.test")
    shape = {
        key for key in known if key not in ("id", "email", "token", "created_at", "expires_at")
    }
    assert shape == {"org_role", "state", "invited_by"}
    assert {k: known[k] for k in shape} == {k: unknown[k] for k in shape}
    assert set(known) == set(unknown)
    # A weak password is no longer asked for at invitation time: nothing to tell them apart.
    assert len(mail.outbox) == 2 and mail.outbox[1].to == ["nobody@elsewhere.test"]
    assert known["token"] in mail.outbox[0].body


def test_an_existing_account_joins_with_its_password_and_the_token_is_single_use(world):
    invited = invite(world, "owner@globex.test", org_role="admin")
    anonymous = APIClient()
    body = {"token": invited["token"], "password": "a-long-enough-password-1"}
    from tests.conftest import PASSWORD

    body["password"] = PASSWORD
    joined = anonymous.post(ACCEPT, body, format="json")
    assert joined.status_code == 200, joined.content
    assert joined.json() == {
        "organization": "acme", "email": "owner@globex.test", "org_role": "admin",
    }  # fmt: skip
    membership = OrgMembership.objects.get(organization=world.org, user=world.users["foreign"])
    assert membership.role == "admin"
    again = anonymous.post(ACCEPT, body, format="json")
    assert again.status_code == 400 and "not valid" in again.json()["errors"]["token"][0]


def test_a_new_address_becomes_an_account_with_a_checked_password(world):
    invited = invite(world, "new.person@acme.test")
    weak = APIClient().post(
        ACCEPT, {"token": invited["token"], "password": "new.person"}, format="json"
    )
    assert weak.status_code == 400 and "password" in weak.json()["errors"]
    assert not User.objects.filter(email="new.person@acme.test").exists()
    ok = APIClient().post(
        ACCEPT, {"token": invited["token"], "password": "correct-horse-battery-9"}, format="json"
    )
    assert ok.status_code == 200, ok.content
    user = User.objects.get(email="new.person@acme.test")
    assert OrgMembership.objects.filter(organization=world.org, user=user, role="member").exists()


def test_signed_in_as_the_invited_account_no_password_is_needed_and_others_are_refused(world):
    invited = invite(world, "owner@globex.test")
    stranger = world.client("developer").post(ACCEPT, {"token": invited["token"]}, format="json")
    assert stranger.status_code == 403
    mine = world.client("foreign").post(ACCEPT, {"token": invited["token"]}, format="json")
    assert mine.status_code == 200, mine.content


def test_expired_revoked_and_unknown_tokens_are_refused_alike(world):
    expired = invite(world, "a@elsewhere.test")
    Invitation.objects.filter(pk=expired["id"]).update(
        expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    revoked = invite(world, "b@elsewhere.test")
    assert world.client("org_admin").delete(f"{ORG}invitations/{revoked['id']}/").status_code == 204
    before = row_counts()
    for token in (expired["token"], revoked["token"], "inv_" + "x" * 43, "nonsense"):
        response = APIClient().post(
            ACCEPT, {"token": token, "password": "correct-horse-battery-9"}, format="json"
        )
        assert response.status_code == 400, response.content
        assert "not valid" in response.json()["errors"]["token"][0]
    assert row_counts() == before
    listed = world.client("org_admin").get(ORG + "invitations/").json()["results"]
    assert {i["email"]: i["state"] for i in listed} == {
        "a@elsewhere.test": "expired", "b@elsewhere.test": "revoked",
    }  # fmt: skip


def test_only_owners_invite_owners(world):
    response = world.client("org_admin").post(
        ORG + "invitations/", {"email": "x@acme.test", "org_role": "owner"}, format="json"
    )
    assert response.status_code == 400 and "org_role" in response.json()["errors"]


def test_an_invitation_without_a_sender_lists_invited_by_null_as_the_schema_says(world):
    invitation_create(actor=SYSTEM, organization=world.org, email="x@elsewhere.test")
    listed = world.client("owner").get(ORG + "invitations/").json()["results"]
    assert [i["invited_by"] for i in listed] == [None]
    invitation = load_schema()["components"]["schemas"]["InvitationOutput"]
    assert invitation["properties"]["invited_by"]["nullable"] is True
