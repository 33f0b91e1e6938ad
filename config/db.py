"""Writing many rows at once.

``bulk_create`` spends most of its time in Python: it prepares every value of every row through
the field's ``get_db_prep_save`` and, on PostgreSQL, dumps each column as an array parameter.
For the admission pass (thousands of rows in five tables per transaction) PostgreSQL's ``COPY``
is several times cheaper: rows stream over the connection as they are built, values go through
psycopg's adapters, and the server parses them in bulk.

``copy_insert`` is for plain rows: the model's defaults are already set on the instances (as
Django does when it builds them), ``auto_now``/``auto_now_add`` fields are filled here, and an
auto-incremented primary key is left to the database (the instances do not learn it; callers
that need ids use ``bulk_create``). Other databases take ``bulk_create``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connection, models
from django.utils import timezone

COPY_ABOVE = 20  # below this a multi-row INSERT is as fast and returns ids


def copy_insert(model: type[models.Model], objs: Iterable[models.Model]) -> list[models.Model]:
    objs = list(objs)
    if connection.vendor != "postgresql" or len(objs) <= COPY_ABOVE:
        return model.objects.bulk_create(objs)
    from psycopg.types.json import Jsonb

    fields = [
        field
        for field in model._meta.concrete_fields
        if not (field.primary_key and isinstance(field, models.AutoField | models.BigAutoField))
    ]
    now = timezone.now()
    always = [f.attname for f in fields if getattr(f, "auto_now", False)]
    if_unset = [f.attname for f in fields if getattr(f, "auto_now_add", False)]
    json_columns = {f.attname for f in fields if isinstance(f, models.JSONField)}
    attnames = [field.attname for field in fields]
    columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
    table = connection.ops.quote_name(model._meta.db_table)
    # Django's cursor wraps psycopg's; COPY needs the driver cursor underneath.
    with (
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy,
    ):
        for obj in objs:
            for name in always:
                setattr(obj, name, now)
            for name in if_unset:
                if getattr(obj, name) is None:
                    setattr(obj, name, now)
            row: list[Any] = [getattr(obj, name) for name in attnames]
            if json_columns:
                row = [
                    Jsonb(value) if name in json_columns and value is not None else value
                    for name, value in zip(attnames, row, strict=True)
                ]
            copy.write_row(row)
    for obj in objs:
        obj._state.adding, obj._state.db = False, connection.alias
    return objs
