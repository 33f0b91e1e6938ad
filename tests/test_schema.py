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


# Operations without a token: issuing one, and a package link whose signature is the credential.
ANONYMOUS = {"auth_token_create", "package_download", "invitation_accept"}


def test_every_operation_is_authenticated_except_token_issue(db):
    schema = load_schema()
    assert schema["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    for _path, _method, op in operations(schema):
        if op["operationId"] in ANONYMOUS:
            assert {} in (op.get("security") or [{}])
        else:
            assert {"bearerAuth": []} in op.get("security", []), op["operationId"]


def test_docs_page(db):
    assert APIClient().get("/api/docs/").status_code == 200


def _examples(schema, operation):
    """The request's and the success responses' examples (every error response has one)."""
    found = []
    for content in (operation.get("requestBody") or {}).get("content", {}).values():
        found += list(content.get("examples", {}))
    for code, response in operation.get("responses", {}).items():
        if not code.startswith("2"):
            continue
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


ERROR_REF = {"$ref": "#/components/schemas/Error"}
WRITES = {"post", "put", "patch", "delete"}


def test_error_component_is_what_the_exception_handler_renders(db):
    error = load_schema()["components"]["schemas"]["Error"]
    assert set(error["required"]) == {"type", "detail", "errors"}
    assert error["properties"]["type"]["type"] == "string"
    assert error["properties"]["detail"]["type"] == "string"
    assert error["properties"]["errors"]["type"] == "object"
    assert error["properties"]["errors"]["additionalProperties"] == {
        "type": "array",
        "items": {"type": "string"},
    }
    assert not any(p.get("nullable") for p in error["properties"].values())

    client = APIClient()
    not_authenticated = client.get("/api/v1/me/")
    invalid = client.post("/api/v1/auth/tokens/", {}, format="json")
    assert (not_authenticated.status_code, invalid.status_code) == (401, 400)
    for body in (not_authenticated.json(), invalid.json()):
        assert set(body) == set(error["properties"])
        assert isinstance(body["type"], str) and isinstance(body["detail"], str)
        assert all(isinstance(m, list) for m in body["errors"].values())
    assert invalid.json()["errors"]["email"]


def test_every_operation_documents_its_error_responses(db):
    schema = load_schema()
    for path, method, op in operations(schema):
        name = op["operationId"]
        params = op.get("parameters", [])
        anonymous = name in ANONYMOUS
        validated_query = any(p["in"] == "query" for p in params)
        expected = {"429"}
        if not anonymous:
            expected |= {"401", "403"}
        elif method in WRITES:
            expected.add("401")
        if any(p["in"] == "path" for p in params) or path.startswith("/api/v1/orgs/{org}/"):
            expected.add("404")
        if method in WRITES:
            expected |= {"400", "409"}
        if "requestBody" in op or validated_query:
            expected.add("400")

        missing = expected - set(op["responses"])
        assert not missing, (name, missing)
        for code in expected:
            response = op["responses"][code]
            assert response["description"], (name, code)
            content = response["content"]["application/json"]
            assert content["schema"] == ERROR_REF, (name, code)
            for example in content["examples"].values():
                assert set(example["value"]) == {"type", "detail", "errors"}, (name, code)


def test_error_responses_follow_the_operation(db):
    ops = {op["operationId"]: op for _, _, op in operations(load_schema())}
    assert "404" not in ops["me_retrieve"]["responses"]
    assert "400" not in ops["job_retrieve"]["responses"]
    assert "409" not in ops["job_retrieve"]["responses"]
    assert "400" in ops["job_logs"]["responses"]  # its query is validated
    assert "404" in ops["orgs_list"]["responses"]  # a page past the end
    # Issuing a token needs no token: a 401 there means wrong credentials, and nothing is denied.
    token_issue = ops["auth_token_create"]["responses"]
    assert "credentials" in token_issue["401"]["description"]
    assert "403" not in token_issue


def test_statuses_a_view_documents_itself_are_kept(db):
    upload = next(
        op for _, _, op in operations(load_schema()) if op["operationId"] == "packages_upload"
    )
    assert upload["responses"]["413"] == {"description": "Larger than MANTA_PACKAGE_MAX_BYTES"}
