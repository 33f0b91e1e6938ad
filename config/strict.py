"""Input the API does not understand is refused, never dropped.

A body field an input serializer does not declare, and a query parameter a list endpoint does not
take, are a 400 naming them, with a suggestion when one known name is close: a typo such as
``aproval_policy`` would otherwise be a 200 that changed nothing.

Bodies: input serializers derive from :class:`StrictSerializer` (or mix in
:class:`StrictFieldsMixin`); nested serializers are serializers too, so nested objects with a fixed
set of keys are checked at every level. Free-form dict fields (``DictField``/``JSONField``) are not
checked here: what may go in them is the business of their own validation.

Query parameters: :func:`refuse_unknown_query_params`, called by the paginator, allows what an
operation documents: the view's filterset, the query parameters of its ``@extend_schema``, and any
names the view lists in ``extra_query_params``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from django import forms
from django_filters.widgets import SuffixedMultiWidget
from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers
from rest_framework.fields import empty

from config.serializers import DeclaredFieldsOnceMixin

# difflib's ratio: 'status' → 'state' is 0.73, 'aproval_policy' → 'approval_policy' 0.97.
SUGGESTION_CUTOFF = 0.7


def suggestion(name: str, known: Iterable[str]) -> str | None:
    """The one known name ``name`` is most likely a typo or an abbreviation of, if any."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1, cutoff=SUGGESTION_CUTOFF)
    if close:
        return close[0]
    longer = [candidate for candidate in known if candidate.startswith(f"{name}_")]
    return longer[0] if len(longer) == 1 else None


def unknown_message(name: str, known: Iterable[str], what: str = "field") -> str:
    known = sorted(known)
    close = suggestion(name, known)
    if close:
        return f"unknown {what}; did you mean {close!r}?"
    if not known:
        return f"unknown {what}; none are accepted here"
    return f"unknown {what}; known: {', '.join(known)}"


def unknown_errors(names: Iterable[Any], known: Iterable[str], what: str = "field") -> dict:
    """``{name: [message]}`` for every name not in ``known`` (empty when all are known)."""
    known = set(known)
    return {
        str(name): [unknown_message(str(name), known, what)] for name in names if name not in known
    }


# No docstrings on these classes: drf-spectacular would show them as the description of every
# serializer that has none of its own.


class StrictFieldsMixin:
    # Refuses body keys the serializer does not declare. Read-only fields count as known: a client
    # may send back what it read (``updated_at``); they are ignored, as the schema documents.

    unknown_what = "field"

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            errors = unknown_errors(data, self.fields, self.unknown_what)
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


class StrictSerializer(StrictFieldsMixin, DeclaredFieldsOnceMixin, serializers.Serializer):
    pass


class StrictModelSerializer(StrictFieldsMixin, serializers.ModelSerializer):
    pass


class ReplaceMixin:
    # A PUT body replaces the resource: every writable field must be given (null where the field
    # allows it), so nothing is kept from before by omission.

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        for field in fields.values():
            if not field.read_only:
                field.required = True
                field.default = empty
        return fields


# --- query parameters ----------------------------------------------------------------------------

_declared: dict[tuple[type, str, str], frozenset[str]] = {}


def _filter_names(name: str, widget: forms.Widget) -> list[str]:
    if isinstance(widget, SuffixedMultiWidget):
        return [widget.suffixed(name, suffix) for suffix in widget.suffixes]
    if isinstance(widget, forms.MultiWidget):
        return [f"{name}_{index}" for index in range(len(widget.widgets))]
    return [name]


def filterset_params(view: Any) -> set[str]:
    """The query parameters of the view's django-filter filterset (used by its ``list``)."""
    filterset_class = getattr(view, "filterset_class", None)
    if filterset_class is not None:
        return {
            param
            for name, filter_ in filterset_class.base_filters.items()
            for param in _filter_names(name, filter_.field.widget)
        }
    fields = getattr(view, "filterset_fields", None) or ()
    if isinstance(fields, Mapping):
        return {
            field if lookup == "exact" else f"{field}__{lookup}"
            for field, lookups in fields.items()
            for lookup in lookups
        }
    return set(fields)


def operation_schema(view: Any) -> Any:
    """The drf-spectacular schema of the operation ``view`` is handling (its ``@extend_schema``
    included), or None where the view has none."""
    action = getattr(view, "action", None) or view.request.method.lower()
    handler = getattr(view, action, None)
    schema_class = getattr(handler, "kwargs", {}).get("schema") or type(view.schema)
    schema = schema_class()
    if not hasattr(schema, "get_override_parameters"):  # not a drf-spectacular schema
        return None
    schema.view = view
    schema.method = view.request.method
    return schema


def declared_params(view: Any) -> set[str]:
    """Query parameters the handler documents with ``@extend_schema(parameters=[…])``."""
    schema = operation_schema(view)
    names: set[str] = set()
    for parameter in schema.get_override_parameters() if schema else ():
        if isinstance(parameter, OpenApiParameter):
            if parameter.location == OpenApiParameter.QUERY and not parameter.exclude:
                names.add(parameter.name)
        else:  # a serializer whose fields are query parameters
            instance = parameter() if isinstance(parameter, type) else parameter
            names.update(instance.fields)
    return names


def allowed_query_params(view: Any, always: Iterable[str] = ()) -> frozenset[str]:
    action = getattr(view, "action", None) or ""
    key = (type(view), action, view.request.method)
    if key not in _declared:
        names = declared_params(view) | set(getattr(view, "extra_query_params", ()))
        if action in ("list", ""):
            names |= filterset_params(view)
        _declared[key] = frozenset(names)
    return _declared[key] | frozenset(always)


def refuse_unknown_query_params(request: Any, view: Any, always: Iterable[str] = ()) -> None:
    """A 400 naming each query parameter the operation does not take."""
    errors = unknown_errors(
        request.query_params, allowed_query_params(view, always), "query parameter"
    )
    if errors:
        raise serializers.ValidationError(errors)


# --- bodies of operations that take none ----------------------------------------------------------

_bodyless: dict[tuple[type, str, str], bool] = {}


def takes_no_body(view: Any) -> bool:
    """A DELETE, or a write whose schema documents no request body (``request=None``)."""
    method = view.request.method
    if method in ("GET", "HEAD", "OPTIONS", "DELETE"):
        return True
    key = (type(view), getattr(view, "action", None) or "", method)
    if key not in _bodyless:
        schema = operation_schema(view)
        _bodyless[key] = schema is not None and schema.get_request_serializer() is None
    return _bodyless[key]


def refuse_unexpected_body(request: Any, view: Any) -> None:
    """A 400 naming what was sent to an operation that takes no body (an empty object or no
    body at all is fine). For a view's ``initial()``, after authentication."""
    if not takes_no_body(view):
        return
    data = request.data
    if isinstance(data, Mapping):
        errors = unknown_errors(data, ())
    else:
        errors = {"non_field_errors": ["this operation takes no body"]} if data else {}
    if errors:
        raise serializers.ValidationError(errors)
