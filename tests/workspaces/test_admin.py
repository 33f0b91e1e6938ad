"""The admin panel is scoped to the organisations a staff user administers, and audited."""

from django.test import Client

from audit.models import AuditEvent
from tests.conftest import PASSWORD, SYSTEM
from tests.factories import AuditEventFactory
from workspaces import services
from workspaces.models import Workspace


def login(email):
    client = Client()
    assert client.login(email=email, password=PASSWORD)
    return client


def test_org_admins_are_staff_and_developers_are_not(world):
    assert world.users["owner"].is_staff and world.users["org_admin"].is_staff
    assert not world.users["developer"].is_staff
    client = Client()
    client.login(email="dev@acme.test", password=PASSWORD)
    assert client.get("/admin/").status_code == 302  # to the login page


def test_admin_sees_only_their_orgs(world):
    services.workspace_create(actor=SYSTEM, organization=world.other_org, slug="secret")
    client = login("admin@acme.test")
    listing = client.get("/admin/workspaces/workspace/").content.decode()
    assert "ml" in listing and "secret" not in listing
    foreign = Workspace.objects.get(slug="secret")
    assert client.get(f"/admin/workspaces/workspace/{foreign.pk}/change/").status_code in (302, 404)
    orgs = client.get("/admin/workspaces/organization/").content.decode()
    assert "acme" in orgs and "globex" not in orgs
    events = client.get("/admin/audit/auditevent/").content.decode()
    assert "owner@globex.test" not in events


def test_admin_edit_goes_through_the_service_and_is_audited(world):
    client = login("admin@acme.test")
    response = client.post(
        f"/admin/workspaces/workspace/{world.ws.pk}/change/",
        {
            "name": "ML (edited)",
            "description": "",
            "approval_policy": "always",
            "approval_thresholds": "{}",
            "compute_target": "local",
            "memberships-TOTAL_FORMS": "0",
            "memberships-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    world.ws.refresh_from_db()
    assert world.ws.approval_policy == "always"
    event = AuditEvent.objects.filter(action="workspace.update").latest("id")
    assert event.actor_id == world.users["org_admin"].pk
    assert event.changes["approval_policy"] == ["auto", "always"]
    assert event.changes["name"] == ["ML", "ML (edited)"]


def test_audit_events_are_read_only_in_admin(world):
    client = login("owner@acme.test")
    event = AuditEventFactory(organization=world.org)
    url = f"/admin/audit/auditevent/{event.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert client.post(url, {"action": "x"}).status_code == 403
    assert client.get("/admin/audit/auditevent/add/").status_code == 403
