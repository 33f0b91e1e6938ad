"""Checking a rendered RayJob the way the API server and KubeRay would, against KubeRay's CRD.

For tests and tooling only: the launcher never needs it at runtime (nor ``jsonschema``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .manifest import (
    DNS1123_LABEL,
    GROUP,
    VERSION,
    label_problems,
    rayjob_name_problems,
)


def validate_rayjob(manifest: Mapping[str, Any], crd_path: str | os.PathLike[str]) -> list[str]:
    """Check ``manifest`` the way the API server and KubeRay would; return the problems found
    (empty when it would be accepted as is).

    Checks, in order: the CRD's ``v1`` OpenAPI schema (via jsonschema; ``int-or-string`` fields
    are ``anyOf: [integer, string]`` plus a ``pattern`` that only constrains strings, which is
    what the API server does too; ``int32``/``int64`` formats are range-checked); fields the
    schema does not declare (the API server would silently prune them, losing them); and the
    object metadata rules the CRD schema leaves to the API server and KubeRay (name, namespace,
    labels). Raises OSError if ``crd_path`` cannot be read.
    """
    import jsonschema  # only tests and tooling validate, so the launcher never needs it

    schema = _crd_schema(str(Path(crd_path).resolve()))
    checker = jsonschema.FormatChecker()
    checker.checks("int32")(functools.partial(_fits, bits=32))
    checker.checks("int64")(functools.partial(_fits, bits=64))
    validator = jsonschema.Draft7Validator(schema, format_checker=checker)
    problems = [
        f"{_json_path(error.absolute_path)}: {error.message}"
        for error in sorted(
            validator.iter_errors(manifest), key=lambda e: [str(part) for part in e.absolute_path]
        )
    ]
    problems += _unknown_fields(manifest, schema, "")

    if manifest.get("apiVersion") != f"{GROUP}/{VERSION}":
        problems.append(f"apiVersion: expected {GROUP}/{VERSION}")
    if manifest.get("kind") != "RayJob":
        problems.append("kind: expected RayJob")
    metadata = manifest.get("metadata") or {}
    problems += [f"metadata.name: {p}" for p in rayjob_name_problems(metadata.get("name"))]
    namespace = metadata.get("namespace")
    if not isinstance(namespace, str) or not DNS1123_LABEL.match(namespace) or len(namespace) > 63:
        problems.append(f"metadata.namespace: {namespace!r} is not a valid namespace name")
    problems += [f"metadata.labels: {p}" for p in label_problems(metadata.get("labels") or {})]
    return problems


@functools.lru_cache(maxsize=4)
def _crd_schema(crd_path: str) -> dict[str, Any]:
    # The CRD is ~25k lines: libyaml's loader takes well under a second where pure Python
    # takes many.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(crd_path, encoding="utf-8") as stream:
        crd = yaml.load(stream, Loader=loader)  # both candidates are safe loaders
    for version in crd["spec"]["versions"]:
        if version["name"] == VERSION:
            return version["schema"]["openAPIV3Schema"]
    raise ValueError(f"{crd_path} has no {VERSION} version")


def _fits(value: Any, *, bits: int) -> bool:
    if isinstance(value, bool) or not isinstance(value, int):
        return True  # formats only constrain integers; `type` catches the rest
    return -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)


def _unknown_fields(value: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    """Fields a structural schema would prune: object keys outside ``properties`` where neither
    ``additionalProperties`` nor ``x-kubernetes-preserve-unknown-fields`` allows them."""
    problems = []
    if isinstance(value, Mapping):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if properties is not None and key in properties:
                problems += _unknown_fields(item, properties[key], where)
            elif isinstance(additional, Mapping):
                problems += _unknown_fields(item, additional, where)
            elif properties is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                problems.append(f"{where}: unknown field (the API server would drop it)")
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            problems += _unknown_fields(item, schema["items"], f"{path}[{index}]")
    return problems


def _json_path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<root>"
