"""The API's JSON parser: DRF's, refusing what the rest of the stack cannot take.

A body that decodes is not yet a body we can use: nesting a thousand deep exhausts the recursion of
whatever walks it next (serializers, ``canonical_json``, the JSON encoder), a NUL or an unpaired
surrogate anywhere, key or value, makes PostgreSQL refuse the row (a 500 after the work was done),
and ``1e999`` decodes to ``inf``, which neither JSON nor ``jsonb`` can hold. All three are refused
here, before any view sees the data, with a ``parse_error`` naming the rule and where it was
broken: a value by its dotted path, a key on the object holding it.
"""

from __future__ import annotations

import math
import re
from typing import Any

from django.conf import settings
from rest_framework import parsers

from config.errors import UnparsableBody

# NUL, and the surrogate halves: json decodes "\ud800" to a str that UTF-8 cannot encode.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
UNSTORABLE_RULE = "must not contain null characters (NUL) or unpaired surrogates"
NON_FINITE_RULE = "must be a finite number (not NaN, Infinity or out of range like 1e999)"


def _escaped(text: str) -> str:
    """``text`` with the characters it was refused for escaped, so it is safe to send back."""
    return _UNSTORABLE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _broken_rule(value: object) -> str | None:
    """The rule a scalar breaks, if any."""
    if isinstance(value, str) and _UNSTORABLE.search(value):
        return UNSTORABLE_RULE
    if isinstance(value, float) and not math.isfinite(value):
        return NON_FINITE_RULE
    return None


def _too_deep(limit: int) -> UnparsableBody:
    return UnparsableBody(
        f"the JSON body is nested deeper than {limit} levels (MANTA_JSON_MAX_DEPTH)"
    )


def _refuse(path: str, rule: str) -> UnparsableBody:
    path = path or "non_field_errors"
    return UnparsableBody(f"{path}: {rule}", errors={path: [rule]})


def check_parsed(data: Any, *, max_depth: int) -> None:
    """Raise :class:`UnparsableBody` for the first container past ``max_depth`` levels, string
    or key with NUL or an unpaired surrogate, or non-finite number in ``data``. Iterative, so
    no nesting can exhaust the stack here."""
    if not isinstance(data, dict | list):
        if rule := _broken_rule(data):
            raise _refuse("", rule)
        return
    stack: list[tuple[dict | list, str, int]] = [(data, "", 1)]
    while stack:
        container, path, depth = stack.pop()
        if depth > max_depth:
            raise _too_deep(max_depth)
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for key, value in items:
            if isinstance(key, str) and _UNSTORABLE.search(key):
                # Named on its object, as serializers name a bad key of a dict field.
                raise _refuse(path, f'invalid key "{_escaped(key)}": keys {UNSTORABLE_RULE}')
            if isinstance(value, dict | list):
                stack.append((value, _join(path, key), depth + 1))
            elif rule := _broken_rule(value):
                raise _refuse(_join(path, key), rule)


class StrictJSONParser(parsers.JSONParser):
    """``application/json``, at most ``MANTA_JSON_MAX_DEPTH`` levels deep, every string and key
    storable in PostgreSQL, every number finite."""

    # NaN and Infinity decode to floats and are refused by check_parsed, with their path.
    strict = False

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.MANTA_JSON_MAX_DEPTH
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:  # the C decoder's own guard, far past any sane limit
            raise _too_deep(limit) from None
        check_parsed(data, max_depth=limit)
        return data
