"""The OpenAPI document is valid OpenAPI 3 and every operation has a unique, readable id."""

import re
from collections import Counter

import yaml
from openapi_spec_validator import validate
from rest_framework.test import APIClient

_cache = {}


def load_schema():
    if "schema" not in _cache:
        response = APIClient().get("/api/schema/")
        assert response.status_code == 200
        _cache["schema"] = yaml.safe_load(response.content)
    return _cache["schema"]


def operations(schema):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in {"get", "post", "put", "patch", "delete"}:
                yield path, method, operation


def test_schema_validates(db):
    validate(load_schema())


def test_operation_ids_unique_and_readable(db):
    schema = load_schema()
    ids = [op["operationId"] for _, _, op in operations(schema)]
    duplicates = [name for name, n in Counter(ids).items() if n > 1]
    assert not duplicates, duplicates
    assert all(re.fullmatch(r"[a-z][a-z0-9_]+", name) for name in ids), ids


def test_every_operation_is_authenticated_except_token_issue(db):
    schema = load_schema()
    assert schema["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    for _path, _method, op in operations(schema):
        if op["operationId"] == "auth_token_create":
            assert op.get("security") in (None, [], [{}])
        else:
            assert {"bearerAuth": []} in op.get("security", []), op["operationId"]


def test_docs_page(db):
    assert APIClient().get("/api/docs/").status_code == 200


def _examples(schema, operation):
    found = []
    for content in (operation.get("requestBody") or {}).get("content", {}).values():
        found += list(content.get("examples", {}))
    for response in operation.get("responses", {}).values():
        for content in response.get("content", {}).values():
            found += list(content.get("examples", {}))
    return found


def test_job_and_template_operations_document_bodies_with_examples(db):
    schema = load_schema()
    checked = 0
    for path, method, operation in operations(schema):
        if "/templates/" not in path and "/jobs/" not in path:
            continue
        checked += 1
        if method in ("post", "patch"):
            assert "requestBody" in operation, operation["operationId"]
        success = [code for code in operation["responses"] if code.startswith("2")]
        assert success, operation["operationId"]
        if method != "delete":
            assert any(operation["responses"][c].get("content") for c in success), operation[
                "operationId"
            ]
            assert _examples(schema, operation), f"{operation['operationId']} has no example"
    assert checked >= 12


def test_schema_generates_without_warnings(db, capsys):
    """A warning means a component got a generated name (``Kind9ccEnum``) or an operation lost
    its types: a client generator would produce unstable names."""
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null")


def test_every_webhook_event_type_is_a_component(db):
    from notifications.events import EVENT_TYPES

    names = set(load_schema()["components"]["schemas"])
    for event_type in EVENT_TYPES:
        component = "".join(part.capitalize() for part in re.split(r"[._]", event_type)) + "Event"
        assert component in names, event_type
