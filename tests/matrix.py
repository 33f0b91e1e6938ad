"""The reusable tenant/role matrix.

Every endpoint is listed once with the principals allowed to call it. For each endpoint the matrix
checks: no credentials → 401; a user of another organisation → 404; an org member who cannot see
the workspace → 404; a role without the permission → 403; each permitted role succeeds and leaves
exactly the expected audit event (with the caller as actor and the response's request id). Later
apps add their endpoints to their own lists and reuse :func:`check_case`.

Every detail route (a GET naming an object) is also checked own-versus-other, as NetBox's API
tests do: :func:`check_own_versus_other`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from django.apps import apps

from audit.models import AuditEvent

IN_ORG = ("owner", "org_admin", "member", "ws_admin", "developer", "viewer")
WS_VISIBLE = ("owner", "org_admin", "ws_admin", "developer", "viewer")
ORG_ADMINS = ("owner", "org_admin")
WS_ADMINS = ("owner", "org_admin", "ws_admin")
# Where the other object of an own-versus-other check lives: a workspace of the same organisation
# the caller is not a member of, or another organisation (its workspace has the same slug).
ELSEWHERE = ("other_workspace", "other_org")
# The caller of an own-versus-other check: the least privileged allowed one, and the owner (who
# may see every workspace of the org, but not through another workspace's URL).
BY_PRIVILEGE = ("viewer", "developer", "ws_admin", "member", "org_admin", "owner")


@dataclasses.dataclass
class Case:
    name: str
    method: str
    path: str  # may use {org}, {ws} and any key that ``params`` returns
    allowed: tuple[str, ...]
    status: int = 200
    body: dict[str, Any] | Callable[[Any], dict[str, Any]] | None = None
    audit: str | None = None  # the action a successful call records
    ws_scoped: bool = True
    params: Callable[[Any], dict[str, Any]] | None = None  # extra path values from the world
    # Not a tenant route (me/, tokens, the org list): every signed-in user is just a user, and
    # one outside ``allowed`` gets ``refused`` (a token of someone else does not exist: 404).
    personal: bool = False
    refused: int = 403
    content_type: str | None = None  # a body that is not JSON (bytes), e.g. a zip

    def url(self, world) -> str:
        values = {"org": world.org.slug, "ws": world.ws.slug}
        if self.params:
            values.update(self.params(world))
        return self.path.format(**values)

    def payload(self, world) -> dict[str, Any] | None:
        return self.body(world) if callable(self.body) else self.body

    def __str__(self) -> str:
        return self.name


def call(client, case: Case, url: str, payload):
    method = getattr(client, case.method.lower())
    if case.content_type:
        return method(url, data=payload, content_type=case.content_type)
    return method(url, data=payload, format="json")


def expected_status(case: Case, who: str | None) -> int:
    if who is None:
        return 401
    if case.personal:
        return case.status if who in case.allowed else case.refused
    if who == "foreign":
        return 404
    if case.ws_scoped and who not in WS_VISIBLE:
        return 404
    if who not in case.allowed:
        return 403
    return case.status


def check_case(world, case: Case, who: str | None) -> None:
    url, payload = case.url(world), case.payload(world)  # may create the rows the case needs
    before = AuditEvent.objects.count()
    rows = row_counts()
    last_id = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    response = call(world.client(who), case, url, payload)
    expected = expected_status(case, who)
    assert response.status_code == expected, (
        case.name,
        who,
        response.status_code,
        response.content,
    )
    if expected >= 400:
        body = response.json()
        assert set(body) >= {"type", "detail", "errors"}, body
        assert AuditEvent.objects.count() == before, "a refused call must change nothing"
        assert row_counts() == rows, f"{case.name}: a refused call must change no row"
        return
    new = list(AuditEvent.objects.filter(id__gt=last_id))
    if case.audit is None:
        assert new == [], f"{case.name}: a read must not write audit events: {new}"
        return
    assert [event.action for event in new] == [case.audit], (case.name, new)
    event = new[0]
    assert event.actor_id == world.users[who].pk
    assert event.actor_type == "token"
    assert event.request_id == response["X-Request-ID"]
    if not case.personal:
        assert event.organization_id == world.org.pk


def row_counts() -> dict[str, int]:
    """How many rows every table holds (sessions aside: a login is not a change)."""
    return {
        model._meta.label: model.objects.count()
        for model in apps.get_models()
        if model._meta.label != "sessions.Session"
    }


def object_keys(path: str) -> list[str]:
    """The path's values that name an object (beyond the organisation and the workspace)."""
    return [key for key in re.findall(r"\{(\w+)\}", path) if key not in ("org", "ws")]


def is_detail(case: Case) -> bool:
    """A tenant route that reads one object named in its path."""
    return case.method == "GET" and not case.personal and bool(object_keys(case.path))


def own_versus_other_callers(case: Case) -> tuple[str, ...]:
    least = next(who for who in BY_PRIVILEGE if who in case.allowed)
    return tuple(dict.fromkeys((least, "owner")))


def world_elsewhere(world, where: str):
    """``world`` with its workspace (and, for ``other_org``, its organisation) swapped for one
    the caller is not a member of, for a case's ``params`` to create the other object in."""
    from tests.conftest import SYSTEM
    from workspaces import services

    if where == "other_workspace":
        ws = services.workspace_create(actor=SYSTEM, organization=world.org, slug="elsewhere")
        return dataclasses.replace(world, ws=ws)
    ws = services.workspace_create(actor=SYSTEM, organization=world.other_org, slug=world.ws.slug)
    return dataclasses.replace(world, org=world.other_org, ws=ws)


def check_own_versus_other(world, case: Case, who: str, where: str) -> None:
    """Through the URL of the caller's own workspace, the same kind of object is 404 while it
    lives ``where`` (elsewhere) and 200 once it is the workspace's own; and each id of the path
    swapped for the other object's is 404 again (a delivery of another endpoint, say)."""
    assert case.params is not None, f"{case.name}: a detail route needs params to name an object"
    client = world.client(who)
    tenant = {"org": world.org.slug, "ws": world.ws.slug}

    def get(values):
        return client.get(case.path.format(**tenant, **values))

    theirs = case.params(world_elsewhere(world, where))
    response = get(theirs)
    assert response.status_code == 404, (case.name, who, where, response.content)
    assert response.json()["type"] == "not_found", response.json()

    ours = case.params(world)
    response = get(ours)
    assert response.status_code == case.status, (case.name, who, response.content)

    for key in object_keys(case.path):
        if ours[key] == theirs[key]:  # the same name in both places (a sha256, a source name)
            continue
        response = get({**ours, key: theirs[key]})
        assert response.status_code == 404, (case.name, who, where, key, response.content)
