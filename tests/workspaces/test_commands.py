import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from audit.models import AuditEvent
from workspaces.models import OrgMembership


def test_create_org_prints_a_working_token(db, capsys):
    call_command("create_org", "initech", owner="Boss@Initech.test", password="a-long-password")
    token = capsys.readouterr().out.strip().splitlines()[-1]
    assert token.startswith("mnt_")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    me = client.get("/api/v1/me/").json()
    assert me["email"] == "boss@initech.test"
    assert me["organizations"] == [{"slug": "initech", "name": "initech", "role": "owner"}]
    assert OrgMembership.objects.get(user__email="boss@initech.test").role == "owner"
    event = AuditEvent.objects.get(action="org.create")
    assert event.actor_type == "system" and event.actor_label == "system:create_org"


def test_create_org_refuses_duplicates_and_bad_slugs(db):
    call_command("create_org", "initech", owner="a@initech.test")
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_org", "initech", owner="b@initech.test")
    with pytest.raises(CommandError, match="slug"):
        call_command("create_org", "Bad Slug!", owner="c@initech.test")
