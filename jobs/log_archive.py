"""Manta's copy of a driver log, kept on its attempt (``log_archive`` and ``log_start``): written
while the attempt runs (every MANTA_LOG_SAVE_SECONDS) and once more at its end, and what logs/
answers with once the cluster is gone or silent.

It keeps the log's last MANTA_LOG_ARCHIVE_BYTES, and no more than that is ever read from the
cluster for it. Offsets count the bytes the driver wrote (see ``launchers.cluster_text``, which
also makes the text fit for the database): ``log_start`` is how many bytes came before the
kept text. When some did, the stored text begins with a marker line that says so, e.g.
``[manta: the first 123456789 bytes of this log were dropped; the archive keeps the last
2097152]``; the marker is not part of the log and takes no offset.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.db.models import (
    BigIntegerField,
    Case,
    ExpressionWrapper,
    F,
    Func,
    Q,
    Value,
    When,
)
from django.db.models.functions import Length, Replace, StrIndex
from django.utils import timezone

from .launchers import cluster_text
from .launchers.base import LogPart
from .models import JobAttempt

_MARKER_START = "[manta: the first "


def marker(dropped: int, kept: int) -> str:
    """The line that starts an archive whose log's first ``dropped`` bytes are not kept."""
    return (
        f"{_MARKER_START}{dropped} bytes of this log were dropped; "
        f"the archive keeps the last {kept}]\n"
    )


def log_archive_save(attempt_id, part: LogPart) -> bool:
    """Store the end of the log (``part``, read with ``limit=MANTA_LOG_ARCHIVE_BYTES``) as the
    attempt's copy, unless the stored copy reaches further: what a follower has read stays
    readable. True when stored."""
    text = cluster_text.clean(part.text)
    kept = cluster_text.width(text)
    if kept > settings.MANTA_LOG_ARCHIVE_BYTES:
        text = cluster_text.skip(text, kept - settings.MANTA_LOG_ARCHIVE_BYTES)
        kept = cluster_text.width(text)
    start = max(0, part.end - kept)
    stored = (marker(start, kept) if start else "") + text
    # On its own savepoint: a refused write must not spoil the caller's transaction.
    with transaction.atomic():
        saved = (
            JobAttempt.objects.filter(pk=attempt_id)
            .alias(stored_end=_stored_end())
            .filter(stored_end__lte=part.end)
            .update(log_archive=stored, log_start=start, log_saved_at=timezone.now())
        )
    return bool(saved)


def log_archived(attempt: JobAttempt) -> tuple[LogPart, str]:
    """The attempt's copy as a part of the log, and its marker line ("" when it starts at the
    log's start)."""
    text, start, head = attempt.log_archive, attempt.log_start, ""
    if start and text.startswith(_MARKER_START):
        head, _, text = text.partition("\n")
        head += "\n"
    return LogPart(text=text, start=start, end=start + cluster_text.width(text)), head


class _Octets(Func):
    """The bytes a text column takes in UTF-8."""

    function = "OCTET_LENGTH"
    output_field = BigIntegerField()

    def as_sqlite(self, compiler, connection, **extra_context):
        template = "LENGTH(CAST(%(expressions)s AS BLOB))"
        return self.as_sql(compiler, connection, template=template, **extra_context)


def _stored_end():
    """Where the stored copy ends in the whole log (log_archived()'s ``end``), in SQL: its
    bytes less two for each U+FFFD (which stands for one byte), less the marker line."""
    text = F("log_archive")
    replacements = Length(text) - Length(Replace(text, Value(cluster_text.REPLACEMENT), Value("")))
    head = Case(
        When(
            Q(log_start__gt=0, log_archive__startswith=_MARKER_START),
            then=StrIndex(text, Value("\n")),
        ),
        default=Value(0),
    )
    return ExpressionWrapper(
        F("log_start") + _Octets(text) - 2 * replacements - head,
        output_field=BigIntegerField(),
    )
