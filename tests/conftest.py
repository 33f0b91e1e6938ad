"""Shared fixtures: a small world of two organisations, built through the real services, and API
clients that authenticate with real tokens."""

from __future__ import annotations

import dataclasses

import pytest
from django.db import transaction
from rest_framework.test import APIClient

from audit.context import Actor
from workspaces import identity, services
from workspaces.models import Organization, User, Workspace

SYSTEM = Actor.system("tests")
PASSWORD = "correct-horse-battery-staple"


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


def make_user(org: Organization, email: str, org_role: str = "member") -> User:
    return services.user_create_in_org(
        actor=SYSTEM, organization=org, email=email, password=PASSWORD, org_role=org_role
    ).user


def build_world() -> World:
    org, owner = services.org_create(
        actor=SYSTEM, slug="acme", name="Acme", owner_email="owner@acme.test",
        owner_password=PASSWORD,
    )  # fmt: skip
    other, foreign = services.org_create(
        actor=SYSTEM, slug="globex", name="Globex", owner_email="owner@globex.test",
        owner_password=PASSWORD,
    )  # fmt: skip
    users = {
        "owner": owner,
        "org_admin": make_user(org, "admin@acme.test", "admin"),
        "member": make_user(org, "member@acme.test"),
        "ws_admin": make_user(org, "wsadmin@acme.test"),
        "developer": make_user(org, "dev@acme.test"),
        "developer2": make_user(org, "dev2@acme.test"),
        "viewer": make_user(org, "viewer@acme.test"),
        "foreign": foreign,
    }
    ws = services.workspace_create(actor=SYSTEM, organization=org, slug="ml", name="ML")
    for who, role in [("ws_admin", "admin"), ("developer", "developer"),
                      ("developer2", "developer"), ("viewer", "viewer")]:  # fmt: skip
        services.member_add(actor=SYSTEM, workspace=ws, email=users[who].email, role=role)
    tokens = {who: identity.token_create(actor=SYSTEM, user=u)[1] for who, u in users.items()}
    return World(org=org, ws=ws, other_org=other, users=users, tokens=tokens)


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
    from jobs import services as job_services
    from tests.jobs.conftest import counter_spec

    version = job_services.template_create(
        actor=Actor.for_user(world.users["ws_admin"]),
        workspace=world.ws,
        name="counter",
        spec=counter_spec(),
        allowed_overrides=["entrypoint", "worker_groups", "priority", "max_runtime_seconds"],
    )
    return version.template


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
