"""Compute targets in the admin panel: created and changed through the compute target services
(validated like the API, audited), scoped to the orgs the user administers, and their secrets
write-only: no page of the admin ever shows a stored token."""

import pytest

from audit.models import AuditEvent
from tests.admin_forms import login, submit
from tests.conftest import SYSTEM
from workspaces import compute_targets
from workspaces.models import ComputeTarget

TARGETS = "/admin/workspaces/computetarget/"
SECRET = "ray-token-3c1f9a7e55d04b2e"
REPLACEMENT = "ray-token-9d8e7f6a5b4c3d2e"


@pytest.fixture(autouse=True)
def ray_on_loopback(settings):
    settings.MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS = ["127.0.0.0/8"]


def add_target(client, **changes):
    form = {
        "organization": "",
        "name": "shared-ray",
        "kind": "ray",
        "config": '{"address": "http://127.0.0.1:8265"}',
        "token": SECRET,
        "kubeconfig": "",
        **changes,
    }
    return client.post(f"{TARGETS}add/", form)


def pages_of(client, target):
    """Every admin page a stored secret could leak into."""
    event = AuditEvent.objects.filter(target_type__icontains="computetarget").latest("id")
    urls = [
        TARGETS,
        f"{TARGETS}{target.pk}/change/",
        f"{TARGETS}{target.pk}/history/",
        "/admin/audit/auditevent/",
        f"/admin/audit/auditevent/{event.pk}/change/",
    ]
    return {url: client.get(url) for url in urls}


def test_a_target_is_created_through_the_service_and_its_token_never_shown(world):
    admin = login("admin@acme.test")
    response = add_target(admin, organization=world.org.pk)
    assert response.status_code == 302, response.content.decode()[:3000]
    target = ComputeTarget.objects.get(organization=world.org, name="shared-ray")
    assert target.config == {"address": "http://127.0.0.1:8265"}
    assert compute_targets.compute_target_secrets(target) == {"token": SECRET}
    event = AuditEvent.objects.get(action="compute_target.create", target_id=str(target.pk))
    assert event.actor_id == world.users["org_admin"].pk
    assert event.metadata == {"secrets": ["token"]}
    for url, page in pages_of(admin, target).items():
        assert page.status_code == 200, url
        assert SECRET not in page.content.decode(), url
    assert "token: set" in admin.get(f"{TARGETS}{target.pk}/change/").content.decode()


def test_a_change_keeps_the_token_unless_one_is_typed(world):
    target = compute_targets.compute_target_create(
        actor=SYSTEM,
        organization=world.org,
        name="shared-ray",
        kind="ray",
        config={"address": "http://127.0.0.1:8265", "token": SECRET},
    )
    admin = login("owner@acme.test")
    url = f"{TARGETS}{target.pk}/change/"
    form = admin.get(url).content.decode()
    assert SECRET not in form and 'name="token"' in form

    kept = submit(admin, url, config='{"address": "http://127.0.0.2:8265"}')
    assert kept.status_code == 302, kept.content.decode()[:3000]
    target.refresh_from_db()
    assert target.config == {"address": "http://127.0.0.2:8265"}
    assert compute_targets.compute_target_secrets(target) == {"token": SECRET}
    event = AuditEvent.objects.filter(action="compute_target.update").latest("id")
    assert event.actor_id == world.users["owner"].pk
    assert event.metadata == {"secrets_replaced": []}

    assert submit(admin, url, token=REPLACEMENT).status_code == 302
    target.refresh_from_db()
    assert compute_targets.compute_target_secrets(target) == {"token": REPLACEMENT}
    event = AuditEvent.objects.filter(action="compute_target.update").latest("id")
    assert event.metadata == {"secrets_replaced": ["token"]}
    for url, page in pages_of(admin, target).items():
        html = page.content.decode()
        assert SECRET not in html and REPLACEMENT not in html, url


def test_invalid_config_is_shown_beside_the_form_and_changes_nothing(world):
    admin = login("admin@acme.test")
    outside = add_target(
        admin, organization=world.org.pk, config='{"address": "http://10.1.2.3:8265"}'
    )
    assert outside.status_code == 200
    html = outside.content.decode()
    assert "address:" in html and "errornote" in html
    assert SECRET not in html  # the typed token is not echoed back either
    unknown = add_target(admin, organization=world.org.pk, config='{"adress": "x"}')
    assert unknown.status_code == 200 and "adress" in unknown.content.decode()
    not_json = add_target(admin, organization=world.org.pk, config="[1, 2")
    assert not_json.status_code == 200 and "Enter a valid JSON" in not_json.content.decode()
    assert not ComputeTarget.objects.filter(name="shared-ray").exists()
    assert not AuditEvent.objects.filter(action="compute_target.create").exists()


def test_targets_of_other_orgs_are_neither_listed_nor_offered(world):
    foreign = compute_targets.compute_target_create(
        actor=SYSTEM,
        organization=world.other_org,
        name="globex-ray",
        kind="ray",
        config={"address": "http://127.0.0.1:8265", "token": SECRET},
    )
    admin = login("admin@acme.test")
    assert "globex-ray" not in admin.get(TARGETS).content.decode()
    page = admin.get(f"{TARGETS}{foreign.pk}/change/", follow=True)
    assert page.redirect_chain[-1][0] == "/admin/" and SECRET not in page.content.decode()
    refused = add_target(admin, organization=world.other_org.pk, name="sneaky")
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()
    assert not ComputeTarget.objects.filter(name="sneaky").exists()
    before = foreign.config
    assert admin.post(f"{TARGETS}{foreign.pk}/change/", {"config": "{}"}).status_code in (302, 404)
    foreign.refresh_from_db()
    assert foreign.config == before


@pytest.mark.parametrize("who", ["dev@acme.test", "wsadmin@acme.test"])
def test_members_who_do_not_administer_the_org_are_refused(world, who):
    client = login(who)
    for url in (TARGETS, f"{TARGETS}add/"):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert add_target(client, organization=world.org.pk).status_code == 302
    assert not ComputeTarget.objects.exists()
