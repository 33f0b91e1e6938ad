"""Reads whose SQL is compiled once per database connection, not once per request.

Turning a queryset into SQL is most of what a small read costs in Python: the workspace a job
submission reads (five models joined, a ``FilteredRelation``) costs ~1.4 ms of CPU to build and
compile and ~0.25 ms to run and ~0.4 ms to turn into instances; the token, membership and
permission reads every request makes, ~0.4 ms each to compile. A :class:`PreparedRead` builds
its queryset once per connection with stand-in values, keeps Django's compiler, and from then on
runs that SQL with the caller's values in the stand-ins' places. The rows become what the
queryset would have returned — model instances with their ``select_related`` rows and
annotations, through Django's own converters and populators (as ``ModelIterable`` does), or the
first column of a flat ``values_list``.

The rules that keep it the same read as the queryset's:

- Everything that varies is a parameter of ``build``: a value read from the database inside it
  (a content type's id, say) would be kept for the connection's lifetime.
- Each parameter is declared ``int`` or ``str``, and a stand-in must reach the compiled SQL's
  parameters unchanged (a plain comparison on a column of that kind); a lookup that rewrites
  its value (``startswith``, an ``in`` list) is refused when the read is first compiled.
- A value the SQL could not stand for as the queryset would — ``None`` (``IS NULL``), a bool, an
  int outside PostgreSQL's ``bigint`` — is read through the queryset itself, as before.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.query import FlatValuesListIterable, ModelIterable, get_related_populators

KINDS = (int, str)
BIGINT = 2**63
# Stand-ins: in the int4 range (Django turns a comparison with an out-of-range int into an empty
# result without SQL), odd enough that no query of ours holds one as a literal.
_INT_STANDIN = 2_071_830_941
_STR_STANDIN = "\x1fprepared-read-{}\x1f"


class PreparedRead:
    """``build(*values)`` -> the queryset, compiled once per connection; ``rows(*values)`` runs
    it. ``kinds`` gives each value's type (``int`` or ``str``)."""

    def __init__(self, build: Callable[..., QuerySet], *kinds: type):
        if any(kind not in KINDS for kind in kinds):
            raise TypeError(f"a prepared read takes int or str values, not {kinds}")
        self.build, self.kinds = build, kinds
        self._key = object()  # this read's entry in each connection's compiled reads

    def rows(self, *values: Any, using: str = "default") -> list:
        if not self._preparable(values):
            return list(self.build(*values).using(using))
        compiled = self._compiled(using)
        params = list(compiled.params)
        for position, index in compiled.slots:
            params[position] = values[index]
        connection = connections[using]
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            fetched = cursor.fetchall()
        return compiled.instances(fetched, connection.alias)

    def first(self, *values: Any, using: str = "default") -> Any:
        """The first row (build's queryset should hold at most one, or be sliced and ordered),
        or None."""
        found = self.rows(*values, using=using)
        return found[0] if found else None

    def _preparable(self, values: tuple) -> bool:
        if len(values) != len(self.kinds):
            raise TypeError(f"this read takes {len(self.kinds)} values, not {len(values)}")
        for value, kind in zip(values, self.kinds, strict=True):
            if type(value) is not kind:  # None, a bool, a str subclass: the queryset decides
                return False
            if kind is int and not -BIGINT <= value < BIGINT:
                return False
        return True

    def _compiled(self, using: str) -> _Compiled:
        connection = connections[using]
        reads = connection.__dict__.setdefault("_manta_prepared_reads", {})
        compiled = reads.get(self._key)
        if compiled is None:
            compiled = reads[self._key] = _Compiled.of(self, using)
        return compiled


class _Compiled:
    """One read's SQL on one connection, where its values go, and how rows become results."""

    def __init__(self, queryset: QuerySet, stand_ins: list, using: str):
        queryset = queryset.using(using)
        if queryset._iterable_class not in (ModelIterable, FlatValuesListIterable):
            raise ValueError("a prepared read returns model instances or one flat column")
        if queryset._prefetch_related_lookups or queryset._known_related_objects:
            raise ValueError("a prepared read does not prefetch")
        self.compiler = queryset.query.get_compiler(using=using)
        self.sql, params = self.compiler.as_sql()
        if self.compiler.has_extra_select:
            raise ValueError("a prepared read has no extra() columns")
        self.params = tuple(params)
        self.slots = []
        for index, stand_in in enumerate(stand_ins):
            found = [
                position
                for position, param in enumerate(self.params)
                if type(param) is type(stand_in) and param == stand_in
            ]
            if not found:
                raise ValueError(
                    f"value {index} does not reach the SQL as given (a lookup that rewrites "
                    "it, or a column of another kind): read it through the queryset"
                )
            self.slots += [(position, index) for position in found]
        self.flat = queryset._iterable_class is FlatValuesListIterable
        # What results_iter() works out on every call, once: each column's converters.
        columns = [column[0] for column in self.compiler.select[0 : self.compiler.col_count]]
        if self.compiler.has_composite_fields(columns):
            raise ValueError("a prepared read has no composite fields")
        self.converters = self.compiler.get_converters(columns)
        if not self.flat:
            info, select = self.compiler.klass_info, self.compiler.select
            self.model = info["model"]
            fields = info["select_fields"]
            self.span = (fields[0], fields[-1] + 1)
            self.init_list = [column[0].target.attname for column in select[slice(*self.span)]]
            self.populators = get_related_populators(info, select, using)
            self.annotations = self.compiler.annotation_col_map or {}

    @classmethod
    def of(cls, read: PreparedRead, using: str) -> _Compiled:
        count = itertools.count()
        stand_ins = [
            _INT_STANDIN + next(count) if kind is int else _STR_STANDIN.format(next(count))
            for kind in read.kinds
        ]
        return cls(read.build(*stand_ins), stand_ins, using)

    def instances(self, fetched: list, alias: str) -> list:
        rows = (
            self.compiler.apply_converters(fetched, self.converters) if self.converters else fetched
        )
        if self.flat:
            return [row[0] for row in rows]
        found: list[Model] = []
        start, end = self.span
        for row in rows:
            obj = self.model.from_db(alias, self.init_list, row[start:end])
            for populator in self.populators:
                populator.populate(row, obj)
            for name, position in self.annotations.items():
                setattr(obj, name, row[position])
            found.append(obj)
        return found
