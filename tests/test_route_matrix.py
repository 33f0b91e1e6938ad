"""The tenant/role matrix over the routes no app matrix holds (me/, tokens, the org list, compute
targets, logs, launch plans, template versions, packages); the check that every operation of the
API is in some matrix, so a route added without an entry fails here; and the own-versus-other
check of every detail route of every matrix."""

from __future__ import annotations

import io
import re
import zipfile

import pytest
from drf_spectacular.generators import SchemaGenerator

from config import ssrf
from packages import services as package_services
from tests import factories as f
from tests.conftest import SYSTEM
from tests.jobs import test_matrix as jobs_matrix
from tests.matrix import (
    ELSEWHERE,
    IN_ORG,
    ORG_ADMINS,
    WS_VISIBLE,
    Case,
    check_case,
    check_own_versus_other,
    is_detail,
    object_keys,
    own_versus_other_callers,
)
from tests.notifications import test_matrix as webhooks_matrix
from tests.packages import test_matrix as packages_matrix
from tests.quotas import test_api as quotas_matrix
from tests.workspaces import test_api_matrix as workspaces_matrix
from workspaces import compute_targets, identity
from workspaces.models import ComputeTarget

API = "/api/v1/"
ORG = API + "orgs/{org}/"
WS = ORG + "workspaces/{ws}/"
EVERYONE = ("foreign", *IN_ORG)
RAY = {"kind": "ray", "config": {"address": "http://ray.example.com:8265"}}


@pytest.fixture(autouse=True)
def public_hosts(monkeypatch):
    """Names in these cases resolve to a public address (no DNS in tests)."""
    monkeypatch.setattr(
        ssrf, "resolve", lambda host, port: [ssrf.ipaddress.ip_address("93.184.216.34")]
    )


@pytest.fixture(autouse=True)
def local_webhooks(settings):
    """The webhook cases' receivers are plain HTTP on 127.0.0.1, as in tests/notifications."""
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.WEBHOOK_ALLOW_HTTP = True


def a_token_of_the_developer(world):
    token, _ = identity.token_create(actor=SYSTEM, user=world.users["developer"], name="ci")
    return {"token": token.pk}


def a_target(world):
    target = compute_targets.compute_target_create(
        actor=SYSTEM, organization=world.org, name="shared-ray", **RAY
    )
    return {"target": target.pk}


def a_pool(world):
    return {"pool": f.WarmPoolFactory(organization=world.org).pk}


WARM_SHAPE = {"spec": f.WARM_SHAPE, "size": 0}


def zip_bytes() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("train.py", "print('hi')\n")
    return buffer.getvalue()


def a_package(world):
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".zip") as tmp:
        tmp.write(zip_bytes())
        tmp.flush()
        package, _ = package_services.package_store(actor=SYSTEM, workspace=world.ws, path=tmp.name)
    return {"sha256": package.sha256}


def a_job(world):
    return jobs_matrix.a_pending_job(world)


CASES = [
    Case("me_retrieve", "GET", API + "me/", EVERYONE, personal=True),
    Case("me_update", "PATCH", API + "me/", EVERYONE, personal=True,
         body={"notification_preferences": {"job_failed": False}},
         audit="user.notification_preferences"),
    Case("auth_tokens_list", "GET", API + "auth/tokens/", EVERYONE, personal=True),
    Case("auth_token_revoke", "DELETE", API + "auth/tokens/{token}/", ("developer",), 204,
         personal=True, refused=404, audit="token.revoke", params=a_token_of_the_developer),
    Case("orgs_list", "GET", API + "orgs/", EVERYONE, personal=True),
    Case("compute_targets_list", "GET", ORG + "compute-targets/", IN_ORG, ws_scoped=False),
    Case("compute_targets_create", "POST", ORG + "compute-targets/", ORG_ADMINS, 201,
         body={"name": "shared-ray", **RAY}, audit="compute_target.create", ws_scoped=False),
    Case("compute_target_retrieve", "GET", ORG + "compute-targets/{target}/", IN_ORG,
         ws_scoped=False, params=a_target),
    Case("compute_target_update", "PATCH", ORG + "compute-targets/{target}/", ORG_ADMINS,
         body={"config": RAY["config"]}, audit="compute_target.update", ws_scoped=False,
         params=a_target),
    Case("compute_target_delete", "DELETE", ORG + "compute-targets/{target}/", ORG_ADMINS, 204,
         audit="compute_target.delete", ws_scoped=False, params=a_target),
    Case("warm_pools_list", "GET", ORG + "warm-pools/", IN_ORG, ws_scoped=False),
    Case("warm_pools_create", "POST", ORG + "warm-pools/", ORG_ADMINS, 201, body=WARM_SHAPE,
         audit="warm_pool.create", ws_scoped=False),
    Case("warm_pool_retrieve", "GET", ORG + "warm-pools/{pool}/", IN_ORG, ws_scoped=False,
         params=a_pool),
    Case("warm_pool_update", "PATCH", ORG + "warm-pools/{pool}/", ORG_ADMINS,
         body={"size": 1}, audit="warm_pool.update", ws_scoped=False, params=a_pool),
    Case("template_versions", "GET", WS + "templates/{template}/versions/", WS_VISIBLE,
         params=jobs_matrix.a_template),
    Case("job_logs", "GET", WS + "jobs/{job}/logs/", WS_VISIBLE, params=a_job),
    Case("job_launch_plan", "GET", WS + "jobs/{job}/launch-plan/", WS_VISIBLE, params=a_job),
    Case("package_retrieve", "GET", WS + "packages/{sha256}/", WS_VISIBLE, params=a_package),
    Case("packages_upload", "POST", WS + "packages/", jobs_matrix.SUBMITTERS, 201,
         body=lambda world: zip_bytes(), content_type="application/zip",
         audit="package.upload"),
]  # fmt: skip

PRINCIPALS = [None, "foreign", *IN_ORG]


@pytest.fixture(autouse=True)
def package_store(package_storage):
    return package_storage


@pytest.mark.parametrize("who", PRINCIPALS, ids=lambda w: w or "anonymous")
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matrix(world, case, who):
    check_case(world, case, who)


# Operations outside the matrix, and why: each is tested where it lives.
UNMATRIXED = {
    ("POST", "/api/v1/auth/tokens/"): "signing in: anonymous by design (tests/workspaces)",
    ("GET", "/api/v1/package-downloads/{}.zip"): "a signed link is its own credential "
    "(tests/packages/test_packages.py)",
    ("POST", "/api/v1/invitations/accept/"): "the token is the credential, signed in or not "
    "(tests/workspaces/test_invitations.py)",
}


MATRICES = [
    CASES,
    jobs_matrix.CASES,
    webhooks_matrix.CASES,
    packages_matrix.CASES,
    quotas_matrix.CASES,
    workspaces_matrix.CASES,
]


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def schema_operations() -> set[tuple[str, str]]:
    """Every operation of the API as (METHOD, path), the path's values named as in the schema."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return {
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    }


def test_every_operation_of_the_api_is_in_a_matrix(db):
    operations = {(method, _shape(path)) for method, path in schema_operations()}
    covered = {(case.method, _shape(case.path)) for cases in MATRICES for case in cases}
    missing = sorted(operations - covered - set(UNMATRIXED))
    assert not missing, f"operations without a matrix entry: {missing}"
    assert not set(UNMATRIXED) - operations, "an exemption names an operation that is gone"


def test_a_foreign_compute_target_id_answers_404(world):
    other = ComputeTarget.objects.create(
        organization=world.other_org, name="theirs", kind="ray", config=RAY["config"]
    )
    response = world.client("owner").get(f"/api/v1/orgs/acme/compute-targets/{other.pk}/")
    assert response.status_code == 404


# One case per detail route (template_versions is in two matrices).
DETAIL_CASES = list(
    {_shape(case.path): case for cases in MATRICES for case in cases if is_detail(case)}.values()
)
OWN_VERSUS_OTHER = [
    pytest.param(case, where, who, id=f"{case.name}-{where}-{who}")
    for case in DETAIL_CASES
    for where in (ELSEWHERE if case.ws_scoped else ("other_org",))
    for who in own_versus_other_callers(case)
]


@pytest.mark.parametrize(("case", "where", "who"), OWN_VERSUS_OTHER)
def test_own_versus_other(world, case, where, who):
    check_own_versus_other(world, case, who, where)


def test_every_detail_route_has_an_own_versus_other_check(db):
    details = {
        (method, _shape(path))
        for method, path in schema_operations()
        if method == "GET" and object_keys(path)
    }
    checked = {("GET", _shape(case.path)) for case in DETAIL_CASES}
    missing = sorted(details - checked - set(UNMATRIXED))
    assert not missing, f"detail routes without an own-versus-other check: {missing}"
