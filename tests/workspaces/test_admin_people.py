"""Accounts, API tokens and invitations in the admin panel: an org admin sees the members of their
organisations (and only those organisations' memberships), revokes their tokens and invites and
revokes invitations through the services (audited), and never sees a secret."""

import pytest
from django.core import mail

from audit.models import AuditEvent
from tests.admin_forms import act, login, messages_of
from tests.conftest import SYSTEM
from tests.factories import ApiTokenFactory, OrgMembershipFactory
from workspaces import invitations
from workspaces.models import ApiToken, Invitation

USERS = "/admin/workspaces/user/"
TOKENS = "/admin/workspaces/apitoken/"
INVITATIONS = "/admin/workspaces/invitation/"


def test_accounts_of_members_only_with_the_memberships_one_administers(world):
    both = world.users["developer2"]
    OrgMembershipFactory(organization=world.other_org, user=both, role="member")
    admin = login("admin@acme.test")
    listing = admin.get(USERS).content.decode()
    assert "dev@acme.test" in listing and "owner@globex.test" not in listing
    page = admin.get(f"{USERS}{both.pk}/change/").content.decode()
    assert "acme" in page and "globex" not in page  # their other organisation is not ours
    both.refresh_from_db()
    assert both.password.split("$")[-1] not in page  # nor its password hash
    foreign = admin.get(f"{USERS}{world.users['foreign'].pk}/change/", follow=True)
    assert foreign.redirect_chain[-1][0] == "/admin/"
    assert 'name="_save"' not in page  # accounts are their owners' to change


def test_tokens_are_listed_without_secrets_and_revoked_through_the_service(world):
    admin = login("admin@acme.test")
    developer = world.users["developer"]
    token = ApiToken.objects.get(user=developer)
    listing = admin.get(TOKENS).content.decode()
    assert token.prefix in listing
    foreign_token = ApiToken.objects.get(user=world.users["foreign"])
    assert foreign_token.prefix not in listing
    detail = admin.get(f"{TOKENS}{token.pk}/change/").content.decode()
    for html in (listing, detail):
        assert world.tokens["developer"] not in html and token.key_hash not in html

    assert world.client("developer").get("/api/v1/me/").status_code == 200
    shown = act(admin, TOKENS, "revoke", [token.pk, foreign_token.pk])
    assert "Revoked 1 token(s)." in shown
    token.refresh_from_db()
    foreign_token.refresh_from_db()
    assert token.revoked_at is not None and foreign_token.revoked_at is None
    event = AuditEvent.objects.get(action="token.revoke", target_id=str(token.pk))
    assert event.actor_id == world.users["org_admin"].pk
    assert world.client("developer").get("/api/v1/me/").status_code == 401


def test_a_token_of_someone_in_another_org_is_theirs_to_revoke(world):
    both = world.users["developer2"]
    OrgMembershipFactory(organization=world.other_org, user=both, role="member")
    token = ApiToken.objects.get(user=both)
    shown = act(login("admin@acme.test"), TOKENS, "revoke", [token.pk])
    assert any("organisations you do not administer" in m for m in shown)
    token.refresh_from_db()
    assert token.revoked_at is None
    assert not AuditEvent.objects.filter(action="token.revoke").exists()


def test_invite_through_the_service_then_revoke(world, django_capture_on_commit_callbacks):
    admin = login("admin@acme.test")
    with django_capture_on_commit_callbacks(execute=True):
        response = admin.post(
            f"{INVITATIONS}add/",
            {
                "organization": world.org.pk,
                "email": "New.Person@Example.test",
                "org_role": "member",
            },
            follow=True,
        )
    assert any("sent by email" in m for m in messages_of(response))
    invitation = Invitation.objects.get(organization=world.org)
    assert invitation.email == "new.person@example.test"
    assert invitation.invited_by == world.users["org_admin"]
    created = AuditEvent.objects.get(action="invitation.create")
    assert created.actor_id == world.users["org_admin"].pk
    [sent] = mail.outbox
    token = sent.body.split('"token": "')[1].split('"')[0]
    listing = admin.get(INVITATIONS).content.decode()
    detail = admin.get(f"{INVITATIONS}{invitation.pk}/change/").content.decode()
    for html in (listing, detail):
        assert "new.person@example.test" in html and "pending" in html
        assert token not in html and invitation.token_hash not in html

    assert "Revoked 1 pending invitation(s)." in act(admin, INVITATIONS, "revoke", [invitation.pk])
    invitation.refresh_from_db()
    assert invitation.revoked_at is not None
    assert AuditEvent.objects.get(action="invitation.revoke").actor_id == created.actor_id


def test_an_invitation_the_service_refuses_is_an_error_and_creates_nothing(world):
    admin = login("admin@acme.test")  # an admin, not an owner: may not invite an owner
    response = admin.post(
        f"{INVITATIONS}add/",
        {"organization": world.org.pk, "email": "boss@example.test", "org_role": "owner"},
        follow=True,
    )
    assert any(
        "org_role: only an owner can invite another owner" in m for m in messages_of(response)
    )
    bad = admin.post(
        f"{INVITATIONS}add/", {"organization": world.org.pk, "email": "no", "org_role": "member"}
    )
    assert bad.status_code == 200 and "Enter a valid email address" in bad.content.decode()
    foreign = admin.post(
        f"{INVITATIONS}add/",
        {"organization": world.other_org.pk, "email": "x@example.test", "org_role": "member"},
    )
    assert foreign.status_code == 200 and "Select a valid choice" in foreign.content.decode()
    assert not Invitation.objects.exists()
    assert not AuditEvent.objects.filter(action="invitation.create").exists()


def test_invitations_of_other_orgs_are_not_shown_nor_revoked(world):
    theirs, _ = invitations.invitation_create(
        actor=SYSTEM, organization=world.other_org, email="someone@globex.test"
    )
    admin = login("admin@acme.test")
    assert "someone@globex.test" not in admin.get(INVITATIONS).content.decode()
    act(admin, INVITATIONS, "revoke", [theirs.pk])
    theirs.refresh_from_db()
    assert theirs.revoked_at is None


@pytest.mark.parametrize("who", ["dev@acme.test", "wsadmin@acme.test", "member@acme.test"])
def test_members_who_do_not_administer_the_org_are_refused(world, who):
    client = login(who)
    for url in (USERS, TOKENS, INVITATIONS, f"{INVITATIONS}add/"):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    token = ApiTokenFactory(user=world.users["viewer"])
    client.post(TOKENS, {"action": "revoke", "index": "0", "_selected_action": [token.pk]})
    token.refresh_from_db()
    assert token.revoked_at is None
