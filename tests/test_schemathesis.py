"""Schemathesis over the whole OpenAPI document, in process, as an org owner and as a developer.

Every operation is called with the ids of rows that exist (the world's org and workspace, a
template, a job waiting for approval, webhook endpoints with a delivery, …) and with requests
generated from its schema: the schema's own examples, bodies that name the world's rows, valid
data and invalid data. No answer may be a 5xx, and every answer must be a documented status with
a body that matches its schema. Each request runs in a savepoint that is rolled back, so a DELETE
does not take a row away from the next request. The run is seeded and bounded (about a dozen
requests per operation and principal) so that CI sees the same run every time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import tempfile
import time
import traceback
from collections import Counter

import hypothesis
import pytest
import schemathesis
import yaml
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck
from rest_framework.test import APIClient
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup, ServerError
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from audit.context import Actor
from config import ssrf
from jobs import services as job_services
from notifications import services as webhook_services
from packages import services as package_services
from packages import sources
from tests.conftest import PASSWORD, SYSTEM
from tests.factories import WARM_SHAPE, WarmPoolFactory
from tests.jobs.conftest import counter_spec
from tests.test_route_matrix import zip_bytes
from workspaces import compute_targets, identity
from workspaces.invitations import invitation_create
from workspaces.models import WorkspaceMembership

PRINCIPALS = ("owner", "developer")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
GENERATED = 6  # requests of valid data, and as many of invalid data, per operation and principal

# Operations not run, and why.
EXCLUDED = {
    "packages_upload": "its body is a zip, not JSON (tests/packages holds its refusals)",
}
# Query values an operation is always called with.
FIXED_QUERY = {
    # follow=true streams the log until the attempt ends: that needs a running cluster.
    "job_logs": {"follow": "false"},
}
# At least this many operations answered a 2xx, per principal. The developer's other answers are
# mostly 403: org administration, workspace administration, approving.
FLOOR = {"owner": 78, "developer": 29}

WEBHOOK_URL = "http://127.0.0.1:9/hook"
RAY = {"kind": "ray", "config": {"address": "http://ray.example.com:8265"}}


@pytest.fixture(autouse=True)
def sandboxed(monkeypatch, settings, package_storage):
    """No DNS (every name is a public address), webhooks to loopback allowed, packages stored
    for this test only and served from signed links."""
    monkeypatch.setattr(
        ssrf, "resolve", lambda host, port: [ssrf.ipaddress.ip_address("93.184.216.34")]
    )
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.MANTA_PUBLIC_URL = "https://manta.acme.test"


# --- the rows the requests name ------------------------------------------------------------------


@dataclasses.dataclass
class Rows:
    token: dict[str, int]  # a second token of each principal (DELETE auth/tokens/{id})
    target: int
    invitation: int
    # an invitation of each principal to the other organisation (POST invitations/accept/)
    invitation_token: dict[str, str]
    membership: int
    template: int
    job: int
    source: str
    sha256: str
    download: str
    ws_hook: int
    ws_delivery: int
    org_hook: int
    org_delivery: int
    pool: int


def build_rows(world) -> Rows:
    """One of everything a path can name; names differ from the schema's examples (a create
    from an example must not collide with them)."""
    target = compute_targets.compute_target_create(
        actor=SYSTEM, organization=world.org, name="ray-fixture", **RAY
    )
    invitation, _ = invitation_create(
        actor=SYSTEM, organization=world.org, email="invited@acme.test"
    )
    membership = WorkspaceMembership.objects.get(workspace=world.ws, user=world.users["developer2"])
    template = job_services.template_create(
        actor=SYSTEM,
        workspace=world.ws,
        name="tpl",
        spec=counter_spec(),
        allowed_overrides=["entrypoint", "worker_groups", "priority", "max_runtime_seconds"],
    ).template
    world.ws.approval_policy = "always"  # the job waits: approve, reject and cancel reach it
    world.ws.save()
    job = job_services.job_submit(
        actor=Actor.for_user(world.users["developer"]), workspace=world.ws, template=template
    )
    source = sources.source_create(
        actor=SYSTEM, workspace=world.ws, name="fixture-source", url="https://git.example.com/t.git"
    )
    with tempfile.NamedTemporaryFile(suffix=".zip") as tmp:
        tmp.write(zip_bytes())
        tmp.flush()
        package, _ = package_services.package_store(actor=SYSTEM, workspace=world.ws, path=tmp.name)
    link = package_services.download_url(package.sha256)
    hooks = {}
    for scope, workspace in (("ws", world.ws), ("org", None)):
        endpoint, _ = webhook_services.webhook_create(
            actor=SYSTEM,
            organization=world.org,
            workspace=workspace,
            url=WEBHOOK_URL,
            event_types=["*"],
        )
        delivery = webhook_services.webhook_ping(actor=SYSTEM, endpoint=endpoint)
        hooks[scope] = (endpoint.pk, delivery.pk)
    return Rows(
        token={
            who: identity.token_create(actor=SYSTEM, user=world.users[who], name="ci")[0].pk
            for who in PRINCIPALS
        },
        target=target.pk,
        invitation=invitation.pk,
        invitation_token={
            who: invitation_create(
                actor=SYSTEM, organization=world.other_org, email=world.users[who].email
            )[1]
            for who in PRINCIPALS
        },
        membership=membership.pk,
        template=template.pk,
        job=job.pk,
        source=source.name,
        sha256=package.sha256,
        download=link.rsplit("/", 1)[1].removesuffix(".zip"),
        ws_hook=hooks["ws"][0],
        ws_delivery=hooks["ws"][1],
        org_hook=hooks["org"][0],
        org_delivery=hooks["org"][1],
        pool=WarmPoolFactory(organization=world.org).pk,
    )


def path_parameters(path: str, world, rows: Rows, who: str) -> dict[str, object]:
    """The real value of every parameter in ``path``; ``{id}`` is the row of the collection
    before it."""
    org_level = "{ws}" not in path
    by_collection = {
        "tokens": rows.token[who],
        "compute-targets": rows.target,
        "invitations": rows.invitation,
        "members": rows.membership,
        "templates": rows.template,
        "jobs": rows.job,
        "webhooks": rows.org_hook if org_level else rows.ws_hook,
        "warm-pools": rows.pool,
    }
    values = {
        "org": world.org.slug,
        "ws": world.ws.slug,
        "name": rows.source,
        "sha256": rows.sha256,
        "token": rows.download,
        "delivery_id": rows.org_delivery if org_level else rows.ws_delivery,
    }
    if collection := re.search(r"([a-z-]+)/\{id\}", path):
        values["id"] = by_collection[collection.group(1)]
    return {name: values[name] for name in re.findall(r"\{(\w+)\}", path)}


def bodies_naming_rows(operation_id: str, world, rows: Rows, who: str) -> list[dict]:
    """Valid bodies the schema's examples cannot hold: they name rows of this world."""
    return {
        "auth_token_create": [{"email": world.users[who].email, "password": PASSWORD}],
        "invitation_accept": [{"token": rows.invitation_token[who]}],
        "jobs_submit": [{"template": rows.template, "overrides": {"priority": 7}}],
        "compute_target_update": [{"config": RAY["config"]}],
        "warm_pools_create": [{"spec": {**WARM_SHAPE, "head": {"cpu": 2}}}],
        "workspace_members_create": [{"email": "member@acme.test", "role": "viewer"}],
        "workspace_members_update": [{"role": "viewer"}],
    }.get(operation_id, [])


# --- the schema ----------------------------------------------------------------------------------


def operation_id(operation) -> str:
    return operation.definition.raw["operationId"]


# --- Django in process ---------------------------------------------------------------------------


@contextlib.contextmanager
def connection_kept_open():
    """Django's handler closes the database connection around each request; the test's
    transaction has to outlive every request (django.test.Client does the same)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@contextlib.contextmanager
def server_errors_recorded(into: list[str]):
    """The traceback of every exception a view let through (the cause of its 500)."""

    def record(sender, request=None, **kwargs):
        into.append("".join(traceback.format_exception(*sys.exc_info())))

    signals.got_request_exception.connect(record)
    try:
        yield
    finally:
        signals.got_request_exception.disconnect(record)


# --- the run -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    statuses: dict[str, Counter] = dataclasses.field(default_factory=dict)
    failures: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    server_errors: set[str] = dataclasses.field(default_factory=set)  # operations with a 5xx
    requests: int = 0

    def reached(self) -> set[str]:
        """The operations that answered a 2xx."""
        return {name for name, seen in self.statuses.items() if any(200 <= s < 300 for s in seen)}

    def refused_by_role(self) -> set[str]:
        return {name for name, seen in self.statuses.items() if 403 in seen} - self.reached()


def strategies(operation, world, rows: Rows, who: str):
    """(strategy, how many requests to draw from it) for one operation and principal."""
    name = operation_id(operation)
    fixed = {"path_parameters": path_parameters(operation.path, world, rows, who)}
    if name in FIXED_QUERY:
        fixed["query"] = FIXED_QUERY[name]
    given = operation.get_strategies_from_examples(**fixed)
    given += [
        operation.as_strategy(body=body, **fixed)
        for body in bodies_naming_rows(name, world, rows, who)
    ]
    return [
        *((strategy, 1) for strategy in given),
        (operation.as_strategy(schemathesis.GenerationMode.POSITIVE, **fixed), GENERATED),
        (operation.as_strategy(schemathesis.GenerationMode.NEGATIVE, **fixed), GENERATED),
    ]


def exercise(operation, strategy, count: int, token: str, outcome: Outcome, tracebacks: list):
    name = operation_id(operation)
    statuses = outcome.statuses.setdefault(name, Counter())

    @hypothesis.settings(
        max_examples=count,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        print_blob=False,
    )
    @hypothesis.given(case=strategy)
    def run(case):
        tracebacks.clear()
        with transaction.atomic():
            try:
                response = case.call(headers={"Authorization": f"Bearer {token}"})
                outcome.requests += 1
                statuses[response.status_code] += 1
                case.validate_response(response, checks=CHECKS)
            except FailureGroup as group:
                for failure in group.exceptions:
                    if isinstance(failure, ServerError):
                        outcome.server_errors.add(name)
                    key = (name, failure.title)
                    if key not in outcome.failures:  # the first of each kind is enough
                        cause = ("\n" + tracebacks[-1]) if tracebacks else ""
                        outcome.failures[key] = f"{group}{cause}"
            finally:
                transaction.set_rollback(True)

    # Unsatisfiable: no part of the request is left to make invalid, all of it is fixed.
    with contextlib.suppress(hypothesis.errors.Unsatisfiable):
        run()


def test_every_operation_answers_generated_requests_as_documented(world, capsys):
    rows = build_rows(world)
    raw = yaml.safe_load(APIClient().get("/api/schema/").content)
    schema = schemathesis.openapi.from_dict(raw)
    # The handler itself: get_wsgi_application() would run django.setup() again, and its logging
    # configuration would bind to this test's captured stderr, closed once the test ends.
    schema.app = WSGIHandler()
    for name in EXCLUDED:
        schema = schema.exclude(operation_id=name)
    operations = [result.ok() for result in schema.get_all_operations()]
    total = len(operations) + len(EXCLUDED)

    outcomes = {who: Outcome() for who in PRINCIPALS}
    tracebacks: list[str] = []
    started = time.monotonic()
    with connection_kept_open(), server_errors_recorded(tracebacks):
        for who in PRINCIPALS:
            for operation in operations:
                for strategy, count in strategies(operation, world, rows, who):
                    token = world.tokens[who]
                    exercise(operation, strategy, count, token, outcomes[who], tracebacks)
    elapsed = time.monotonic() - started

    server_errors = sum(len(o.server_errors) for o in outcomes.values())
    reached = ", ".join(
        f"{who} {len(o.reached())}/{total} ({len(o.refused_by_role())} more refused by role)"
        for who, o in outcomes.items()
    )
    with capsys.disabled():
        print(
            f"\nschemathesis: reached with a 2xx: {reached}; {server_errors} server errors; "
            f"{sum(o.requests for o in outcomes.values())} requests in {elapsed:.0f}s"
        )
        for who, outcome in outcomes.items():
            if unreached := set(outcome.statuses) - outcome.reached() - outcome.refused_by_role():
                print(f"  {who} without a 2xx or a 403: {', '.join(sorted(unreached))}")
    problems = [
        f"[{who}] {name}: {title}\n{detail}"
        for who, outcome in outcomes.items()
        for (name, title), detail in outcome.failures.items()
    ]
    assert not problems, "\n\n".join(problems)
    for who, outcome in outcomes.items():
        assert len(outcome.reached()) >= FLOOR[who], (who, sorted(outcome.reached()))
