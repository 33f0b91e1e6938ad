"""The admin's list pages cost the same number of queries whatever the number of rows shown."""

from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.admin_forms import login
from tests.factories import (
    ApiTokenFactory,
    CodePackageFactory,
    CodeSourceFactory,
    ComputeTargetFactory,
    InvitationFactory,
    UserFactory,
    WebhookDeliveryFactory,
    WebhookEndpointFactory,
    WorkspaceFactory,
    WorkspaceQuotaFactory,
)


def rows(world):
    """A list page, and how to add one more row of it in acme."""
    ws = world.ws
    return {
        "/admin/workspaces/computetarget/": lambda: ComputeTargetFactory(organization=world.org),
        "/admin/workspaces/user/": lambda: UserFactory(in_org=world.org),
        "/admin/workspaces/apitoken/": lambda: ApiTokenFactory(user=UserFactory(in_org=world.org)),
        "/admin/workspaces/invitation/": lambda: InvitationFactory(
            organization=world.org, invited_by=world.users["owner"]
        ),
        "/admin/quotas/workspacequota/": lambda: WorkspaceQuotaFactory(
            workspace=WorkspaceFactory(organization=world.org)
        ),
        "/admin/packages/codesource/": lambda: CodeSourceFactory(
            workspace=ws, created_by=world.users["ws_admin"]
        ),
        "/admin/packages/codepackage/": lambda: CodePackageFactory(
            workspace=ws, uploaded_by=world.users["developer"]
        ),
        "/admin/notifications/webhookendpoint/": lambda: WebhookEndpointFactory(
            workspace=ws, created_by=world.users["owner"]
        ),
        "/admin/notifications/webhookdelivery/": lambda: WebhookDeliveryFactory(
            endpoint__workspace=ws, endpoint__created_by=world.users["owner"]
        ),
    }


def count(client, url) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, url
    return len(ctx.captured_queries)


def test_list_pages_do_not_grow_with_their_rows(world):
    admin = login("admin@acme.test")
    grown = {}
    for url, add in rows(world).items():
        add()
        few = count(admin, url)
        for _ in range(5):
            add()
        grown[url] = count(admin, url) - few
    assert grown == dict.fromkeys(grown, 0)
