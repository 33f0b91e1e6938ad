"""The tenant/role matrix over the code package and code source endpoints."""

import pytest

from packages import sources
from tests.conftest import SYSTEM
from tests.matrix import IN_ORG, WS_ADMINS, WS_VISIBLE, Case, check_case

WS = "/api/v1/orgs/{org}/workspaces/{ws}/"
URL = "https://git.example.com/acme/trainer.git"


@pytest.fixture(autouse=True)
def public_host(monkeypatch):
    """git.example.com answers with a public address (no DNS in tests)."""
    from config import ssrf

    monkeypatch.setattr(
        ssrf, "resolve", lambda host, port: [ssrf.ipaddress.ip_address("93.184.216.34")]
    )


def a_source(world):
    sources.source_create(actor=SYSTEM, workspace=world.ws, name="trainer", url=URL)
    return {"source": "trainer"}


CASES = [
    Case("packages_list", "GET", WS + "packages/", WS_VISIBLE),
    Case("code_sources_list", "GET", WS + "code-sources/", WS_VISIBLE),
    Case(
        "code_sources_create",
        "POST",
        WS + "code-sources/",
        WS_ADMINS,
        status=201,
        body={"name": "trainer", "url": URL},
        audit="code_source.create",
    ),
    Case(
        "code_source_retrieve",
        "GET",
        WS + "code-sources/{source}/",
        WS_VISIBLE,
        params=a_source,
    ),
    Case(
        "code_source_update",
        "PATCH",
        WS + "code-sources/{source}/",
        WS_ADMINS,
        body={"default_ref": "v2"},
        audit="code_source.update",
        params=a_source,
    ),
    Case(
        "code_source_delete",
        "DELETE",
        WS + "code-sources/{source}/",
        WS_ADMINS,
        status=204,
        audit="code_source.delete",
        params=a_source,
    ),
]

PRINCIPALS = [None, "foreign", *IN_ORG]


@pytest.mark.parametrize("who", PRINCIPALS, ids=lambda w: w or "anonymous")
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matrix(world, case, who):
    check_case(world, case, who)
