"""Hostile input through the real endpoints: every refusal is a 4xx in the one error shape, names
the field, parameter or limit it broke, and changes nothing. None is a 500 or an HTML page."""

from __future__ import annotations

import datetime as dt
import io
import json
import secrets
import zipfile

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from jobs.models import Job
from packages.models import CodePackage
from tests.conftest import PASSWORD
from tests.jobs.conftest import submit
from workspaces.models import ApiToken

TOKENS = "/api/v1/auth/tokens/"
WS = "/api/v1/orgs/acme/workspaces/ml/"
JOBS = WS + "jobs/"
AUDIT = "/api/v1/orgs/acme/audit-events/"
UNSTORABLE = "must not contain null characters (NUL) or unpaired surrogates"
NON_FINITE = "must be a finite number"


def refused(response, status: int = 400, *, type_: str | None = None) -> dict:
    """The error body of ``response``, after checking it is the one error shape."""
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json", response.content
    body = response.json()
    assert set(body) == {"type", "detail", "errors"}
    assert isinstance(body["detail"], str) and body["detail"]
    if type_ is not None:
        assert body["type"] == type_, body
    return body


def post_raw(world, path: str, body: bytes, method: str = "post"):
    client = world.client("owner")
    return getattr(client, method)(path, body, content_type="application/json")


def counts() -> tuple[int, ...]:
    return (
        Job.objects.count(),
        ApiToken.objects.count(),
        AuditEvent.objects.count(),
        CodePackage.objects.count(),
    )


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def login(**extra) -> dict:
    return {"email": "owner@acme.test", "password": PASSWORD, **extra}


# --- nesting -------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [65, 1_000, 100_000])
def test_a_body_nested_too_deep_is_refused_naming_the_limit(world, depth):
    before = counts()
    body = json.dumps(login(name="__deep__")).replace('"__deep__"', nested(depth))
    error = refused(post_raw(world, TOKENS, body.encode()), type_="parse_error")
    assert "64 levels" in error["detail"] and "MANTA_JSON_MAX_DEPTH" in error["detail"]
    assert counts() == before
    bare = refused(post_raw(world, TOKENS, nested(depth).encode()), type_="parse_error")
    assert "MANTA_JSON_MAX_DEPTH" in bare["detail"]
    assert counts() == before


def test_the_depth_limit_is_a_setting_and_the_limit_itself_is_accepted(world, settings):
    # 63 levels inside the top-level object: 64 in all, the most allowed. It is then the
    # serializer's to refuse (a name is not a list), as a plain validation error.
    body = json.dumps(login(name="__deep__")).replace('"__deep__"', nested(63))
    within = refused(post_raw(world, TOKENS, body.encode()), type_="validation_error")
    assert "name" in within["errors"]
    settings.MANTA_JSON_MAX_DEPTH = 8
    body = json.dumps(login(name="__deep__")).replace('"__deep__"', nested(8))
    error = refused(post_raw(world, TOKENS, body.encode()), type_="parse_error")
    assert "8 levels" in error["detail"]


# --- NUL and unpaired surrogates -----------------------------------------------------------------

# Raw JSON text: the escapes are decoded by the parser into the characters PostgreSQL refuses.
JOB_BODIES = [
    # a bad key is named on its object, the key escaped in the message
    ('{"template": %d, "overrides": {"a\\u0000b": 1}}', "overrides"),
    ('{"template": %d, "overrides": {"x\\ud800": 1}}', "overrides"),
    ('{"template": %d, "overrides": {"entrypoint": "python a\\u0000.py"}}', "overrides.entrypoint"),
    ('{"template": %d, "overrides": {"entrypoint": "python \\udc00.py"}}', "overrides.entrypoint"),
    ('{"template": %d, "name": "run\\ud800"}', "name"),
    (
        '{"template": %d, "overrides": {"worker_groups": [{"name": "a", "x": {"\\u0000": 1}}]}}',
        "overrides.worker_groups.0.x",
    ),
]


@pytest.mark.parametrize(("raw", "path"), JOB_BODIES)
def test_nul_or_a_lone_surrogate_anywhere_in_a_job_submit_is_refused_with_its_path(
    world, template, raw, path
):
    before = counts()
    error = refused(post_raw(world, JOBS, (raw % template.pk).encode()), type_="parse_error")
    assert list(error["errors"]) == [path]
    assert UNSTORABLE in error["errors"][path][0]
    assert error["detail"].startswith(path)
    assert counts() == before


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ('{"approval_thresholds": {"cpu\\u0000": 1}}', "approval_thresholds"),
        ('{"approval_thresholds": {"\\ud800": 1}}', "approval_thresholds"),
        ('{"\\u0000": 1}', "non_field_errors"),
        ('{"name": "ML\\u0000"}', "name"),
        ('{"name": "ML\\udfff"}', "name"),
    ],
)
def test_nul_or_a_lone_surrogate_in_a_workspace_patch_is_refused_and_changes_nothing(
    world, raw, path
):
    before = counts()
    thresholds, name = world.ws.approval_thresholds, world.ws.name
    error = refused(post_raw(world, WS, raw.encode(), method="patch"), type_="parse_error")
    assert list(error["errors"]) == [path]
    world.ws.refresh_from_db()
    assert (world.ws.approval_thresholds, world.ws.name) == (thresholds, name)
    assert counts() == before


def test_a_refused_key_is_named_escaped_in_the_message(world, template):
    # json.dumps sends them as the escapes \u0000 and \ud800
    raw = json.dumps({"template": template.pk, "overrides": {"a\x00b": 1, "c\ud800": 2}})
    error = refused(post_raw(world, JOBS, raw.encode()), type_="parse_error")
    (message,) = error["errors"]["overrides"]
    assert message.startswith('invalid key "a\\u0000b"') or message.startswith(
        'invalid key "c\\ud800"'
    )


def test_a_surrogate_in_a_login_is_refused_before_any_token_is_issued(world):
    before = counts()
    body = json.dumps(login(name="laptop\ud800"), ensure_ascii=True).encode()
    error = refused(post_raw(world, TOKENS, body), type_="parse_error")
    assert error["errors"] == {"name": [UNSTORABLE]}
    assert counts() == before


# --- malformed JSON and numbers JSON cannot hold -------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"template": ',  # truncated
        b'{"name": "\xff\xfe"}',  # not UTF-8
        b'{"name": "\xed\xa0\x80"}',  # a surrogate encoded in UTF-8 (invalid UTF-8)
        b"{'name': 'x'}",  # not JSON
        b"",
    ],
)
def test_malformed_json_is_a_parse_error(world, template, body):
    before = counts()
    response = post_raw(world, JOBS, body)
    if body:
        refused(response, type_="parse_error")
    else:  # an empty body is no body: the serializer names the required field
        assert "template" in refused(response, type_="validation_error")["errors"]
    assert counts() == before


@pytest.mark.parametrize("body", [b"[1, 2]", b'"x"', b"null", b"3"])
def test_a_body_that_is_not_an_object_is_refused(world, body):
    before = counts()
    error = refused(post_raw(world, JOBS, body))
    assert error["errors"], error
    assert counts() == before


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
def test_non_finite_numbers_are_refused_with_their_path(world, template, number):
    before = counts()
    raw = '{"template": %d, "overrides": {"worker_groups": [{"name": "a", "cpu": %s}]}}'
    error = refused(post_raw(world, JOBS, (raw % (template.pk, number)).encode()))
    assert error["type"] == "parse_error"
    assert NON_FINITE in error["errors"]["overrides.worker_groups.0.cpu"][0]
    raw = '{"approval_thresholds": {"cpu": ' + number + "}}"
    patch = post_raw(world, WS, raw.encode(), method="patch")
    assert NON_FINITE in refused(patch)["errors"]["approval_thresholds.cpu"][0]
    assert counts() == before


# --- date filters --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "parameter"),
    [(JOBS, "created_after"), (JOBS, "created_before"), (AUDIT, "since"), (AUDIT, "until")],
)
@pytest.mark.parametrize(
    "value",
    [
        "9999-12-31T23:59:59.999999-23:59",  # past year 9999 in UTC
        "9999-12-31T23:00:00-01:00",
        "0001-01-01T00:00:00+23:59",  # before year 1 in UTC
        "0001-01-01T00:00:00+00:01",
    ],
)
def test_a_date_filter_out_of_range_in_utc_is_refused_naming_the_parameter(
    world, path, parameter, value
):
    error = refused(world.client("owner").get(path, {parameter: value}), type_="validation_error")
    assert list(error["errors"]) == [parameter]
    assert "UTC" in error["errors"][parameter][0]


@pytest.mark.parametrize("value", ["not-a-date", "2024-02-30T00:00:00Z", "2024-01-01T00:00+24:00"])
def test_a_date_filter_that_is_no_date_is_refused_naming_the_parameter(world, value):
    error = refused(world.client("owner").get(JOBS, {"created_after": value}))
    assert list(error["errors"]) == ["created_after"]


def test_date_filters_compare_in_utc_whatever_the_offset(world, template):
    job = submit(world, template)
    yesterday = (timezone.now() - dt.timedelta(days=1)).astimezone(
        dt.timezone(-dt.timedelta(hours=23, minutes=59))
    )
    client = world.client("owner")
    # Offsets PostgreSQL itself would refuse (past ±15:59) work: the value is sent in UTC.
    after = client.get(JOBS, {"created_after": yesterday.isoformat()})
    assert after.status_code == 200 and [j["id"] for j in after.json()["results"]] == [job.pk]
    before = client.get(JOBS, {"created_before": yesterday.isoformat()})
    assert before.status_code == 200 and before.json()["results"] == []
    for edge in ("9999-12-31T00:00:00+23:59", "0001-01-01T23:59:00-00:01"):
        assert client.get(JOBS, {"created_after": edge}).status_code == 200
        assert client.get(AUDIT, {"since": edge, "until": edge}).status_code == 200
    events = client.get(AUDIT, {"since": yesterday.isoformat()})
    assert events.status_code == 200 and events.json()["count"] >= 1


# --- size ----------------------------------------------------------------------------------------


def test_a_body_over_the_upload_limit_is_a_json_413_naming_the_limit(world, template, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    before = counts()
    body = json.dumps({"template": template.pk, "name": "x" * 2000}).encode()
    error = refused(post_raw(world, JOBS, body), 413, type_="payload_too_large")
    assert "1000 bytes" in error["detail"] and "DATA_UPLOAD_MAX_MEMORY_SIZE" in error["detail"]
    patch = post_raw(world, WS, json.dumps({"name": "x" * 2000}).encode(), method="patch")
    refused(patch, 413, type_="payload_too_large")
    login_body = json.dumps(login(name="x" * 2000)).encode()
    refused(post_raw(world, TOKENS, login_body), 413, type_="payload_too_large")
    assert counts() == before


def test_a_package_upload_is_not_bound_by_the_json_limit(world, settings, tmp_path):
    """The upload streams its zip and has its own limit (MANTA_PACKAGE_MAX_BYTES)."""
    settings.STORAGES = {
        **settings.STORAGES,
        "packages": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "packages")},
        },
    }
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("train.py", f"SEED = '{secrets.token_hex(2000)}'\n")
    assert len(buffer.getvalue()) > 1000
    response = world.client("developer").post(
        WS + "packages/", data=buffer.getvalue(), content_type="application/zip"
    )
    assert response.status_code == 201, response.content
