"""Writing many rows at once.

``bulk_create`` spends most of its time in Python: it prepares every value of every row through
the field's ``get_db_prep_save`` and, on PostgreSQL, dumps each column as an array parameter.
For the admission pass (thousands of rows in five tables per transaction) PostgreSQL's ``COPY``
is several times cheaper: rows stream over the connection as they are built, values go through
psycopg's adapters, and the server parses them in bulk.

``insert_rows`` writes a few rows in one ``INSERT … RETURNING`` whose SQL is kept per
connection: a submission's job, timeline entry and outbox events, and every small batch of
``copy_insert``.

``copy_insert`` is for plain rows: the model's defaults are already set on the instances (as
Django does when it builds them), ``auto_now``/``auto_now_add`` fields are filled here, and an
auto-incremented primary key is left to the database (the instances do not learn it; callers
that need ids use ``bulk_create``). Other databases take ``bulk_create``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connection, models
from django.db.models.expressions import DatabaseDefault
from django.utils import timezone

COPY_ABOVE = 20  # below this a multi-row INSERT is as fast and returns ids


def insert_rows(model: type[models.Model], objs: list[models.Model]) -> list[models.Model]:
    """A few plain rows in one ``INSERT … RETURNING`` their ids: what ``bulk_create`` makes of
    them (each value through its field's ``pre_save`` and ``get_db_prep_save``, the ids set,
    the instances saved), without building and compiling the statement on every call — most of
    what ``bulk_create`` costs for one row. The SQL is kept per model and row count on the
    connection. Rows it does not handle as ``bulk_create`` would (an auto-incremented id
    already set, a primary key left unset that the database does not make, an expression or a
    database default as a value, a field with a placeholder of its own, a child table, another
    database) go through ``bulk_create``."""
    fields = _insert_fields(model) if objs and connection.vendor == "postgresql" else None
    auto = _has_auto_pk(model)
    if fields is None or any((obj.pk is None) != auto for obj in objs):
        return model.objects.bulk_create(objs)
    params: list[Any] = []
    for obj in objs:
        obj._prepare_related_fields_for_save(operation_name="bulk_create")
        for field in fields:
            value = field.pre_save(obj, True)
            if hasattr(value, "resolve_expression") or isinstance(value, DatabaseDefault):
                return model.objects.bulk_create(objs)
            params.append(field.get_db_prep_save(value, connection))
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql(model, fields, len(objs)), params)
        ids = cursor.fetchall()
    for obj, (pk_value,) in zip(objs, ids, strict=True):
        obj.pk = pk_value
        obj._state.adding, obj._state.db = False, connection.alias
    return objs


def _insert_fields(model: type[models.Model]) -> list[models.Field] | None:
    """The columns :func:`insert_rows` writes (all but an auto-incremented id), or None when
    one of them needs what only Django's insert compiler does (a placeholder of its own)."""
    if model._meta.parents:
        return None  # a child table's row is two INSERTs
    fields = _written_fields(model)
    if any(hasattr(field, "get_placeholder") for field in fields):
        return None
    return fields


def _has_auto_pk(model: type[models.Model]) -> bool:
    return isinstance(model._meta.pk, models.AutoField | models.BigAutoField)


def _written_fields(model: type[models.Model]) -> list[models.Field]:
    """The columns an insert writes: every concrete field but an auto-incremented id, which
    the database makes."""
    auto = _has_auto_pk(model)
    return [field for field in model._meta.concrete_fields if not (auto and field.primary_key)]


def _insert_sql(model: type[models.Model], fields: list[models.Field], rows: int) -> str:
    cache = connection.__dict__.setdefault("_manta_insert_sql", {})
    sql = cache.get((model, rows))
    if sql is None:
        quote = connection.ops.quote_name
        columns = ", ".join(quote(field.column) for field in fields)
        row = "(" + ", ".join(["%s"] * len(fields)) + ")"
        sql = cache[(model, rows)] = (
            f"INSERT INTO {quote(model._meta.db_table)} ({columns}) "
            f"VALUES {', '.join([row] * rows)} RETURNING {quote(model._meta.pk.column)}"
        )
    return sql


def copy_insert(model: type[models.Model], objs: Iterable[models.Model]) -> list[models.Model]:
    objs = list(objs)
    if connection.vendor != "postgresql" or len(objs) <= COPY_ABOVE:
        return insert_rows(model, objs)
    from psycopg.types.json import Jsonb

    fields = _written_fields(model)
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
