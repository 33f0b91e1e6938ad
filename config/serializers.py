"""Serializer helpers shared by the apps' API modules."""

from __future__ import annotations

import copy
from typing import Any

from rest_framework import serializers

_BUILT: dict[type, dict[str, serializers.Field]] = {}


class FieldsBuiltOnceMixin:
    """A ModelSerializer whose fields are worked out from its model once per process.

    DRF's ``ModelSerializer.get_fields()`` inspects the model and ``Meta`` again for every
    instance (field classes, labels, validators, …): most of what rendering one object costs.
    What it builds depends on the class alone, so the first instance keeps the result and every
    later one gets a deep copy of it, fresh unbound fields as DRF's own declared fields are."""

    def get_fields(self) -> dict[str, Any]:
        cls = type(self)
        if cls not in _BUILT:
            _BUILT[cls] = super().get_fields()  # type: ignore[misc]
        built = _BUILT[cls]
        return copy.deepcopy(built)
