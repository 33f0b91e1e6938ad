"""List endpoints run a fixed number of queries whatever the page size."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.factories import (
    ApiTokenFactory,
    AuditEventFactory,
    OrgMembershipFactory,
    WorkspaceFactory,
    WorkspaceMembershipFactory,
)

LISTS = [
    "/api/v1/orgs/",
    "/api/v1/auth/tokens/",
    "/api/v1/orgs/acme/users/",
    "/api/v1/orgs/acme/workspaces/",
    "/api/v1/orgs/acme/workspaces/ml/members/",
    "/api/v1/orgs/acme/audit-events/",
]


@pytest.fixture
def crowded(world):
    WorkspaceMembershipFactory.create_batch(12, workspace=world.ws, role="viewer")
    WorkspaceFactory.create_batch(12, organization=world.org)
    ApiTokenFactory.create_batch(12, user=world.users["owner"])
    AuditEventFactory.create_batch(12, organization=world.org)
    return world


def count_queries(client, url, page_size):
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, {"page_size": page_size})
    assert response.status_code == 200, response.content
    assert len(response.json()["results"]) == page_size
    return len(ctx.captured_queries)


@pytest.mark.parametrize("url", LISTS)
def test_query_count_does_not_grow_with_page_size(crowded, url):
    client = crowded.client("owner")
    if url == "/api/v1/orgs/":
        # an owner sees few orgs: give them more
        OrgMembershipFactory.create_batch(10, user=crowded.users["owner"], role="owner")
    client.get("/api/v1/me/")  # the token's last-used write happens at most once a minute
    small = count_queries(client, url, 2)
    large = count_queries(client, url, 10)
    assert small == large, f"{url}: {small} queries for 2 rows, {large} for 10"
    assert large <= 8
