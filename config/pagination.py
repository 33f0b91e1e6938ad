"""Pages of a list: by number (``?page=N``), and on the long lists also by cursor
(``?cursor=…``).

A page number costs a count of the whole list and an OFFSET that the database walks: page 2,000
of a 100,000-row list reads 100,000 rows to show 50. A cursor names the last row seen (its sort
key) and the next page starts right after it through the list's index, so any depth costs what
the first page costs, and rows added meanwhile neither repeat nor go missing. Both orders are the
same: the list's own, which always ends with the unique id.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import functools
import json
import operator
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Model, Q, QuerySet
from rest_framework import serializers
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param

from config import strict


class StablePageNumberPagination(PageNumberPagination):
    """Page numbers over a queryset that views always order by a unique key, so pages are stable.

    Every list goes through here, so this is where a list refuses query parameters it does not
    take (a misspelt filter would otherwise return everything): see :mod:`config.strict`."""

    page_size_query_param = "page_size"
    max_page_size = 200
    extra_query_params: tuple[str, ...] = ()

    def paginate_queryset(self, queryset, request, view=None):
        if view is not None:
            always = (self.page_query_param, self.page_size_query_param, *self.extra_query_params)
            strict.refuse_unknown_query_params(request, view, always=always)
        return super().paginate_queryset(queryset, request, view)


def _invalid(message: str) -> serializers.ValidationError:
    return serializers.ValidationError({CursorPagination.cursor_query_param: [message]})


class CursorPagination(StablePageNumberPagination):
    """Page numbers as :class:`StablePageNumberPagination` gives them (unchanged, plus a
    ``next_cursor`` link), or, with ``?cursor=`` (empty: from the top), keyset pages: the rows
    after (or before) the row the cursor names, in the list's order, with ``next`` and
    ``previous`` cursor links and no count."""

    cursor_query_param = "cursor"
    extra_query_params = (cursor_query_param,)

    cursor_mode = False
    next_cursor: str | None = None

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        self.cursor_mode = self.cursor_query_param in request.query_params
        if not self.cursor_mode:
            page = super().paginate_queryset(queryset, request, view)
            if page is not None and self.page.has_next():
                url = remove_query_param(request.build_absolute_uri(), self.page_query_param)
                self.next_cursor = self.cursor_link(url, self.ordering_of(queryset), page[-1], "a")
            return page
        if self.page_query_param in request.query_params:
            raise _invalid(f"cannot be combined with {self.page_query_param}")
        if view is not None:
            always = (self.page_size_query_param, self.cursor_query_param)
            strict.refuse_unknown_query_params(request, view, always=always)
        return self._keyset_page(queryset, request)

    # --- the order -------------------------------------------------------------------------

    @staticmethod
    def ordering_of(queryset: QuerySet) -> tuple[str, ...]:
        """The list's order, which must end with its unique id (so a cursor names one row)."""
        order = tuple(queryset.query.order_by or queryset.model._meta.ordering)
        if not order or order[-1].lstrip("-") != "id":
            raise ImproperlyConfigured(f"cursor pages need an order ending in the id: {order}")
        return order

    # --- cursors ---------------------------------------------------------------------------

    def cursor_link(self, base_url: str, order: Sequence[str], row: Model, way: str) -> str:
        """A link to the rows after (``way`` "a") or before ("b") ``row``."""
        values = [_plain(getattr(row, name.lstrip("-"))) for name in order]
        token = json.dumps({way: values}, separators=(",", ":")).encode()
        encoded = base64.urlsafe_b64encode(token).decode().rstrip("=")
        return replace_query_param(base_url, self.cursor_query_param, encoded)

    def decode(self, raw: str, queryset: QuerySet, order: Sequence[str]) -> tuple[str, list]:
        """(way, key values) of a cursor this list gave out; a 400 naming the parameter for
        anything else."""
        rule = "not a cursor this list gave out: follow a next or previous link, or send it empty"
        try:
            decoded = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
            ((way, values),) = decoded.items()
            if way not in ("a", "b") or not isinstance(values, list):
                raise ValueError(way)
            if len(values) != len(order):
                raise ValueError(values)
            fields = [queryset.model._meta.get_field(name.lstrip("-")) for name in order]
            key = [field.to_python(value) for field, value in zip(fields, values, strict=True)]
        except (ValueError, TypeError, binascii.Error, DjangoValidationError, AttributeError):
            raise _invalid(rule) from None
        if any(value is None for value in key):
            raise _invalid(rule)
        return way, key

    def _keyset_page(self, queryset: QuerySet, request) -> list:
        order = self.ordering_of(queryset)
        size = self.get_page_size(request)
        raw = request.query_params[self.cursor_query_param]
        way, key = self.decode(raw, queryset, order) if raw else ("a", None)
        backwards = way == "b"
        walk = [_flip(name) for name in order] if backwards else list(order)
        rows = queryset.order_by(*walk)
        if key is not None:
            rows = rows.filter(_after(walk, key))
        fetched = list(rows[: size + 1])
        page, more = fetched[:size], len(fetched) > size
        if backwards:
            page.reverse()
        base = request.build_absolute_uri()
        has_next, has_previous = (True, more) if backwards else (more, key is not None)
        self.links = {
            "next": self.cursor_link(base, order, page[-1], "a") if page and has_next else None,
            "previous": self.cursor_link(base, order, page[0], "b")
            if page and has_previous
            else None,
        }
        return page

    # --- the answer ------------------------------------------------------------------------

    def get_paginated_response(self, data):
        if self.cursor_mode:
            return Response({**self.links, "results": data})
        return Response(
            {
                "count": self.page.paginator.count,
                "next": self.get_next_link(),
                "previous": self.get_previous_link(),
                "next_cursor": self.next_cursor,
                "results": data,
            }
        )

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        link = {"type": "string", "nullable": True, "format": "uri"}
        return {
            "type": "object",
            "required": ["next", "previous", "results"],
            "properties": {
                "count": {
                    "type": "integer",
                    "example": 123,
                    "description": "Rows in the whole list (page numbers only: a cursor page "
                    "does not count them)",
                },
                "next": {
                    **link,
                    "description": "The next page: a page number, or a cursor",
                    "example": "https://manta.example/api/v1/…/?page=3",
                },
                "previous": {
                    **link,
                    "description": "The previous page, likewise",
                    "example": "https://manta.example/api/v1/…/?page=1",
                },
                "next_cursor": {
                    **link,
                    "example": "https://manta.example/api/v1/…/?cursor=eyJhIjpbNDJdfQ",
                    "description": "Page numbers only: the rows after this page as a cursor "
                    "link, to go on from here at the cost of a first page however deep",
                },
                "results": schema,
            },
        }

    def get_schema_operation_parameters(self, view) -> list[dict[str, Any]]:
        return [
            *super().get_schema_operation_parameters(view),
            {
                "name": self.cursor_query_param,
                "required": False,
                "in": "query",
                "description": "Keyset pages instead of page numbers: empty for the first "
                "page, then the value in a next, previous or next_cursor link. Each page "
                "costs the same at any depth, and rows added meanwhile neither repeat nor go "
                "missing; there is no count. Not with page.",
                "schema": {"type": "string"},
            },
        ]


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.datetime | dt.date) else value


def _flip(name: str) -> str:
    return name[1:] if name.startswith("-") else f"-{name}"


def _after(order: Sequence[str], key: Sequence[Any]) -> Q:
    """The rows that come after ``key`` in ``order``: lexicographically, field by field."""
    steps = []
    for index, name in enumerate(order):
        field = name.lstrip("-")
        step = Q(**{f"{field}__{'lt' if name.startswith('-') else 'gt'}": key[index]})
        for earlier, value in zip(order[:index], key[:index], strict=True):
            step &= Q(**{earlier.lstrip("-"): value})
        steps.append(step)
    return functools.reduce(operator.or_, steps)
