"""The tenant/role matrix over the webhook endpoints (workspace- and org-level) and ``me/``."""

from __future__ import annotations

import pytest

from notifications import services
from notifications.models import WebhookDelivery
from tests.conftest import SYSTEM
from tests.matrix import IN_ORG, ORG_ADMINS, WS_ADMINS, Case, check_case

WS = "/api/v1/orgs/{org}/workspaces/{ws}/webhooks/"
ORG = "/api/v1/orgs/{org}/webhooks/"
URL = "http://127.0.0.1:9/hook"


def ws_hook(world):
    endpoint, _ = services.webhook_create(
        actor=SYSTEM, organization=world.org, workspace=world.ws, url=URL, event_types=["*"]
    )
    return {"hook": endpoint.pk, "delivery": a_delivery(endpoint)}


def org_hook(world):
    endpoint, _ = services.webhook_create(
        actor=SYSTEM, organization=world.org, workspace=None, url=URL, event_types=["*"]
    )
    return {"hook": endpoint.pk, "delivery": a_delivery(endpoint)}


def a_delivery(endpoint) -> int:
    return services.webhook_ping(actor=SYSTEM, endpoint=endpoint).pk


def family(prefix: str, base: str, allowed, params, ws_scoped: bool) -> list[Case]:
    hook = base + "{hook}/"
    common = {"params": params, "ws_scoped": ws_scoped}
    return [
        Case(f"{prefix}list", "GET", base, allowed, ws_scoped=ws_scoped),
        Case(
            f"{prefix}create",
            "POST",
            base,
            allowed,
            status=201,
            body={"url": URL, "event_types": ["job.failed"]},
            audit="webhook.create",
            ws_scoped=ws_scoped,
        ),
        Case(f"{prefix}retrieve", "GET", hook, allowed, **common),
        Case(
            f"{prefix}update",
            "PATCH",
            hook,
            allowed,
            body={"description": "changed"},
            audit="webhook.update",
            **common,
        ),
        Case(f"{prefix}delete", "DELETE", hook, allowed, 204, audit="webhook.delete", **common),
        Case(
            f"{prefix}rotate",
            "POST",
            hook + "rotate-secret/",
            allowed,
            body={},
            audit="webhook.rotate_secret",
            **common,
        ),
        Case(f"{prefix}ping", "POST", hook + "ping/", allowed, 202, audit="webhook.ping", **common),
        Case(f"{prefix}deliveries", "GET", hook + "deliveries/", allowed, **common),
        Case(f"{prefix}delivery", "GET", hook + "deliveries/{delivery}/", allowed, **common),
        Case(
            f"{prefix}redeliver",
            "POST",
            hook + "deliveries/{delivery}/redeliver/",
            allowed,
            202,
            audit="webhook.redeliver",
            **common,
        ),
    ]


CASES = [
    *family("ws_webhook_", WS, WS_ADMINS, ws_hook, True),
    *family("org_webhook_", ORG, ORG_ADMINS, org_hook, False),
]
PRINCIPALS = [None, "foreign", *IN_ORG]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("who", PRINCIPALS, ids=str)
def test_matrix(world, case, who):
    check_case(world, case, who)


def test_the_matrix_covers_every_webhook_route():
    from notifications.api.urls import urlpatterns

    methods = sum(len(set(p.callback.actions) - {"head"}) for p in urlpatterns)
    assert methods == len(CASES) == 20


def test_ping_leaves_a_delivery(world):
    ids = ws_hook(world)
    assert WebhookDelivery.objects.filter(pk=ids["delivery"]).exists()
