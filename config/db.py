"""Writing many rows at once.

``bulk_create`` spends most of its time in Python: it prepares every value of every row through
the field's ``get_db_prep_save`` and, on PostgreSQL, dumps each column as an array parameter.
For the admission pass (thousands of rows in five tables per transaction) PostgreSQL's ``COPY``
is several times cheaper: rows stream over the connection as they are built, values go through
psycopg's adapters, and the server parses them in bulk.

``insert_rows`` writes a few rows in one ``INSERT … RETURNING`` whose SQL is kept per
connection: a submission's job, timeline entry and outbox events, and every small batch of
``copy_insert``.

``one_statement`` sends the writes of a block (``insert_rows``, the audit append) to the server
together, as one statement: a submission's four writes cost one round trip and one statement's
overhead in PostgreSQL instead of four.

``copy_insert`` is for plain rows: the model's defaults are already set on the instances (as
Django does when it builds them), ``auto_now``/``auto_now_add`` fields are filled here, and an
auto-incremented primary key is left to the database (the instances do not learn it; callers
that need ids use ``bulk_create``). Other databases take ``bulk_create``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.db import connection, models
from django.db.models.expressions import DatabaseDefault
from django.utils import timezone

COPY_ABOVE = 20  # below this a multi-row INSERT is as fast and returns ids


def _keep_parsed_statements() -> None:
    """psycopg finds a statement's placeholders once per text and keeps what it found, but only
    for texts of at most 4,096 characters and 50 parameters; a submission's one statement (the
    job alone has 32 columns) is longer, and was parsed again on every request (~0.5 ms of
    CPU). Its limits are module constants, read on every call: raise them. Our statements
    come from a few fixed shapes, and the cache keeps the 128 most recent."""
    from psycopg import _queries

    if hasattr(_queries, "MAX_CACHED_STATEMENT_LENGTH"):
        _queries.MAX_CACHED_STATEMENT_LENGTH = max(_queries.MAX_CACHED_STATEMENT_LENGTH, 16_384)
        _queries.MAX_CACHED_STATEMENT_PARAMS = max(_queries.MAX_CACHED_STATEMENT_PARAMS, 200)


_keep_parsed_statements()


def insert_rows(model: type[models.Model], objs: list[models.Model]) -> list[models.Model]:
    """A few plain rows in one ``INSERT … RETURNING`` their ids: what ``bulk_create`` makes of
    them (each value through its field's ``pre_save`` and ``get_db_prep_save``, the ids set,
    the instances saved), without building and compiling the statement on every call — most of
    what ``bulk_create`` costs for one row. The SQL is kept per model, row count and whether the
    caller chose the ids (every row, or none) on the connection. Rows it does not handle as
    ``bulk_create`` would (some ids chosen and some not, a primary key left unset that the
    database does not make, an expression or a database default as a value, a field with a
    placeholder of its own, a child table, another database) go through ``bulk_create``.
    Inside :func:`one_statement` the insert waits for the block's other writes, and the
    instances learn the ids the database makes when it is sent."""
    auto = _has_auto_pk(model)
    given = bool(objs) and auto and all(obj.pk is not None for obj in objs)
    fields = _insert_fields(model, given) if objs and connection.vendor == "postgresql" else None
    if fields is None or (not given and any((obj.pk is None) != auto for obj in objs)):
        return model.objects.bulk_create(objs)
    params: list[Any] = []
    for obj in objs:
        obj._prepare_related_fields_for_save(operation_name="bulk_create")
        for field in fields:
            value = field.pre_save(obj, True)
            if hasattr(value, "resolve_expression") or isinstance(value, DatabaseDefault):
                return model.objects.bulk_create(objs)
            params.append(field.get_db_prep_save(value, connection))

    def learn(ids: list) -> None:
        for obj, pk_value in zip(objs, ids, strict=True):
            obj.pk = pk_value

    sql = _insert_sql(model, fields, len(objs), given)
    pk_column = connection.ops.quote_name(model._meta.pk.column)
    if not defer(sql, params, f"array_agg({pk_column})", learn):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            learn([row[0] for row in cursor.fetchall()])
    for obj in objs:
        obj._state.adding, obj._state.db = False, connection.alias
    return objs


def _insert_fields(model: type[models.Model], given: bool = False) -> list[models.Field] | None:
    """The columns :func:`insert_rows` writes (all but an auto-incremented id, unless the
    caller ``given`` it), or None when one of them needs what only Django's insert compiler
    does (a placeholder of its own)."""
    if model._meta.parents:
        return None  # a child table's row is two INSERTs
    fields = _written_fields(model, given)
    if any(hasattr(field, "get_placeholder") for field in fields):
        return None
    return fields


def _has_auto_pk(model: type[models.Model]) -> bool:
    return isinstance(model._meta.pk, models.AutoField | models.BigAutoField)


def _written_fields(model: type[models.Model], given: bool = False) -> list[models.Field]:
    """The columns an insert writes: every concrete field but an auto-incremented id, which
    the database makes (unless ids are ``given``)."""
    auto = _has_auto_pk(model) and not given
    return [field for field in model._meta.concrete_fields if not (auto and field.primary_key)]


def _insert_sql(
    model: type[models.Model], fields: list[models.Field], rows: int, given: bool
) -> str:
    cache = connection.__dict__.setdefault("_manta_insert_sql", {})
    key = (model, rows, given)  # given: with the id's column
    sql = cache.get(key)
    if sql is None:
        quote = connection.ops.quote_name
        columns = ", ".join(quote(field.column) for field in fields)
        row = "(" + ", ".join(["%s"] * len(fields)) + ")"
        sql = cache[key] = (
            f"INSERT INTO {quote(model._meta.db_table)} ({columns}) "
            f"VALUES {', '.join([row] * rows)} RETURNING {quote(model._meta.pk.column)}"
        )
    return sql


# A write waiting in a one_statement block: its SQL (an INSERT … RETURNING, a SELECT from a
# function), its parameters, an aggregate over what it returns (``array_agg(id)``) and what to
# do with that aggregate's value once the statement has run.
_Waiting = tuple[str, list, str, Callable[[Any], None]]


@contextlib.contextmanager
def one_statement() -> Iterator[None]:
    """Send the block's waiting writes (:func:`insert_rows`, ``audit.record_many``) as one
    statement of data-modifying CTEs — ``WITH w0 AS (INSERT …), w1 AS (SELECT audit_append(…))
    SELECT (SELECT array_agg(id) FROM w0), …`` — when the block ends, or as soon as the block
    runs any other statement (a read, a COPY), so that statement sees them. Use it inside a
    transaction: an error in the writes is raised when they are sent, at the latest at the end
    of the block. The CTEs run in one snapshot, so no write in a block may read what another
    writes; the rows' foreign keys are checked once they are all written (at the end of the
    statement, or at the commit for Django's deferred ones), so they may point at each other.
    A block inside a block joins it; elsewhere than PostgreSQL, nothing waits."""
    if connection.vendor != "postgresql" or _waiting() is not None:
        yield
        return
    connection._manta_waiting = []
    try:
        with connection.execute_wrapper(_send_first):
            yield
            send_waiting()
    finally:
        connection._manta_waiting = None


def _waiting() -> list[_Waiting] | None:
    return getattr(connection, "_manta_waiting", None)


def defer(sql: str, params: list, aggregate: str, learn: Callable[[Any], None]) -> bool:
    """Keep a write for the open :func:`one_statement` block; False when none is open (the
    caller runs it)."""
    waiting = _waiting()
    if waiting is None:
        return False
    waiting.append((sql, params, aggregate, learn))
    return True


def send_waiting() -> None:
    """Run the writes waiting in the open block now, as one statement."""
    waiting = _waiting()
    if not waiting:
        return
    writes = waiting[:]
    waiting.clear()
    ctes = ", ".join(f"w{n} AS ({sql})" for n, (sql, *_) in enumerate(writes))
    columns = ", ".join(f"(SELECT {agg} FROM w{n})" for n, (_, _, agg, _) in enumerate(writes))
    params = [value for _, values, _, _ in writes for value in values]
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {ctes} SELECT {columns}", params)
        values = cursor.fetchone()
    for (*_, learn), value in zip(writes, values, strict=True):
        learn(value)


def _send_first(execute, sql, params, many, context):
    send_waiting()  # empties the list first: its own statement passes straight through
    return execute(sql, params, many, context)


def copy_insert(model: type[models.Model], objs: Iterable[models.Model]) -> list[models.Model]:
    objs = list(objs)
    if connection.vendor != "postgresql" or len(objs) <= COPY_ABOVE:
        return insert_rows(model, objs)
    from psycopg.types.json import Jsonb

    send_waiting()  # COPY goes past Django's cursor: what waits is written first
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
