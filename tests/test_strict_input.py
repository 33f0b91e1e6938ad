"""Input the API does not understand is refused by name, never dropped: unknown body fields (at
every level of a fixed-shape object) and unknown query parameters of list endpoints are a 400 that
changes nothing, with a suggestion when the name is a near miss."""

from __future__ import annotations

import re
from functools import cache

import pytest
from django.apps import apps
from drf_spectacular.generators import SchemaGenerator

from audit.context import Actor
from notifications import services as notification_services
from packages import sources
from quotas.models import OrgQuota, WorkspaceQuota
from tests.conftest import SYSTEM
from tests.factories import QuotaGroupFactory, WarmPoolFactory
from tests.jobs.conftest import counter_spec, submit
from workspaces import compute_targets, identity, invitations
from workspaces.models import WorkspaceMembership

ORG = "/api/v1/orgs/acme/"
WS = ORG + "workspaces/ml/"
UNKNOWN = "zzz_unknown"
# Operations whose body is not JSON: the package upload takes the raw zip.
NOT_JSON = {"packages_upload"}


@cache
def operations() -> list[tuple[str, str, dict]]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return [
        (path, method, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if method in {"get", "post", "put", "patch", "delete"}
    ]


def json_body_writes():
    for path, method, op in operations():
        content = (op.get("requestBody") or {}).get("content", {})
        if method != "get" and "application/json" in content:
            yield path, method, op


def bodyless_writes():
    for path, method, op in operations():
        if method != "get" and "requestBody" not in op:
            yield path, method, op


def list_operations():
    for path, method, op in operations():
        if method == "get" and any(p["name"] == "page" for p in op.get("parameters", [])):
            yield path, method, op


def row_counts() -> dict[str, int]:
    return {model._meta.label: model.objects.count() for model in apps.get_models()}


@pytest.fixture
def ids(world, template, settings, monkeypatch):
    """One real row behind every path parameter of the API."""
    from config import ssrf

    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.WEBHOOK_ALLOW_HTTP = True
    monkeypatch.setattr(
        ssrf, "resolve", lambda host, port: [ssrf.ipaddress.ip_address("93.184.216.34")]
    )
    hooks = {}
    for scope, workspace in (("org", None), ("ws", world.ws)):
        endpoint, _ = notification_services.webhook_create(
            actor=SYSTEM,
            organization=world.org,
            workspace=workspace,
            url="http://127.0.0.1:9/hook",
            event_types=["*"],
        )
        delivery = notification_services.webhook_ping(actor=SYSTEM, endpoint=endpoint)
        hooks[f"{scope}:webhooks"] = endpoint.pk
        hooks[f"{scope}:deliveries"] = delivery.pk
    sources.source_create(
        actor=SYSTEM, workspace=world.ws, name="trainer", url="https://git.example.com/t.git"
    )
    token, _ = identity.token_create(actor=SYSTEM, user=world.users["owner"])
    target = compute_targets.compute_target_create(
        actor=SYSTEM, organization=world.org, name="spare", kind="local", config={}
    )
    member = WorkspaceMembership.objects.get(workspace=world.ws, user=world.users["developer2"])
    invitation, _ = invitations.invitation_create(
        actor=SYSTEM, organization=world.org, email="new@acme.test"
    )
    return {
        **hooks,
        "org": world.org.slug,
        "ws": world.ws.slug,
        "tokens": token.pk,
        "compute-targets": target.pk,
        "members": member.pk,
        "templates": template.pk,
        "jobs": submit(world, template).pk,
        "code-sources": "trainer",
        "invitations": invitation.pk,
        "warm-pools": WarmPoolFactory(organization=world.org).pk,
        "quota-groups": QuotaGroupFactory(organization=world.org, name="team-a").name,
    }


def url_for(path: str, ids: dict) -> str | None:
    """The path with real ids in it; None when ``ids`` has no row for one of its parameters."""
    scope = "ws" if "{ws}" in path else "org"
    missing = []

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name in ("org", "ws"):
            return str(ids[name])
        segment = path[: match.start()].rstrip("/").rsplit("/", 1)[-1]  # jobs/{id}: "jobs"
        for key in (f"{scope}:{segment}", segment):
            if key in ids:
                return str(ids[key])
        missing.append(name)
        return ""

    url = re.sub(r"\{(\w+)\}", value, path)
    return None if missing else url


def walk(operations_, ids):
    """(operation, url) for each operation, and the ids of those no url could be built for."""
    reached, unreached = [], []
    for path, method, op in operations_:
        url = url_for(path, ids)
        if url is None:
            unreached.append(op["operationId"])
        else:
            reached.append((method, op, url))
    return reached, unreached


def test_every_json_write_refuses_an_unknown_field_and_changes_nothing(world, ids):
    client = world.client("owner")
    reached, unreached = walk(json_body_writes(), ids)
    failures = []
    for method, op, url in reached:
        before = row_counts()
        response = getattr(client, method)(url, {UNKNOWN: 1}, format="json")
        body = response.json()
        if response.status_code != 400 or UNKNOWN not in body.get("errors", {}):
            failures.append((op["operationId"], response.status_code, body))
        elif row_counts() != before:
            failures.append((op["operationId"], "changed rows"))
    writes = [op["operationId"] for _, method, op in operations() if method != "get"]
    print(f"{len(reached)} JSON write operations reached; {len(writes)} writes in all")
    assert not failures, failures
    assert not unreached, f"no row in ids() for a path parameter of {unreached}"
    bodyless = [op["operationId"] for _, _, op in bodyless_writes()]
    assert set(writes) - {op["operationId"] for _, op, _ in reached} - set(bodyless) == NOT_JSON


def test_every_bodyless_write_refuses_a_body(world, ids):
    client = world.client("owner")
    reached, unreached = walk(bodyless_writes(), ids)
    failures = []
    for method, op, url in reached:
        before = row_counts()
        response = getattr(client, method)(url, {UNKNOWN: 1}, format="json")
        if response.status_code != 400 or UNKNOWN not in response.json().get("errors", {}):
            failures.append((op["operationId"], response.status_code))
        elif row_counts() != before:
            failures.append((op["operationId"], "changed rows"))
    assert not failures, failures
    assert not unreached, unreached


@pytest.mark.parametrize(
    ("method", "action", "bodyless"),
    [
        ("post", "ping", True),
        ("post", "redeliver", True),
        ("delete", "destroy", True),
        ("post", "create", False),
        ("post", "rotate_secret", False),
        ("patch", "partial_update", False),
    ],
)
def test_refuse_unexpected_body_knows_the_operations_that_take_none(method, action, bodyless):
    """What the tenant base view can call to pass the test above."""
    from rest_framework.exceptions import ValidationError
    from rest_framework.test import APIRequestFactory

    from config import strict
    from notifications.api.views import WorkspaceWebhookViewSet

    def view_for(body):
        request = getattr(APIRequestFactory(), method)("/", body, format="json")
        view = WorkspaceWebhookViewSet(action_map={method: action}, args=(), kwargs={})
        view.request = view.initialize_request(request)
        return view

    view = view_for({UNKNOWN: 1})
    assert strict.takes_no_body(view) is bodyless
    if bodyless:
        with pytest.raises(ValidationError) as refusal:
            strict.refuse_unexpected_body(view.request, view)
        assert list(refusal.value.detail) == [UNKNOWN]
        strict.refuse_unexpected_body(view_for({}).request, view_for({}))
    else:
        strict.refuse_unexpected_body(view.request, view)  # the input serializer's business


def test_every_list_refuses_an_unknown_query_parameter(world, ids):
    client = world.client("owner")
    reached, unreached = walk(list_operations(), ids)
    failures = []
    for _, op, url in reached:
        response = client.get(url, {UNKNOWN: "1", "page_size": 5})
        body = response.json()
        if response.status_code != 400 or UNKNOWN not in body["errors"]:
            failures.append((op["operationId"], response.status_code, body))
        elif "unknown query parameter" not in body["errors"][UNKNOWN][0]:
            failures.append((op["operationId"], body))
    print(f"{len(reached)} list operations reached")
    assert not failures, failures
    assert not unreached, f"no row in ids() for a path parameter of {unreached}"
    assert len(reached) >= 15


DOCUMENTED_NOT_TAKEN: set = set()  # every documented list parameter is one the list takes


def test_every_documented_list_parameter_is_taken(world, ids):
    client = world.client("owner")
    reached, _ = walk(list_operations(), ids)  # the test above reaches them all
    refused = []
    for _, op, url in reached:
        for parameter in op.get("parameters", []):
            if parameter["in"] != "query":
                continue
            name = parameter["name"]
            response = client.get(url, {name: "1"})
            errors = response.json().get("errors", {}) if response.status_code == 400 else {}
            if "unknown query parameter" in " ".join(errors.get(name, [])):
                refused.append((op["operationId"], name))
    assert set(refused) == DOCUMENTED_NOT_TAKEN


# --- the cases that were found ------------------------------------------------------------------


def refused(client, method, url, body, field):
    before = row_counts()
    response = getattr(client, method)(url, body, format="json")
    assert response.status_code == 400, response.content
    assert row_counts() == before
    errors = response.json()["errors"]
    assert field in errors, errors
    return errors[field][0]


@pytest.mark.parametrize(
    ("method", "url", "body", "field", "meant"),
    [
        ("patch", WS + "quota/", {"guaranted_cpu": 4}, "guaranted_cpu", "guaranteed_cpu"),
        ("patch", WS, {"aproval_policy": "always"}, "aproval_policy", "approval_policy"),
        ("patch", ORG + "quota/", {"preemtion": True}, "preemtion", "preemption"),
        ("patch", ORG, {"max_node_per_job": 4}, "max_node_per_job", "max_nodes_per_job"),
        (
            "patch",
            WS,
            {"approval_policy": "threshold", "approval_thresholds": {"gpus": 1}},
            "approval_thresholds.gpus",
            "gpu",
        ),
    ],
)
def test_a_near_miss_is_refused_with_a_suggestion(world, method, url, body, field, meant):
    message = refused(world.client("owner"), method, url, body, field)
    assert message == f"unknown field; did you mean {meant!r}?" or f"{meant!r}" in message


@pytest.mark.parametrize(
    ("changes", "field", "meant"),
    [
        ({"max_runtime": 600}, "max_runtime", "max_runtime_seconds"),
        ({"worker_group": []}, "worker_group", "worker_groups"),
        ({"head": {"cpus": 1}}, "head.cpus", "cpu"),
        ({"worker_groups": [{"name": "w", "replica": 1}]}, "worker_groups.0.replica", "replicas"),
        ({"runtime_env": {"envvars": {"A": "1"}}}, "runtime_env.envvars", "env_vars"),
        ({"code": {"source": "x", "reff": "main"}}, "code.reff", "ref"),
    ],
)
def test_template_create_refuses_unknown_fields_at_every_level(world, changes, field, meant):
    body = {"name": "typo", **counter_spec(**changes)}
    message = refused(world.client("ws_admin"), "post", WS + "templates/", body, field)
    assert f"did you mean {meant!r}?" in message


def test_template_update_refuses_unknown_fields_in_a_spec_object(world, template):
    url = WS + f"templates/{template.pk}/"
    client = world.client("ws_admin")
    message = refused(client, "patch", url, {"head": {"cpu": 1, "gpuu": 0}}, "head.gpuu")
    assert "did you mean 'gpu'?" in message
    assert "did you mean 'priority'?" in refused(client, "patch", url, {"priorty": 3}, "priorty")


def test_job_submit_refuses_unknown_fields_and_unknown_override_keys(world, template):
    client = world.client("developer")
    body = {"template": template.pk, "override": {"priority": 7}}
    assert "did you mean 'overrides'?" in refused(client, "post", WS + "jobs/", body, "override")
    group = {"name": "w", "replicas": 1, "cpus": 1}
    body = {"template": template.pk, "overrides": {"worker_groups": [group]}}
    message = refused(client, "post", WS + "jobs/", body, "overrides.worker_groups.0.cpus")
    assert "did you mean 'cpu'?" in message


def test_a_far_miss_lists_the_known_fields(world):
    message = refused(world.client("owner"), "patch", ORG + "quota/", {"colour": 1}, "colour")
    assert message.startswith("unknown field; known: ") and "preemption" in message


def test_compute_target_config_refuses_unknown_settings(world):
    body = {"name": "x", "kind": "local", "config": {"start_timeout": 60}}
    message = refused(world.client("owner"), "post", ORG + "compute-targets/", body,
                      "config.start_timeout")  # fmt: skip
    assert "did you mean 'start_timeout_seconds'?" in message


@pytest.mark.parametrize(
    ("thresholds", "field"),
    [
        ({"gpu": -1}, "approval_thresholds.gpu"),
        ({"gpu": "2"}, "approval_thresholds.gpu"),
        ({"gpu": True}, "approval_thresholds.gpu"),
        ({"gpu": None}, "approval_thresholds.gpu"),
        ({"disk_gb": 10}, "approval_thresholds.disk_gb"),
        (["gpu"], "approval_thresholds"),
    ],
)
def test_approval_thresholds_take_known_resources_and_numbers(world, thresholds, field):
    body = {"approval_policy": "threshold", "approval_thresholds": thresholds}
    refused(world.client("owner"), "patch", WS, body, field)


def test_approval_thresholds_accept_every_resource_approval_compares(world):
    thresholds = {"gpu": 1, "cpu": 8, "memory_gb": 32.5, "max_runtime_seconds": 3600}
    body = {"approval_policy": "threshold", "approval_thresholds": thresholds}
    response = world.client("owner").patch(WS, body, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["approval_thresholds"] == thresholds


def test_jobs_list_filter_is_state_not_status(world, template):
    submit(world, template)
    client = world.client("viewer")
    response = client.get(WS + "jobs/", {"status": "running"})
    assert response.status_code == 400
    assert response.json()["errors"] == {
        "status": ["unknown query parameter; did you mean 'state'?"]
    }
    assert client.get(WS + "jobs/", {"state": "running"}).json()["count"] == 0
    assert client.get(WS + "jobs/", {"state": "queued"}).json()["count"] == 1


def test_list_parameters_a_view_declares_are_taken(world):
    client = world.client("owner")
    assert client.get(ORG + "workspaces/", {"include_archived": "true"}).status_code == 200
    assert client.get(ORG + "workspaces/", {"page": 1, "page_size": 1}).status_code == 200
    response = client.get(ORG + "audit-events/", {"acton": "quota.update"})
    assert response.json()["errors"] == {
        "acton": ["unknown query parameter; did you mean 'action'?"]
    }


def test_templates_list_takes_include_archived(world, template):
    response = world.client("viewer").get(WS + "templates/", {"include_archived": "true"})
    assert response.status_code == 200, response.content


def test_job_logs_refuses_unknown_query_parameters(world, template):
    job = submit(world, template)
    response = world.client("viewer").get(WS + f"jobs/{job.pk}/logs/", {"tial": 5})
    assert response.status_code == 400
    assert response.json()["errors"] == {"tial": ["unknown query parameter; did you mean 'tail'?"]}


# --- PUT and PATCH on the quotas ------------------------------------------------------------------

ORG_QUOTA = {"cpu": 64, "memory_gb": 256, "gpu": 8, "disk_gb": 1000, "max_running_jobs": 10,
             "policy": "fair_share", "balanced_max_wait_seconds": 600,
             "preemption": True}  # fmt: skip
WS_QUOTA = {"guaranteed_cpu": 4, "guaranteed_memory_gb": 16, "guaranteed_gpu": 1,
            "guaranteed_disk_gb": 100, "limit_cpu": 32, "limit_memory_gb": 128, "limit_gpu": 4,
            "limit_disk_gb": 500, "max_running_jobs": 5,
            "max_queued_jobs": 50, "gpu_hours_per_month": 100,
            "budget_action": "queue", "fair_share_weight": 2.5}  # fmt: skip


@pytest.mark.parametrize(
    ("url", "full", "model"),
    [(ORG + "quota/", ORG_QUOTA, OrgQuota), (WS + "quota/", WS_QUOTA, WorkspaceQuota)],
    ids=["org", "workspace"],
)
def test_put_replaces_a_quota_and_patch_changes_part_of_it(world, url, full, model):
    client = world.client("org_admin")
    if model is WorkspaceQuota:  # the workspace's guarantees must fit the org's capacity
        assert client.put(ORG + "quota/", ORG_QUOTA, format="json").status_code == 200
    response = client.put(url, full, format="json")
    assert response.status_code == 200, response.content
    assert {key: response.json()[key] for key in full} == full

    # what a client read can go back as it is (updated_at is read-only and ignored)
    again = client.put(url, client.get(url).json(), format="json")
    assert again.status_code == 200, again.content

    # a replace names every field: one left out is not kept from before
    first = next(iter(full))
    partial = {key: value for key, value in full.items() if key != first}
    assert "required" in refused(client, "put", url, partial, first)
    assert "did you mean" in refused(client, "put", url, {**full, f"{first}s": 1}, f"{first}s")

    # null where the field allows it: unlimited
    nullable = "cpu" if model is OrgQuota else "limit_cpu"
    response = client.put(url, {**full, nullable: None}, format="json")
    assert response.status_code == 200 and response.json()[nullable] is None

    # PATCH changes only what it names
    response = client.patch(url, {nullable: 48}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()[nullable] == 48
    assert response.json()["max_running_jobs"] == full["max_running_jobs"]


def test_put_on_a_quota_needs_the_permission_patch_needs(world):
    assert world.client("ws_admin").put(ORG + "quota/", ORG_QUOTA, format="json").status_code == 403
    assert world.client("ws_admin").put(WS + "quota/", WS_QUOTA, format="json").status_code == 403


# --- webhook event types --------------------------------------------------------------------------


def test_webhook_ping_is_an_event_type_an_endpoint_can_name(world, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.WEBHOOK_ALLOW_HTTP = True
    client = world.client("ws_admin")
    body = {"url": "http://127.0.0.1:9/hook", "event_types": ["webhook.ping", "job.failed"]}
    response = client.post(WS + "webhooks/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["event_types"] == ["webhook.ping", "job.failed"]
    url = WS + f"webhooks/{response.json()['id']}/"
    response = client.patch(url, {"event_types": ["webhook.ping"]}, format="json")
    assert response.status_code == 200, response.content
    # still refused: a type that does not exist
    assert "unknown event type" in refused(
        client, "patch", url, {"event_types": ["webhook.pong"]}, "event_types"
    )
    ping = client.post(url + "ping/")
    assert ping.status_code == 202 and ping.json()["event_type"] == "webhook.ping"


def test_the_org_level_endpoint_takes_webhook_ping_too(world, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.WEBHOOK_ALLOW_HTTP = True
    endpoint, _ = notification_services.webhook_create(
        actor=Actor.for_user(world.users["owner"]),
        organization=world.org,
        workspace=None,
        url="http://127.0.0.1:9/hook",
        event_types=["webhook.ping", "audit.event"],
    )
    assert endpoint.event_types == ["webhook.ping", "audit.event"]
