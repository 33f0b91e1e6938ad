"""Shared fixtures: a small world of two organisations, made with the factories, and API clients
that authenticate with real tokens."""

from __future__ import annotations

import dataclasses
import signal

import pytest
from django.db import transaction
from rest_framework.test import APIClient

from tests.factories import (
    PASSWORD,
    SYSTEM,
    ApiTokenFactory,
    JobTemplateFactory,
    OrganizationFactory,
    UserFactory,
    WorkspaceFactory,
    WorkspaceMembershipFactory,
)
from workspaces.models import Organization, User, Workspace

# What `make test` runs after the rest: whatever starts Ray clusters, Celery workers or sandboxes
# on this host (marked ray or e2e, and every launcher test: cgroups, nftables, loop devices and
# leases are the host's, not a test database's). Two at a time, each pytest-xdist process with
# its own directories and Redis database (tests/settings.py); then one at a time those marked
# whole_host, which measure the host (its disk, a CPU), lease its GPU inventory or time
# themselves, and so must not share it with another test.
ALONE = ("ray", "e2e", "whole_host")


@pytest.hookimpl(tryfirst=True)  # before -m selects by mark
def pytest_collection_modifyitems(config, items):
    launchers = config.rootpath / "tests" / "launchers"
    for item in items:
        if item.path.is_relative_to(launchers) or any(item.get_closest_marker(m) for m in ALONE):
            item.add_marker(pytest.mark.alone)


__all__ = ["PASSWORD", "SYSTEM", "World", "build_world"]


@pytest.fixture(autouse=True)
def _no_wakeup_pending():
    """No wake-up an earlier test sent (to a broker nobody here consumes) is pending: each test
    sends its own admission and dispatcher wake-ups (config/wakeup.py)."""
    from config import wakeup
    from jobs.dispatch import ADMIT
    from outbox.services import DISPATCH_TASK

    wakeup._away_until = 0.0  # nor does an earlier test's Redis outage linger
    for name in (ADMIT, DISPATCH_TASK):
        wakeup.woken(name)


@dataclasses.dataclass
class World:
    org: Organization
    ws: Workspace
    other_org: Organization
    users: dict[str, User]
    tokens: dict[str, str]

    def client(self, who: str | None) -> APIClient:
        client = APIClient()
        if who is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.tokens[who]}")
        return client


# who: (email, organisation, org role, role in acme/ml)
PEOPLE = {
    "owner": ("owner@acme.test", "acme", "owner", None),
    "org_admin": ("admin@acme.test", "acme", "admin", None),
    "member": ("member@acme.test", "acme", "member", None),
    "ws_admin": ("wsadmin@acme.test", "acme", "member", "admin"),
    "developer": ("dev@acme.test", "acme", "member", "developer"),
    "developer2": ("dev2@acme.test", "acme", "member", "developer"),
    "viewer": ("viewer@acme.test", "acme", "member", "viewer"),
    "foreign": ("owner@globex.test", "globex", "owner", None),
}


def build_world() -> World:
    """Acme, whose workspace ``ml`` has a user of each workspace role, beside org owner, admin and
    a plain member; and Globex, whose owner is the foreign user. Each user has a token."""
    orgs = {
        "acme": OrganizationFactory(slug="acme", name="Acme"),
        "globex": OrganizationFactory(slug="globex", name="Globex"),
    }
    ws = WorkspaceFactory(organization=orgs["acme"], slug="ml", name="ML")
    users = {}
    for who, (email, org, org_role, ws_role) in PEOPLE.items():
        users[who] = UserFactory(email=email, full_name="", in_org=orgs[org], in_org__role=org_role)
        if ws_role:
            WorkspaceMembershipFactory(workspace=ws, user=users[who], role=ws_role)
    tokens = {who: ApiTokenFactory(user=user, name="").secret for who, user in users.items()}
    return World(org=orgs["acme"], ws=ws, other_org=orgs["globex"], users=users, tokens=tokens)


@pytest.fixture(scope="module")
def _module_world(django_db_setup, django_db_blocker):
    """The world is built once per module inside an outer transaction; each test then runs in a
    savepoint of it (like Django's setUpTestData), and the whole thing is rolled back at the end."""
    with django_db_blocker.unblock(), transaction.atomic():
        yield build_world()
        transaction.set_rollback(True)


@pytest.fixture
def world(_module_world, db) -> World:
    for row in [*_module_world.users.values(), _module_world.ws, _module_world.org]:
        row.refresh_from_db()
    return _module_world


@pytest.fixture
def template(world):
    """The counter template in world.ws, as the workspace admin published it."""
    return JobTemplateFactory(
        workspace=world.ws, name="counter", created_by=world.users["ws_admin"]
    )


@pytest.fixture
def package_storage(tmp_path, settings):
    """Code packages stored under this test's own directory; the directory."""
    settings.STORAGES = {
        **settings.STORAGES,
        "packages": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "packages")},
        },
    }
    return tmp_path / "packages"


def sigint_as_in_a_terminal() -> None:
    """``preexec_fn`` for a process a test presses Ctrl-C in: SIGINT acts as it does at a
    terminal, also when the test run was started with SIGINT ignored (a background job of a
    non-interactive shell passes that on, and Python then installs no handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
