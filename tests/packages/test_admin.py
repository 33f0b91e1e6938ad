"""Code sources and packages in the admin panel: sources registered and changed through
``packages.sources`` (URL and ref checked, audited) with a write-only deploy key; packages listed
read-only; both scoped to the orgs the user administers."""

import pytest

from audit.models import AuditEvent
from config import secrets as secrets_box
from packages import sources
from packages.models import CodeSource
from tests.admin_forms import login, messages_of, submit
from tests.conftest import SYSTEM
from tests.factories import CodePackageFactory, WorkspaceFactory

SOURCES = "/admin/packages/codesource/"
PACKAGES = "/admin/packages/codepackage/"
URL = "http://127.0.0.1:9/trainer.git"
MATERIAL = "b3BlbnNzaC1rZXktdjEAAAAA-admin-secret-material"
KEY = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{MATERIAL}\n-----END OPENSSH PRIVATE KEY-----\n"


@pytest.fixture(autouse=True)
def policy(settings):
    settings.MANTA_CODE_SOURCE_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.MANTA_CODE_SOURCE_ALLOW_PLAIN = True


def stored_key(source: CodeSource) -> str:
    source.refresh_from_db()
    return secrets_box.decrypt(source.deploy_key_encrypted) if source.deploy_key_encrypted else ""


def pages_of(client, source):
    event = AuditEvent.objects.filter(action__startswith="code_source.").latest("id")
    urls = [SOURCES, f"{SOURCES}{source.pk}/change/", f"{SOURCES}{source.pk}/history/",
            "/admin/audit/auditevent/", f"/admin/audit/auditevent/{event.pk}/change/"]  # fmt: skip
    return {url: client.get(url).content.decode() for url in urls}


def test_a_source_is_registered_through_the_service_and_its_key_never_shown(world):
    admin = login("admin@acme.test")
    response = admin.post(
        f"{SOURCES}add/",
        {"workspace": world.ws.pk, "name": "trainer", "url": URL, "default_ref": "main",
         "known_hosts": "", "deploy_key": KEY},
    )  # fmt: skip
    assert response.status_code == 302, response.content.decode()[:3000]
    source = CodeSource.objects.get(workspace=world.ws, name="trainer")
    assert stored_key(source) == KEY and source.created_by == world.users["org_admin"]
    event = AuditEvent.objects.get(action="code_source.create")
    assert event.actor_id == world.users["org_admin"].pk and event.workspace_id == world.ws.pk
    for url, html in pages_of(admin, source).items():
        assert MATERIAL not in html, url
    assert ">set<" in pages_of(admin, source)[f"{SOURCES}{source.pk}/change/"]


def test_a_change_keeps_replaces_or_removes_the_key_and_refusals_change_nothing(world):
    source = sources.source_create(
        actor=SYSTEM, workspace=world.ws, name="trainer", url=URL, deploy_key=KEY
    )
    admin = login("owner@acme.test")
    url = f"{SOURCES}{source.pk}/change/"
    assert submit(admin, url, default_ref="release/1.2").status_code == 302
    source.refresh_from_db()
    assert source.default_ref == "release/1.2" and stored_key(source) == KEY
    event = AuditEvent.objects.filter(action="code_source.update").latest("id")
    assert event.actor_id == world.users["owner"].pk
    assert event.changes == {"default_ref": ["main", "release/1.2"]}

    events = AuditEvent.objects.count()
    bad_ref = submit(admin, url, default_ref="-x..y")
    assert bad_ref.status_code == 302 and bad_ref["Location"] == url
    assert any("default_ref: must be a branch" in m for m in messages_of(admin.get(url)))
    outside = submit(admin, url, url="http://10.9.9.9/x.git")
    assert outside.status_code == 302
    assert any(m.startswith("url:") for m in messages_of(admin.get(url)))
    source.refresh_from_db()
    assert (source.default_ref, source.url) == ("release/1.2", URL)
    assert AuditEvent.objects.count() == events

    both = submit(admin, url, deploy_key=KEY, remove_deploy_key="on")
    assert both.status_code == 200 and "either replace the deploy key or remove it" in (
        both.content.decode()
    )
    assert submit(admin, url, remove_deploy_key="on").status_code == 302
    assert stored_key(source) == ""
    event = AuditEvent.objects.filter(action="code_source.update").latest("id")
    assert event.changes == {"deploy_key": [True, False]}


def test_sources_and_packages_of_other_orgs_are_not_shown(world):
    lab = WorkspaceFactory(organization=world.other_org, slug="lab")
    theirs = sources.source_create(actor=SYSTEM, workspace=lab, name="theirs", url=URL)
    ours = CodePackageFactory(workspace=world.ws)
    foreign_package = CodePackageFactory(workspace=lab)
    admin = login("admin@acme.test")
    assert "theirs" not in admin.get(SOURCES).content.decode()
    assert (
        admin.get(f"{SOURCES}{theirs.pk}/change/", follow=True).redirect_chain[-1][0] == "/admin/"
    )
    offered = admin.get(f"{SOURCES}add/").content.decode()
    assert f'<option value="{world.ws.pk}">' in offered
    assert f'<option value="{lab.pk}">' not in offered
    listing = admin.get(PACKAGES).content.decode()
    assert ours.sha256 in listing and foreign_package.sha256 not in listing
    package_page = admin.get(f"{PACKAGES}{ours.pk}/change/")
    assert package_page.status_code == 200 and 'name="_save"' not in package_page.content.decode()
    assert admin.post(f"{PACKAGES}{ours.pk}/change/", {"size": "1"}).status_code == 403
    assert admin.get(f"{PACKAGES}add/").status_code == 403


@pytest.mark.parametrize("who", ["dev@acme.test", "wsadmin@acme.test"])
def test_members_who_do_not_administer_the_org_are_refused(world, who):
    client = login(who)
    for url in (SOURCES, f"{SOURCES}add/", PACKAGES):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    client.post(f"{SOURCES}add/", {"workspace": world.ws.pk, "name": "x", "url": URL})
    assert not CodeSource.objects.exists()
