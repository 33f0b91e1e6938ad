"""Migration 0004 labels the events already stored as hash version 1 and re-anchors nothing, on a
table that holds events, with the append-only trigger armed (its own module: it needs a committed
database and migrates the audit app back and forth)."""

import pytest
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor

from audit.chain import verify_chain
from audit.models import AuditEvent
from tests.audit.old_writer import append_v1_event

BEFORE = ("audit", "0003_append_only_trigger")


def _migrate(targets):
    MigrationExecutor(connection).migrate(targets)


def _latest():
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


@pytest.mark.django_db(transaction=True)
def test_migration_labels_stored_events_version_1():
    with connection.cursor() as cursor:  # arm the trigger the test runner disarms (tests/settings)
        cursor.execute("SET manta.audit_maintenance = 'off'")
    try:
        _migrate([BEFORE])
        old_apps = MigrationExecutor(connection).loader.project_state(BEFORE).apps
        for i in range(3):
            append_v1_event(
                old_apps.get_model("audit", "AuditEvent"),
                old_apps.get_model("audit", "AuditChainHead"),
                chain="global",
                changes={"name": [f"Old {i}", f"Old {i + 1}"], "limit": 2.5},
            )
        _migrate(_latest())
        with pytest.raises(DatabaseError, match="append-only"), connection.cursor() as cursor:
            cursor.execute("UPDATE audit_auditevent SET action = 'org.hacked'")  # still armed
    finally:
        _migrate(_latest())  # no-op when done
        with connection.cursor() as cursor:
            cursor.execute("SET manta.audit_maintenance = 'on'")

    assert list(AuditEvent.objects.values_list("hash_version", flat=True)) == [1, 1, 1]
    result = verify_chain("global")
    assert result.ok and result.checked == 3
