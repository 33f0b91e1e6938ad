"""Serializer helpers shared by the apps' API modules."""

from __future__ import annotations

import copy
from typing import Any

from rest_framework import serializers

_BUILT: dict[type, dict[str, serializers.Field]] = {}
_DECLARED: dict[type, dict[str, serializers.Field]] = {}

# Where a field keeps a field of its own, bound to it: a list or dict field's child, a
# ``many=True`` serializer's child, a many-to-many relation's child relation.
_INNER = ("child", "child_relation")


def clone(field: serializers.Field) -> serializers.Field:
    """A fresh unbound copy of an unbound field, as DRF's deep copy makes but without running
    ``__init__`` again (most of what building a serializer's fields costs).

    Its attributes are copied one level deep: what ``__init__`` built from the arguments
    (validators, error messages, choices, a queryset that DRF reads through ``.all()``) is
    shared, as DRF's own copy shares validators; a mutable default is copied; a field it binds
    to itself (``child``) is cloned and bound to the copy. A nested serializer's copy builds its
    own fields when first read. A field class with a ``__deepcopy__`` of its own gets that."""
    cls = type(field)
    if cls.__deepcopy__ is not serializers.Field.__deepcopy__:
        return copy.deepcopy(field)
    state = field.__dict__.copy()
    state.pop("fields", None)
    if state.get("parent") is not None:  # a container's child: unbound, as ``__init__`` left it
        name = state["field_name"]  # what bind() filled in from the name, it will again
        if state.get("source") == name:
            state["source"] = None
        if state.get("label") == name.replace("_", " ").capitalize():
            state["label"] = None
        state["field_name"] = state["parent"] = None
        state.pop("source_attrs", None)
    for name in ("default", "initial"):
        if isinstance(state.get(name), (list, dict, set)):
            state[name] = copy.deepcopy(state[name])
    new = object.__new__(cls)
    new.__dict__.update(state)
    for name in _INNER:
        inner = state.get(name)
        if isinstance(inner, serializers.Field):
            inner = clone(inner)
            setattr(new, name, inner)
            inner.bind(field_name="", parent=new)
    return new


def _cloned(fields: dict[str, serializers.Field]) -> dict[str, serializers.Field]:
    return {name: clone(field) for name, field in fields.items()}


class DeclaredFieldsOnceMixin:
    """A serializer whose declared fields are copied from one unbound set kept per class, by
    :func:`clone`, instead of DRF's deep copy of each (which builds every field, and every
    field of a nested serializer, again for each instance)."""

    def get_fields(self) -> dict[str, Any]:
        cls = type(self)
        declared = _DECLARED.get(cls)
        if declared is None:
            declared = _DECLARED[cls] = copy.deepcopy(self._declared_fields)  # type: ignore[attr-defined]
        return _cloned(declared)


class FieldsBuiltOnceMixin:
    """A ModelSerializer whose fields are worked out from its model once per process.

    DRF's ``ModelSerializer.get_fields()`` inspects the model and ``Meta`` again for every
    instance (field classes, labels, validators, …): most of what rendering one object costs.
    What it builds depends on the class alone, so the first instance keeps the result and every
    later one gets a copy of it (:func:`clone`), fresh unbound fields as DRF's own declared
    fields are."""

    def get_fields(self) -> dict[str, Any]:
        cls = type(self)
        if cls not in _BUILT:
            _BUILT[cls] = super().get_fields()  # type: ignore[misc]
        return _cloned(_BUILT[cls])
