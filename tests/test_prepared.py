"""Prepared reads (config/prepared.py) return what their querysets return: the same rows, the
same instances with the same joined rows and annotations, for every value, on every connection.
Checked on the reads every request makes and on a submission's, against the queryset each
replaced."""

from __future__ import annotations

import threading

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from guardian.models import GroupObjectPermission

from config.prepared import PreparedRead
from jobs import selectors as job_selectors
from jobs.api.views import JobViewSet
from tests import factories as f
from workspaces import selectors
from workspaces.identity import _TOKEN_BY_HASH, token_authenticate, token_hash
from workspaces.models import ApiToken, OrgMembership, Workspace

pytestmark = pytest.mark.django_db


def state(obj, seen: frozenset = frozenset()) -> dict:
    """An instance as plain data: its fields, annotations and the rows joined to it (recursively,
    as ``select_related`` caches them; a row joined back to one already shown by its type and
    id), not Django's bookkeeping."""
    data = {k: v for k, v in vars(obj).items() if k != "_state"}
    seen = seen | {id(obj)}
    data["_joined"] = {
        name: None if rel is None else (type(rel), rel.pk) if id(rel) in seen else state(rel, seen)
        for name, rel in obj._state.fields_cache.items()
    }
    data["_db"], data["_adding"] = obj._state.db, obj._state.adding
    return data


def same(prepared: list, plain: list) -> None:
    assert [type(obj) for obj in prepared] == [type(obj) for obj in plain]
    assert [state(obj) for obj in prepared] == [state(obj) for obj in plain]


@pytest.fixture
def world():
    org = f.OrganizationFactory()
    f.OrgQuotaFactory(organization=org)
    target = f.ComputeTargetFactory(organization=org)
    ws = f.WorkspaceFactory(organization=org, compute_target=target.name)
    f.WorkspaceQuotaFactory(workspace=ws, guaranteed_gpu=1.0)
    other = f.WorkspaceFactory(organization=org)  # no quota, no target: the joins come back empty
    member = f.WorkspaceMembershipFactory(workspace=ws).user
    token = f.ApiTokenFactory(user=member)
    template = f.JobTemplateFactory(workspace=ws)
    return {"org": org, "ws": ws, "other": other, "member": member, "token": token,
            "template": template}  # fmt: skip


def test_the_workspace_a_submission_reads_is_the_querysets_with_every_join(world):
    view = JobViewSet()
    view.action = "create"
    read = view.workspace_read()
    for ws in (world["ws"], world["other"]):
        plain = view.workspace_queryset().filter(organization=world["org"], slug=ws.slug)
        same(read.rows(world["org"].pk, ws.slug), list(plain))
        # the joins a submission uses came with it: no query for them
        found = read.first(world["org"].pk, ws.slug)
        with CaptureQueriesContext(connection) as queries:
            found.organization.quota, found.organization  # noqa: B018
        assert not queries.captured_queries
    assert read.first(world["org"].pk, "no-such-ws") is None
    assert read.first(f.OrganizationFactory().pk, world["ws"].slug) is None  # another org's


def test_each_view_and_action_reads_its_own_workspace_query(world):
    create, listing = JobViewSet(), JobViewSet()
    create.action, listing.action = "create", "list"
    assert create.workspace_read() is not listing.workspace_read()
    assert create.workspace_read() is JobViewSet(action="create").workspace_read()
    plain = listing.workspace_queryset().filter(organization=world["org"], slug=world["ws"].slug)
    same(listing.workspace_read().rows(world["org"].pk, world["ws"].slug), list(plain))


def test_the_token_membership_and_permission_reads_are_the_querysets(world):
    token, member, ws = world["token"], world["member"], world["ws"]
    plain = ApiToken.objects.select_related("user").filter(key_hash=token_hash(token.secret))
    same(_TOKEN_BY_HASH.rows(token_hash(token.secret)), list(plain))
    assert token_authenticate(token.secret).pk == token.pk
    assert token_authenticate(token.secret + "x") is None

    membership = selectors.org_membership(member, world["org"].slug)
    plain = OrgMembership.objects.select_related("organization").filter(
        user=member, organization__slug=world["org"].slug
    )
    same([membership], list(plain))
    assert selectors.org_membership(member, "elsewhere") is None

    codenames = GroupObjectPermission.objects.filter(
        group__user=member,
        content_type=ContentType.objects.get_for_model(Workspace),
        object_pk=str(ws.pk),
    ).values_list("permission__codename", flat=True)
    assert codenames  # a developer holds some
    assert selectors.workspace_permissions(member, ws, membership) == frozenset(
        selectors.PERMISSION_BY_CODENAME[c] for c in codenames
    )
    assert selectors.workspace_permissions(member, world["other"], membership) == frozenset()


def test_a_submissions_template_comes_with_its_latest_version(world):
    template, ws = world["template"], world["ws"]
    found = job_selectors.template_for_submission(ws, template.pk)
    plain = job_selectors.templates_with_latest(ws).filter(pk=template.pk)
    same([found], list(plain))
    assert found.joined_latest_version.version == template.latest_version
    assert job_selectors.template_for_submission(world["other"], template.pk) is None
    template.archived_at = template.updated_at
    template.save(update_fields=["archived_at"])
    assert job_selectors.template_for_submission(ws, template.pk) is None


def test_hostile_values_are_only_values(world):
    read = JobViewSet(action="list").workspace_read()
    org = world["org"].pk
    for slug in ("' OR '1'='1", "%", "ws-%", "\\", "x'); DROP TABLE jobs_job; --", "é" * 300):
        assert read.first(org, slug) is None
    assert Workspace.objects.filter(organization=world["org"]).count() == 2


@pytest.mark.parametrize("value", [None, True, 2**63, -(2**63) - 1, 2**80])
def test_values_the_sql_cannot_stand_for_go_through_the_queryset(world, value):
    read = PreparedRead(
        lambda template_id: job_selectors.templates_with_latest(world["ws"]).filter(pk=template_id),
        int,
    )
    plain = job_selectors.templates_with_latest(world["ws"]).filter(pk=value)
    same(read.rows(value), list(plain))  # whatever the queryset makes of it, and no error


def test_a_read_whose_value_does_not_reach_the_sql_unchanged_is_refused():
    starts = PreparedRead(lambda slug: Workspace.objects.filter(slug__startswith=slug), str)
    with pytest.raises(ValueError, match="does not reach the SQL"):
        starts.rows("ws")
    listed = PreparedRead(lambda pk: Workspace.objects.filter(pk__in=[pk, 1]), int)
    listed.rows(3)  # an in-list keeps its values as they are: allowed
    with pytest.raises(TypeError):
        PreparedRead(lambda when: Workspace.objects.filter(created_at=when), float)
    with pytest.raises(TypeError, match="takes 1 values"):
        listed.rows(1, 2)


def test_prefetching_and_other_shapes_are_refused():
    with pytest.raises(ValueError, match="prefetch"):
        PreparedRead(
            lambda pk: Workspace.objects.filter(pk=pk).prefetch_related("memberships"), int
        ).rows(1)
    with pytest.raises(ValueError, match="flat column"):
        PreparedRead(lambda pk: Workspace.objects.filter(pk=pk).values("slug"), int).rows(1)


def test_each_connection_compiles_its_own(world):
    read = PreparedRead(lambda slug: Workspace.objects.filter(slug=slug), str)
    assert read.first(world["ws"].slug).pk == world["ws"].pk
    compiled = connection._manta_prepared_reads[read._key]
    seen = []

    def in_a_thread():
        try:
            # another thread, another connection: its own compilation, the same rows
            seen.append(read.first(world["ws"].slug) is None)  # not committed: not seen there
            seen.append(connections["default"]._manta_prepared_reads[read._key] is not compiled)
        finally:
            connections.close_all()

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert seen == [True, True]
    assert read.first(world["other"].slug).pk == world["other"].pk  # new values, same compile
    assert connection._manta_prepared_reads[read._key] is compiled


def test_a_submission_reads_its_template_through_the_prepared_read(world):
    """(tests/test_query_budgets.py pins the statements of a job POST.) A template id no
    workspace has, however large, is the same 400."""
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world['token'].secret}")
    ws = world["ws"]
    response = client.post(
        f"/api/v1/orgs/{world['org'].slug}/workspaces/{ws.slug}/jobs/",
        {"template": world["template"].pk},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["template"]["id"] == world["template"].pk
    for template_id in (2**62, 2**80, -1):
        missing = client.post(
            f"/api/v1/orgs/{world['org'].slug}/workspaces/{ws.slug}/jobs/",
            {"template": template_id},
            format="json",
        )
        assert missing.status_code == 400, template_id
        assert missing.json()["errors"] == {"template": ["no such template in this workspace"]}


def test_hostile_tokens_and_slugs_through_the_api_are_refused_not_errors(world):
    """What reaches the prepared reads from a request: the bearer secret (hashed before the
    read) and the URL's slugs (Django's slug converter first). A NUL, a huge secret, a slug
    no workspace has: 401 or 404, never a 500."""
    from rest_framework.test import APIClient

    client = APIClient()
    org, ws = world["org"].slug, world["ws"].slug
    for secret in ("mnt_\x00", "mnt_" + "a" * 100_000, "mnt_' OR 1=1 --", "mnt_é"):
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        answer = client.get(f"/api/v1/orgs/{org}/workspaces/{ws}/jobs/")
        assert answer.status_code == 401, (secret[:20], answer.status_code)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world['token'].secret}")
    for path in (
        f"/api/v1/orgs/{org}/workspaces/{'w' * 10_000}/jobs/",
        f"/api/v1/orgs/{'o' * 10_000}/workspaces/{ws}/jobs/",
        f"/api/v1/orgs/{org}/workspaces/{ws}%00/jobs/",
    ):
        assert client.get(path).status_code == 404, path[:60]
    assert client.get(f"/api/v1/orgs/{org}/workspaces/{ws}/jobs/").status_code == 200
