"""Every list endpoint of the API runs a fixed number of queries however many rows it shows: the
count with a few rows of the list's kind equals the count with a dozen more (no query per row),
and stays within the list's budget. A list operation added to the schema without a budget here
fails."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.context import Actor
from jobs.models import Job, JobState, JobTemplate
from notifications.models import WebhookEndpoint
from quotas.models import QuotaGroup, WorkspaceQuota
from tests import factories as f
from tests import test_strict_input as strict_input

ids = strict_input.ids  # one real row behind every path parameter of the API

FEW, MORE = 2, 12


Make = Callable[[Any, dict, int], object]  # (world, ids, n): n more rows the list shows


@dataclasses.dataclass(frozen=True)
class Budget:
    queries: int  # at most, for any number of rows on the page
    make: Make


# Where the rows go: functions of (world, ids).
def owner(world, ids):
    return world.users["owner"]


def owner_actor(world, ids):
    return Actor.for_user(world.users["owner"])


def org(world, ids):
    return world.org


def ws(world, ids):
    return world.ws


def job(world, ids):
    return Job.objects.get(pk=ids["jobs"])


def batch(factory_class, **where) -> Make:
    """n rows from ``factory_class``, each value of ``where`` resolved (a plain value as is)."""

    def make(world, ids, n):
        values = {name: value(world, ids) if callable(value) else value
                  for name, value in where.items()}  # fmt: skip
        return factory_class.create_batch(n, **values)

    return make


def deliveries(scope: str, kinds: list[dict]) -> Make:
    """Deliveries of the ``scope`` endpoint of ``ids``, of each kind in turn, each after an
    attempt."""

    def make(world, ids, n):
        endpoint = WebhookEndpoint.objects.get(pk=ids[f"{scope}:webhooks"])
        for kind in itertools.islice(itertools.cycle(kinds), n):
            f.WebhookAttemptFactory(delivery=f.WebhookDeliveryFactory(endpoint=endpoint, **kind))

    return make


def jobs(world, ids, n):
    """Running jobs with an attempt, every other one approved by the workspace admin."""
    version = JobTemplate.objects.get(pk=ids["templates"]).versions.get()
    for index in range(n):
        decider = world.users["ws_admin"] if index % 2 else None
        running = f.JobFactory(
            workspace=world.ws, template_version=version, state=JobState.RUNNING, decided_by=decider
        )
        f.JobAttemptFactory(job=running)


WARM_SHAPES = itertools.count(2)  # 0: the factory's own shape


def warm_pools(world, ids, n):
    """Pools of n shapes (a shape is unique per target), each with an idle cluster."""
    for _ in range(n):
        shape = {**f.WARM_SHAPE, "head": {"cpu": next(WARM_SHAPES), "memory_gb": 1}}
        f.WarmClusterFactory(pool=f.WarmPoolFactory(organization=world.org, spec=shape))


def quota_groups(world, ids, n):
    """n groups, each under the one made before it (the list names each one's parent)."""
    for _ in range(n):
        parent = QuotaGroup.objects.filter(organization=world.org).order_by("pk").last()
        f.QuotaGroupFactory(organization=world.org, parent=parent)


def template_versions(world, ids, n):
    template = JobTemplate.objects.get(pk=ids["templates"])
    for _ in range(n):
        f.JobTemplateVersionFactory(template=template)


# Signing in and the tenant checks take 1 to 4 of these (the token; the org membership; the
# workspace and the permissions held there); the rest is the list's own: the count, the page and
# its related rows.
BUDGETS: dict[str, Budget] = {
    "auth_token_list": Budget(3, batch(f.ApiTokenFactory, user=owner)),
    "orgs_list": Budget(4, batch(f.OrgMembershipFactory, user=owner)),
    "audit_events_list": Budget(
        4,
        batch(f.AuditEventFactory, organization=org, workspace=ws, target=ws, actor=owner_actor),
    ),
    "compute_targets_list": Budget(4, batch(f.ComputeTargetFactory, organization=org)),
    "warm_pools_list": Budget(4, warm_pools),
    "quota_groups_list": Budget(4, quota_groups),
    "invitations_list": Budget(4, batch(f.InvitationFactory, organization=org)),
    "org_users_list": Budget(4, batch(f.OrgMembershipFactory, organization=org)),
    "workspaces_list": Budget(4, batch(f.WorkspaceFactory, organization=org)),
    "org_webhooks_list": Budget(
        4, batch(f.WebhookEndpointFactory, organization=org, workspace=None)
    ),
    "org_webhook_deliveries_list": Budget(
        6, deliveries("org", [{}, {"of_audit_event": True}, {"ping": True}])
    ),
    "code_sources_list": Budget(5, batch(f.CodeSourceFactory, workspace=ws)),
    "jobs_list": Budget(6, jobs),
    "job_events_list": Budget(7, batch(f.JobEventFactory, job=job)),
    "workspace_members_list": Budget(5, batch(f.WorkspaceMembershipFactory, workspace=ws)),
    "packages_list": Budget(5, batch(f.CodePackageFactory, workspace=ws)),
    "templates_list": Budget(6, batch(f.JobTemplateFactory, workspace=ws)),
    "template_versions_list": Budget(6, template_versions),
    "webhooks_list": Budget(5, batch(f.WebhookEndpointFactory, workspace=ws)),
    "webhook_deliveries_list": Budget(7, deliveries("ws", [{}, {"ping": True}])),
}


def list_paths() -> dict[str, str]:
    return {op["operationId"]: path for path, _, op in strict_input.list_operations()}


def test_every_list_has_a_budget():
    lists = set(list_paths())
    assert not lists - set(BUDGETS), (
        f"list operations without a query budget: {lists - set(BUDGETS)}"
    )
    assert not set(BUDGETS) - lists, f"budgets of lists that are gone: {set(BUDGETS) - lists}"


def queries_for(client, url) -> tuple[int, int]:
    """How many queries the list runs, and how many rows it shows (all on one page)."""
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, {"page_size": 100})
    assert response.status_code == 200, response.content
    body = response.json()
    assert len(body["results"]) == body["count"], "every row on one page"
    return len(ctx.captured_queries), body["count"]


@pytest.mark.parametrize("operation", sorted(BUDGETS))
def test_a_list_runs_a_fixed_number_of_queries_within_its_budget(world, ids, operation):
    budget = BUDGETS[operation]
    url = strict_input.url_for(list_paths()[operation], ids)
    client = world.client("owner")
    budget.make(world, ids, FEW)
    client.get(url)  # the token's last-used write happens at most once a minute: not here
    few, shown = queries_for(client, url)
    budget.make(world, ids, MORE)
    many, shown_after = queries_for(client, url)
    assert shown_after == shown + MORE, f"{operation} does not show the rows made for it"
    assert many == few, f"{operation}: {few} queries for {shown} rows, {many} for {shown_after}"
    assert many <= budget.queries, f"{operation}: {many} queries, budget {budget.queries}"


# A submission (POST …/jobs/) by a developer: the token, the org membership, the workspace with
# its quotas and compute target (one statement), the permissions held there; the template with
# its latest version and the new job's id; then one statement writes the job, its timeline
# entry, its audit event (``audit_append``) and its outbox event. The test database wraps the
# submission's transaction in a savepoint and its release: 2 more here.
SUBMIT_STATEMENTS = 6 + 2
QUEUED = 3000


def queued_in_bulk(world, template, n: int) -> None:
    """``n`` queued jobs of the template, inserted in one go."""
    one = f.JobFactory.build(
        workspace=world.ws,
        template_version=template.versions.get(),
        submitted_by=world.users["developer2"],
    )
    fields = [field.attname for field in Job._meta.concrete_fields if not field.primary_key]
    rows = (Job(**{name: getattr(one, name) for name in fields}) for _ in range(n))
    Job.objects.bulk_create(rows, batch_size=1000)


def submission_statements(client, template) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.post(
            "/api/v1/orgs/acme/workspaces/ml/jobs/", {"template": template.pk}, format="json"
        )
    assert response.status_code == 201, response.content
    return [query["sql"] for query in ctx.captured_queries]


def reads_jobs(statements: list[str]) -> list[str]:
    return [sql for sql in statements if sql.startswith("SELECT") and '"jobs_job"' in sql]


def test_a_submission_runs_a_fixed_number_of_statements_whatever_the_queue(world, template):
    client = world.client("developer")
    submission_statements(client, template)  # the token's last-used write: not counted below
    empty = submission_statements(client, template)
    queued_in_bulk(world, template, QUEUED)
    full = submission_statements(client, template)
    assert len(full) == len(empty) == SUBMIT_STATEMENTS, "\n".join(full)
    assert reads_jobs(full) == [], "a submission reads no jobs: no count, no replay"


def test_the_queue_limit_counts_no_further_than_the_limit(world, template):
    WorkspaceQuota.objects.create(workspace=world.ws, max_queued_jobs=QUEUED + 10)
    client = world.client("developer")
    submission_statements(client, template)
    empty = submission_statements(client, template)
    queued_in_bulk(world, template, QUEUED)
    full = submission_statements(client, template)
    assert len(full) == len(empty) == SUBMIT_STATEMENTS + 1
    (count,) = reads_jobs(full)
    assert f"LIMIT {QUEUED + 10}" in count  # bounded by the limit, not by the queue
